import { describe, expect, it } from 'vitest';
import { createRoutingPolicy } from '../../src/router/index.ts';
import { leastLoaded } from '../../src/router/policies/least-loaded.ts';
import type { BackendView } from '../../src/router/types.ts';

const req = { reqId: 'r', promptTokensEst: 10 };
const view = (name: string, inflight: number, weight = 1): BackendView => ({ name, inflight, weight });

describe('round_robin', () => {
  it('cycles through backends and ranks every backend once', () => {
    const rr = createRoutingPolicy('round_robin');
    const backends = [view('a', 0), view('b', 0), view('c', 0)];
    const firsts = Array.from({ length: 6 }, () => rr.rank(req, backends)[0]!.backend);
    expect(firsts).toEqual(['a', 'b', 'c', 'a', 'b', 'c']);
    const ranked = rr.rank(req, backends).map((c) => c.backend);
    expect([...ranked].sort()).toEqual(['a', 'b', 'c']);
  });

  it('gives a backend of weight 2 twice the first picks', () => {
    const rr = createRoutingPolicy('round_robin');
    const backends = [view('a', 0, 2), view('b', 0, 1)];
    const counts: Record<string, number> = { a: 0, b: 0 };
    for (let i = 0; i < 300; i++) counts[rr.rank(req, backends)[0]!.backend]! += 1;
    expect(counts.a).toBe(200);
    expect(counts.b).toBe(100);
  });

  it('returns nothing for no backends', () => {
    expect(createRoutingPolicy('round_robin').rank(req, [])).toEqual([]);
  });
});

describe('least_loaded', () => {
  it('ranks by in-flight per weight', () => {
    const ll = createRoutingPolicy('least_loaded');
    const ranked = ll.rank(req, [view('a', 5), view('b', 1), view('c', 3), view('d', 2, 4)]);
    expect(ranked.map((c) => c.backend)).toEqual(['d', 'b', 'c', 'a']);
  });

  it('breaks ties at random instead of herding onto the first backend', () => {
    const ll = leastLoaded();
    const backends = [view('a', 2), view('b', 2), view('c', 2)];
    const firsts = new Set<string>();
    for (let i = 0; i < 200; i++) firsts.add(ll.rank(req, backends)[0]!.backend);
    expect(firsts).toEqual(new Set(['a', 'b', 'c']));
  });
});

describe('createRoutingPolicy', () => {
  it('rejects an unknown policy with the list of available ones', () => {
    expect(() => createRoutingPolicy('nope')).toThrow(/round_robin, least_loaded/);
  });
});
