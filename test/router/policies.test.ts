// The routing policies as pure functions of the request and the backend views.
import { describe, expect, it } from 'vitest';
import { ROUTER_POLICIES } from '../../src/config/index.ts';
import { createRoutingPolicy, ROUTER_POLICY_NAMES } from '../../src/router/index.ts';
import { cacheAware } from '../../src/router/policies/cache-aware.ts';
import { leastLoaded } from '../../src/router/policies/least-loaded.ts';
import { prefixOnly } from '../../src/router/policies/prefix-only.ts';
import { slagate } from '../../src/router/policies/slagate.ts';
import type { BackendView } from '../../src/router/types.ts';
import { rng as seededRandom } from '../helpers/rng.ts';
import { route, view } from './fixtures.ts';

const req = route();
const loaded = (name: string, inflight: number, weight = 1): BackendView => view(name, { inflight, weight });
const opts = { exploreRatio: 0, tolerance: () => null };
const firstOf = (ranked: { backend: string }[]) => ranked[0]!.backend;

describe('round_robin', () => {
  it('cycles through backends and ranks every backend once', () => {
    const rr = createRoutingPolicy('round_robin', opts);
    const backends = [loaded('a', 0), loaded('b', 0), loaded('c', 0)];
    const firsts = Array.from({ length: 6 }, () => firstOf(rr.rank(route(), backends)));
    expect(firsts).toEqual(['a', 'b', 'c', 'a', 'b', 'c']);
    const ranked = rr.rank(route(), backends).map((c) => c.backend);
    expect([...ranked].sort()).toEqual(['a', 'b', 'c']);
  });

  it('a request ranked again (it waited, or it is retried) keeps its place in the ring', () => {
    const rr = createRoutingPolicy('round_robin', opts);
    const backends = [loaded('a', 0), loaded('b', 0), loaded('c', 0)];
    const waiting = route();
    const first = firstOf(rr.rank(waiting, backends));
    for (let i = 0; i < 5; i++) expect(firstOf(rr.rank(waiting, backends))).toBe(first);
    // The next request takes the next place.
    expect(firstOf(rr.rank(route(), backends))).not.toBe(first);
  });

  it('gives a backend of weight 2 twice the first picks', () => {
    const rr = createRoutingPolicy('round_robin', opts);
    const backends = [loaded('a', 0, 2), loaded('b', 0, 1)];
    const counts: Record<string, number> = { a: 0, b: 0 };
    for (let i = 0; i < 300; i++) counts[firstOf(rr.rank(route(), backends))]! += 1;
    expect(counts.a).toBe(200);
    expect(counts.b).toBe(100);
  });

  it('returns nothing for no backends', () => {
    expect(createRoutingPolicy('round_robin', opts).rank(req, [])).toEqual([]);
  });
});

describe('least_loaded', () => {
  it('ranks by in-flight per weight', () => {
    const ll = createRoutingPolicy('least_loaded', opts);
    const ranked = ll.rank(req, [loaded('a', 5), loaded('b', 1), loaded('c', 3), loaded('d', 2, 4)]);
    expect(ranked.map((c) => c.backend)).toEqual(['d', 'b', 'c', 'a']);
  });

  it('breaks ties at random instead of herding onto the first backend', () => {
    const ll = leastLoaded();
    const backends = [loaded('a', 2), loaded('b', 2), loaded('c', 2)];
    const firsts = new Set<string>();
    for (let i = 0; i < 200; i++) firsts.add(firstOf(ll.rank(req, backends)));
    expect(firsts).toEqual(new Set(['a', 'b', 'c']));
  });
});

describe('prefix_only', () => {
  it('takes the longest match whatever the load, and spreads at random where nothing matches', () => {
    const po = prefixOnly(seededRandom(1));
    const ranked = po.rank(req, [
      view('a', { cachedBlocks: 2, inflight: 0 }),
      view('b', { cachedBlocks: 9, inflight: 500 }),
      view('c', { cachedBlocks: 5 }),
    ]);
    expect(ranked.map((c) => c.backend)).toEqual(['b', 'c', 'a']);
    const firsts = new Set<string>();
    for (let i = 0; i < 100; i++) firsts.add(firstOf(po.rank(req, [view('a'), view('b'), view('c')])));
    expect(firsts).toEqual(new Set(['a', 'b', 'c']));
  });
});

describe('cache_aware (SGLang)', () => {
  const r = route({ promptTokens: 1000 });

  it('takes the best match when it covers more than 30% of the prompt, else the least loaded', () => {
    const ca = cacheAware(seededRandom(2));
    const held = [view('a', { cachedTokens: 400, inflight: 10 }), view('b', { inflight: 2 })];
    expect(firstOf(ca.rank(r, held))).toBe('a');
    const little = [view('a', { cachedTokens: 250, inflight: 10 }), view('b', { inflight: 2 })];
    expect(firstOf(ca.rank(r, little))).toBe('b');
  });

  it('goes to the shortest queue when the load is imbalanced (by more than 64 and 1.5×)', () => {
    const ca = cacheAware(seededRandom(3));
    const hot = [view('a', { cachedTokens: 900, inflight: 100 }), view('b', { inflight: 30 })];
    expect(firstOf(ca.rank(r, hot))).toBe('b');
    // 100 against 40: over 1.5× but only 60 apart: the match still wins.
    const near = [view('a', { cachedTokens: 900, inflight: 100 }), view('b', { inflight: 40 })];
    expect(firstOf(ca.rank(r, near))).toBe('a');
  });
});

describe('slagate', () => {
  const fitted = (name: string, ttftMs: number, over: Partial<BackendView> = {}) =>
    view(name, { predictedTtftMs: ttftMs, prefillMs: ttftMs / 2, tpotMs: 20, ...over });

  it('ranks by predicted TTFT in seconds, with the decode pressure the request would suffer', () => {
    const p = slagate(opts);
    const r = route({ outputTokensPerSequence: 100, tpotTargetMs: 50 });
    // c is fastest to a first token, but its TPOT with this request would be 60 ms against a
    // 50 ms target: 100 tokens × 10 ms = 1 s more.
    const ranked = p.rank(r, [fitted('a', 300), fitted('b', 200), fitted('c', 100, { tpotMs: 60 })]);
    expect(ranked.map((c) => c.backend)).toEqual(['b', 'a', 'c']);
    expect(ranked[0]!.cost).toBeCloseTo(0.2, 9);
    expect(ranked[2]!.cost).toBeCloseTo(0.1 + 1, 9);
    expect(ranked[2]!.terms).toMatchObject({ ttft_s: 0.1, decode_s: 1 });
  });

  it('charges a prefill on a full cache for the cached work it displaces, so a miss there costs more', () => {
    const p = slagate(opts);
    // b holds the prompt (prefill 40 ms) and is predicted 150 ms slower to a first token than a,
    // where the whole prompt would be prefilled (400 ms). Both caches are full: the miss on a
    // displaces 400 ms of someone's cached prefix, the hit on b 40 ms; that outweighs the 150 ms.
    const backends = [
      fitted('a', 500, { prefillMs: 400, cacheFill: 1 }),
      fitted('b', 650, { prefillMs: 40, cachedBlocks: 90, cacheFill: 1 }),
    ];
    const ranked = p.rank(req, backends);
    expect(ranked.map((c) => c.backend)).toEqual(['b', 'a']);
    expect(ranked[1]!.cost).toBeCloseTo(0.5 + 0.4, 9);
    expect(ranked[1]!.terms).toMatchObject({ evict_s: 0.4 });
    // With room in a's cache nothing is displaced and the faster first token wins.
    const roomy = [{ ...backends[0]!, cacheFill: 0 }, backends[1]!];
    expect(p.rank(req, roomy).map((c) => c.backend)).toEqual(['a', 'b']);
  });

  it('logs a cost term whose input is not measured yet as null, not 0', () => {
    const p = slagate(opts);
    const r = route({ outputTokensPerSequence: 100, tpotTargetMs: 50 });
    const [c] = p.rank(r, [fitted('a', 300, { tpotMs: null, prefillMs: null, inflight: 4, cacheFill: 1 })]);
    expect(c!.terms).toMatchObject({ decode_s: null, stall_s: null, evict_s: null, prefill_s: null });
    // Measured, the same terms are numbers (0 where nothing is owed).
    const [m] = p.rank(r, [fitted('a', 300, { tpotMs: 20, prefillMs: 100, inflight: 4, cacheFill: 1 })]);
    expect(m!.terms).toMatchObject({ decode_s: 0, stall_s: 0.4, evict_s: 0.1, prefill_s: 0.1 });
  });

  it('before every backend has a fit, uses uncached tokens × (running + 1)', () => {
    const p = slagate(opts);
    const ranked = p.rank(req, [
      view('a', { uncachedTokens: 1000, inflight: 0 }), // 1000
      view('b', { uncachedTokens: 100, inflight: 4 }), // 500
      fitted('c', 1), // a fit alone does not count until all have one: 100 × 1
    ]);
    expect(ranked.map((c) => c.backend)).toEqual(['c', 'b', 'a']);
  });

  it('within the predictor error of the best, prefers the backend holding more of the prompt', () => {
    const tolerance = { value: 0.1 as number | null };
    const p = slagate({ exploreRatio: 0, tolerance: () => tolerance.value, random: seededRandom(4) });
    const backends = [fitted('a', 100), fitted('b', 105, { cachedBlocks: 40 })];
    expect(firstOf(p.rank(req, backends))).toBe('b');
    // Beyond the margin the cheaper one wins: affinity is broken.
    tolerance.value = 0.01;
    expect(firstOf(p.rank(req, backends))).toBe('a');
    // Without a measured error, only equal costs are ties.
    tolerance.value = null;
    expect(firstOf(p.rank(req, backends))).toBe('a');
  });

  it('keeps a session on its backend while it is within the margin: a tie-breaker, not an override', () => {
    const p = slagate({ exploreRatio: 0, tolerance: () => 0.2, random: seededRandom(5) });
    const s = route({ sessionId: 'conv-1' });
    // Each turn is sent where the policy ranked it first (the scheduler tells it so).
    const turn = (backends: BackendView[]) => {
      const first = firstOf(p.rank(s, backends));
      p.sent!(s, first);
      return first;
    };
    expect(turn([fitted('a', 100), fitted('b', 300)])).toBe('a');
    // b is now slightly cheaper, but within 20%: the session stays on a.
    expect(turn([fitted('a', 110), fitted('b', 100)])).toBe('a');
    // Far cheaper elsewhere: the session moves.
    expect(turn([fitted('a', 500), fitted('b', 100)])).toBe('b');
    // And stays there from then on.
    expect(turn([fitted('a', 100), fitted('b', 110)])).toBe('b');
  });

  it('keeps a session where its request was sent, not where it was only ranked', () => {
    const p = slagate({ exploreRatio: 0, tolerance: () => 0.2, random: seededRandom(9) });
    const s = route({ sessionId: 'conv-2' });
    // Ranked first on b many times while it waited, then sent to a (the scheduler passed over b).
    for (let i = 0; i < 5; i++) expect(firstOf(p.rank(s, [fitted('a', 110), fitted('b', 100)]))).toBe('b');
    p.sent!(s, 'a');
    // The next turn: within the margin, the session's backend (a) wins the tie.
    expect(firstOf(p.rank(route({ sessionId: 'conv-2' }), [fitted('a', 110), fitted('b', 100)]))).toBe('a');
  });

  it('breaks exact ties at random', () => {
    const p = slagate({ ...opts, random: seededRandom(6) });
    const firsts = new Set<string>();
    for (let i = 0; i < 100; i++)
      firsts.add(firstOf(p.rank(req, [fitted('a', 100), fitted('b', 100), fitted('c', 100)])));
    expect(firsts).toEqual(new Set(['a', 'b', 'c']));
  });

  // a holds the prompt (cheap own prefill) behind 300 ms of work and costs least; c holds as much
  // and would start it sooner, but 50 requests decode there (a stall the cost charges); b holds
  // nothing and would start its prefill soonest of all (after 10 ms).
  const explorable = () => [
    view('a', { predictedTtftMs: 310, prefillMs: 10, cachedBlocks: 50, tpotMs: 20 }),
    view('b', { predictedTtftMs: 500, prefillMs: 490, tpotMs: 20 }),
    view('c', { predictedTtftMs: 200, prefillMs: 10, cachedBlocks: 50, tpotMs: 20, inflight: 50 }),
  ];

  it('sends the exploration share where the prefill would start soonest among the backends holding the most of the prompt', () => {
    const p = slagate({ exploreRatio: 0.25, tolerance: () => 0, random: seededRandom(7) });
    const counts: Record<string, number> = { a: 0, b: 0, c: 0 };
    for (let i = 0; i < 2000; i++) counts[firstOf(p.rank(route({ reqId: `r${i}` }), explorable()))]! += 1;
    expect(counts.c! / 2000).toBeGreaterThan(0.2);
    expect(counts.c! / 2000).toBeLessThan(0.3);
    // Exploring never throws the cached prefix away, however soon b would start.
    expect(counts.b).toBe(0);
  });

  it('explores in one unit: in-flight requests when a holder has no fit yet, not its count against the others’ milliseconds', () => {
    const p = slagate({ exploreRatio: 1, tolerance: () => 0, random: seededRandom(12) });
    // a and b hold the prompt; a has a fit (20 ms of wait ahead) and 1 request in flight; b just
    // joined: no fit, 6 requests in flight. Counted in one unit, a starts soonest.
    const backends = [
      view('a', { predictedTtftMs: 30, prefillMs: 10, cachedBlocks: 50, tpotMs: 20, inflight: 1 }),
      view('b', { cachedBlocks: 50, inflight: 6 }),
    ];
    for (let i = 0; i < 50; i++) expect(firstOf(p.rank(route({ reqId: `u${i}` }), backends))).toBe('a');
  });

  it('does not explore when every backend holding the most of the prompt is busy', () => {
    const p = slagate({ exploreRatio: 1, tolerance: () => 0, random: seededRandom(11) });
    // a holds the prompt but has no room (a slot in 100 ms); b has room and holds nothing.
    const backends = [
      view('a', {
        predictedTtftMs: 110,
        prefillMs: 10,
        cachedBlocks: 50,
        tpotMs: 20,
        hasRoom: false,
        slotWaitMs: 100,
      }),
      view('b', { predictedTtftMs: 500, prefillMs: 490, tpotMs: 20 }),
    ];
    for (let i = 0; i < 50; i++) expect(firstOf(p.rank(route({ reqId: `h${i}` }), backends))).toBe('a');
  });

  it('explores over every backend with room when none holds the prompt', () => {
    const p = slagate({ exploreRatio: 0.25, tolerance: () => 0, random: seededRandom(10) });
    // a costs least; b would start the prefill at once but 50 requests decode there.
    const backends = [
      view('a', { predictedTtftMs: 410, prefillMs: 400, tpotMs: 20 }),
      view('b', { predictedTtftMs: 400, prefillMs: 400, tpotMs: 20, inflight: 50 }),
    ];
    const counts: Record<string, number> = { a: 0, b: 0 };
    for (let i = 0; i < 2000; i++) counts[firstOf(p.rank(route({ reqId: `q${i}` }), backends))]! += 1;
    expect(counts.b! / 2000).toBeGreaterThan(0.2);
    expect(counts.b! / 2000).toBeLessThan(0.3);
  });

  it('draws exploration once per request: a request ranked again while it waits keeps its first choice', () => {
    const p = slagate({ exploreRatio: 0.01, tolerance: () => 0, random: seededRandom(8) });
    // a is where every non-exploring request goes, c where an exploring one does.
    const backends = explorable();
    // 200 requests, each ranked 100 times as a waiting request is (once per pump). A draw per
    // ranking would send about 1 − 0.99^100 = 63% of them to c at some ranking.
    let strayed = 0;
    let explored = 0;
    for (let i = 0; i < 200; i++) {
      const r = route({ reqId: `w${i}` });
      const firsts = new Set(Array.from({ length: 100 }, () => firstOf(p.rank(r, backends))));
      if (firsts.size > 1) strayed++;
      if (firsts.has('c')) explored++;
    }
    expect(strayed).toBe(0);
    expect(explored).toBeLessThan(10);
  });
});

describe('createRoutingPolicy', () => {
  it('builds every policy the config accepts, so check-config and serve accept the same ones', () => {
    expect([...ROUTER_POLICY_NAMES].sort()).toEqual([...ROUTER_POLICIES].sort());
    for (const name of ROUTER_POLICIES) expect(createRoutingPolicy(name, opts).name).toBe(name);
  });
});
