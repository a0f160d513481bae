import { afterEach, describe, expect, it } from 'vitest';
import { VirtualClock } from '../../src/sim/engine/clock.ts';
import { createEngine } from '../../src/sim/engine/engine.ts';
import type { GpuProfile } from '../../src/sim/engine/profile-types.ts';
import type { Engine, EngineObserver, EngineRequestSpec, FinishReason } from '../../src/sim/engine/types.ts';
import { getProfile } from '../../src/sim/profiles.ts';

const H100 = getProfile('llama3-8b-h100');

interface Trace {
  tokens: number[];
  indices: number[];
  times: number[];
  finish: FinishReason | null;
  scheduledAt: number;
}

let nextPrompt = 1;
/** Distinct random-looking prompt tokens, so unrelated prompts never share a block. */
function prompt(len: number): number[] {
  const base = nextPrompt++ * 1_000_003;
  return Array.from({ length: len }, (_, i) => (base + i * 7919) % 100000);
}

function spec(id: string, promptTokens: number[], out: number, extra: Partial<EngineRequestSpec> = {}) {
  return { id, promptTokens, maxTokens: out, naturalLength: out, ignoreEos: true, seed: 42, ...extra };
}

class Harness {
  readonly clock = new VirtualClock();
  readonly finished: Parameters<NonNullable<EngineObserver['onRequestFinished']>>[0][] = [];
  readonly engine: Engine;
  readonly traces = new Map<string, Trace>();

  constructor(profile: GpuProfile = H100) {
    this.engine = createEngine(profile, {
      timeScale: 1,
      clock: this.clock,
      observer: { onRequestFinished: (r) => this.finished.push(r) },
    });
  }

  add(s: EngineRequestSpec): Trace {
    const t: Trace = { tokens: [], indices: [], times: [], finish: null, scheduledAt: Number.NaN };
    this.traces.set(s.id, t);
    this.engine.add(s, {
      onScheduled: (at) => {
        t.scheduledAt = at;
      },
      onToken: (id, index, finish) => {
        t.tokens.push(id);
        t.indices.push(index);
        t.times.push(this.clock.now());
        t.finish = finish;
      },
    });
    return t;
  }

  /** TTFT of one request run alone on an idle engine, in simulated ms. */
  ttftAlone(s: EngineRequestSpec): number {
    const start = this.clock.now();
    const t = this.add(s);
    this.clock.run();
    return t.times[0]! - start;
  }
}

function tpot(t: Trace): number {
  return (t.times.at(-1)! - t.times[0]!) / (t.times.length - 1);
}

describe('engine timing', () => {
  it('TTFT rises with the uncached prompt length', () => {
    const h = new Harness();
    const t100 = h.ttftAlone(spec('a', prompt(100), 2));
    const t1000 = h.ttftAlone(spec('b', prompt(1000), 2));
    const t4000 = h.ttftAlone(spec('c', prompt(4000), 2));
    const t16000 = h.ttftAlone(spec('d', prompt(16000), 2));
    expect(t1000).toBeGreaterThan(t100 * 2);
    expect(t4000).toBeGreaterThan(t1000 * 2.5);
    // 16k tokens need two 8192-token chunks: two steps.
    expect(t16000).toBeGreaterThan(t4000 * 3);
    expect(h.engine.stats().steps).toBe(4 * 2 + 1);
  });

  it("counts the causal attention of every prefill chunk: a cold 7,000-token prompt's TTFT over the profile without it", () => {
    const a100 = getProfile('llama3-8b-a100');
    const tokens = prompt(7000);
    const withAttn = new Harness(a100).ttftAlone(spec('a', tokens, 2));
    const without = new Harness({ ...a100, attnFlopsPerPair: 0 }).ttftAlone(spec('a', tokens, 2));
    // Four chunks of at most 2,048 tokens compute 7,000 × 7,001 / 2 pairs in all, whatever the chunking.
    const expected = (a100.attnFlopsPerPair * ((7000 * 7001) / 2)) / ((a100.peakFlops * a100.mfu) / 1000);
    expect(withAttn - without).toBeCloseTo(expected, 3);
  });

  it('a request sharing a finished 2,000-token prefix hits its full blocks and gets a lower TTFT', () => {
    const h = new Harness();
    const shared = prompt(2000);
    const first = h.ttftAlone(spec('first', shared, 10));
    expect(h.engine.stats().prefixCacheHits).toBe(0);
    expect(h.engine.stats().prefixCacheQueries).toBe(2000);
    expect(h.engine.cachedPrefixTokens(shared)).toBe(2000);

    const second = h.ttftAlone(spec('second', [...shared, ...prompt(50)], 10));
    // 2000 = 125 full blocks, all cached; the 50 new tokens are computed.
    expect(h.engine.stats().prefixCacheHits).toBe(2000);
    expect(h.engine.stats().prefixCacheQueries).toBe(2000 + 2050);
    expect(second).toBeLessThan(first * 0.5);

    // The identical prompt again: the last block is recomputed to get logits.
    h.ttftAlone(spec('third', shared, 10));
    expect(h.engine.stats().prefixCacheHits).toBe(2000 + 1984);
  });

  it('a cache_salt keys the cache: the same prompt under another salt, or none, hits nothing', () => {
    const h = new Harness();
    const shared = prompt(2000);
    h.ttftAlone(spec('a', shared, 10, { cacheSalt: 'tenant-a' }));
    expect(h.engine.cachedPrefixTokens(shared, 'tenant-a')).toBe(2000);
    expect(h.engine.cachedPrefixTokens(shared)).toBe(0);
    h.ttftAlone(spec('b', [...shared, ...prompt(50)], 10, { cacheSalt: 'tenant-b' }));
    h.ttftAlone(spec('none', [...shared, ...prompt(50)], 10));
    expect(h.engine.stats().prefixCacheHits).toBe(0);
    // Under its own salt again, it hits its full blocks.
    h.ttftAlone(spec('a2', [...shared, ...prompt(50)], 10, { cacheSalt: 'tenant-a' }));
    expect(h.engine.stats().prefixCacheHits).toBe(2000);
  });

  it('requests admitted in one step with a shared prefix compute it once: the later ones hit the blocks being computed', () => {
    const h = new Harness();
    const shared = prompt(2000);
    const traces = [0, 1, 2, 3].map((i) => h.add(spec(`co${i}`, [...shared, ...prompt(50)], 4)));
    h.clock.run();
    // All four fit one step's token budget; the first computes the 125 shared blocks, which the
    // three admitted after it in the same step hit (as vLLM caches blocks when it schedules them).
    expect(traces.every((t) => t.scheduledAt === traces[0]!.scheduledAt)).toBe(true);
    expect(h.engine.stats().prefixCacheQueries).toBe(4 * 2050);
    expect(h.engine.stats().prefixCacheHits).toBe(3 * 2000);
  });

  it('output tokens fill blocks that later prompts can hit', () => {
    const h = new Harness();
    const p = prompt(32);
    const t = h.add(spec('gen', p, 40, { seed: 9 }));
    h.clock.run();
    // The conversation so far: prompt + 40 generated tokens; the last one was never computed.
    const history = [...p, ...t.tokens];
    expect(h.engine.cachedPrefixTokens(history)).toBe(64);
    expect(h.engine.cachedPrefixTokens([...history, ...prompt(20)])).toBe(64);
  });

  it('output fills blocks a later prompt can hit when the prompt itself was shorter than a block', () => {
    const h = new Harness();
    const p = prompt(10);
    const t = h.add(spec('short', p, 40, { seed: 3 }));
    h.clock.run();
    // 10 + 40 tokens, the last never computed: 49 computed, three full blocks of 16.
    const history = [...p, ...t.tokens];
    expect(h.engine.cachedPrefixTokens(history)).toBe(48);
  });

  it('a salt is no block of token ids: an unsalted prompt that starts with its character codes shares nothing with it', () => {
    const h = new Harness();
    const salt = 'sixteen-chars-ab';
    const rest = prompt(64);
    const codes = Array.from(salt, (c) => c.charCodeAt(0));
    h.ttftAlone(spec('plain', [...codes, ...rest], 10));
    expect(h.engine.cachedPrefixTokens([...codes, ...rest])).toBe(80);
    expect(h.engine.cachedPrefixTokens(rest, salt)).toBe(0);
  });

  it('output fills blocks under the salt of a prompt shorter than a block', () => {
    const h = new Harness();
    const p = prompt(10);
    const t = h.add(spec('short', p, 40, { seed: 3, cacheSalt: 's' }));
    h.clock.run();
    const history = [...p, ...t.tokens];
    expect(h.engine.cachedPrefixTokens(history, 's')).toBe(48);
    expect(h.engine.cachedPrefixTokens(history)).toBe(0);
  });

  it('cachedPrefixTokens is an oracle: it changes no counter and no eviction order', () => {
    const h = new Harness();
    const p = prompt(320);
    h.ttftAlone(spec('x', p, 2));
    const before = h.engine.stats();
    for (let i = 0; i < 5; i++) expect(h.engine.cachedPrefixTokens(p)).toBe(320);
    expect(h.engine.stats()).toEqual(before);
  });

  it('TPOT rises with the number of running sequences', () => {
    const alone = new Harness();
    const one = alone.add(spec('solo', prompt(200), 64));
    alone.clock.run();

    const busy = new Harness();
    const many = Array.from({ length: 128 }, (_, i) => busy.add(spec(`r${i}`, prompt(200), 64)));
    busy.clock.run();
    expect(busy.engine.stats().steps).toBeLessThan(70); // they really ran together
    const median = many.map(tpot).sort((a, b) => a - b)[64]!;
    expect(median).toBeGreaterThan(tpot(one) * 1.5);
    expect(one.indices).toEqual(Array.from({ length: 64 }, (_, i) => i));
  });

  it('setSlowdown and a per-request slowFactor stretch the steps', () => {
    const h = new Harness();
    const base = h.ttftAlone(spec('a', prompt(500), 1));
    h.engine.setSlowdown(2);
    const slowed = h.ttftAlone(spec('b', prompt(500), 1));
    h.engine.setSlowdown(1);
    const slowReq = h.ttftAlone(spec('c', prompt(500), 1, { slowFactor: 3 }));
    expect(slowed / base).toBeCloseTo(2, 5);
    expect(slowReq / base).toBeCloseTo(3, 5);
  });

  it('a change of speed re-times the step under way: its work not yet done runs at the new pace', () => {
    const h = new Harness();
    const base = h.ttftAlone(spec('a', prompt(500), 1));
    // Slowed 1000 times, then back to normal a quarter of a normal step in: the step has done a
    // 4,000th of its work, and the rest takes a normal step's time, not 1000 times it.
    h.engine.setSlowdown(1000);
    const start = h.clock.now();
    const t = h.add(spec('b', prompt(500), 1));
    h.clock.run(start + base / 4);
    expect(t.times).toEqual([]);
    h.engine.setSlowdown(1);
    h.clock.run();
    expect(t.times[0]! - start).toBeCloseTo(base / 4 + base * (1 - 1 / 4000), 5);
    // And slowed in the middle of a step: its second half takes twice as long.
    const s2 = h.clock.now();
    const u = h.add(spec('c', prompt(500), 1));
    h.clock.run(s2 + base / 2);
    h.engine.setSlowdown(2);
    h.clock.run();
    expect(u.times[0]! - s2).toBeCloseTo(base / 2 + base, 5);
  });
});

describe('engine scheduling', () => {
  it('splits a prompt larger than the token budget into chunks, running requests first', () => {
    const small: GpuProfile = { ...H100, maxNumBatchedTokens: 256 };
    const h = new Harness(small);
    const a = h.add(spec('a', prompt(1000), 5));
    h.clock.run();
    // ceil(1000 / 256) = 4 prefill steps, then 4 decode steps.
    expect(h.engine.stats().steps).toBe(8);
    expect(a.indices).toEqual([0, 1, 2, 3, 4]);
  });

  it('honours max_num_seqs', () => {
    const h = new Harness({ ...H100, maxNumSeqs: 3 });
    for (let i = 0; i < 7; i++) h.add(spec(`q${i}`, prompt(50), 20));
    let maxRunning = 0;
    for (let t = 1; t < 2000; t += 1) {
      h.clock.run(t);
      maxRunning = Math.max(maxRunning, h.engine.stats().running);
    }
    h.clock.run();
    expect(maxRunning).toBe(3);
    expect(h.finished).toHaveLength(7);
  });

  it('finishes at min(maxTokens, naturalLength): stop, length, and ignore_eos', () => {
    const h = new Harness();
    const stop = h.add(spec('stop', prompt(30), 50, { naturalLength: 7, ignoreEos: false }));
    const length = h.add(spec('length', prompt(30), 5, { naturalLength: 7, ignoreEos: false }));
    const ignore = h.add(spec('ignore', prompt(30), 12, { naturalLength: 7, ignoreEos: true }));
    h.clock.run();
    expect([stop.tokens.length, stop.finish]).toEqual([7, 'stop']);
    expect([length.tokens.length, length.finish]).toEqual([5, 'length']);
    expect([ignore.tokens.length, ignore.finish]).toEqual([12, 'length']);
    const s = h.engine.stats();
    expect(s.generationTokens).toBe(24);
    expect(s.promptTokens).toBe(90);
    expect(s.running + s.waiting).toBe(0);
  });

  it('reports queue, prefill, decode and TTFT consistently', () => {
    const h = new Harness({ ...H100, maxNumSeqs: 1 });
    h.add(spec('first', prompt(100), 20));
    h.add(spec('queued', prompt(100), 20));
    h.clock.run();
    const q = h.finished.find((f) => f.id === 'queued')!;
    expect(q.queueS).toBeGreaterThan(0.05);
    expect(q.ttftS).toBeCloseTo(q.queueS + q.prefillS, 9);
    expect(q.e2eS).toBeCloseTo(q.ttftS + q.decodeS, 9);
    expect(q.generationTokens).toBe(20);
    expect(q.reason).toBe('length');
  });

  it('preempts under a tiny KV cache and still finishes every request with the right token count', () => {
    // 40 blocks of 16 = 624 usable tokens; 10 requests of 64 + 120 tokens need 12 blocks each.
    const tiny: GpuProfile = { ...H100, numGpuBlocks: 40, maxModelLen: 600 };
    const h = new Harness(tiny);
    const lens = [120, 90, 120, 60, 120, 110, 120, 80, 120, 100];
    const traces = lens.map((n, i) =>
      h.add(spec(`t${i}`, prompt(64), 120, { naturalLength: n, ignoreEos: false, seed: i })),
    );
    let peakUsage = 0;
    for (let t = 5; h.engine.stats().running + h.engine.stats().waiting > 0; t += 5) {
      h.clock.run(t);
      peakUsage = Math.max(peakUsage, h.engine.stats().kvCacheUsage);
    }
    const s = h.engine.stats();
    expect(s.preemptions).toBeGreaterThan(0);
    expect(peakUsage).toBeGreaterThan(0.9);
    traces.forEach((t, i) => {
      expect(t.indices).toEqual(Array.from({ length: lens[i]! }, (_, k) => k));
      expect(t.finish).toBe(lens[i] === 120 ? 'length' : 'stop');
    });
    expect(s.kvCacheUsage).toBe(0);
    // Each request's lookup is counted once, at its first admission, as vLLM (0.11 on) counts it:
    // a re-admission after preemption would mostly hit its own freed blocks.
    expect(s.prefixCacheQueries).toBe(10 * 64);
  });

  it('rejects a request that could never fit the KV cache', () => {
    const h = new Harness({ ...H100, numGpuBlocks: 10 });
    expect(() => h.engine.add(spec('big', prompt(100), 100), { onToken() {} })).toThrow(RangeError);
    expect(h.engine.stats().waiting).toBe(0);
  });
});

describe('engine abort, reset and determinism', () => {
  it('an aborted request leaves the running set at once and gets no more tokens', () => {
    const h = new Harness();
    const victim = h.add(spec('victim', prompt(100), 500));
    const other = h.add(spec('other', prompt(100), 50));
    h.clock.run(100);
    expect(h.engine.stats().running).toBe(2);
    const emitted = victim.tokens.length;
    expect(emitted).toBeGreaterThan(3);
    h.engine.abort('victim');
    expect(h.engine.stats().running).toBe(1);
    h.clock.run();
    expect(victim.tokens.length).toBe(emitted);
    expect(other.tokens.length).toBe(50);
    expect(h.finished.map((f) => f.id)).toEqual(['other']);
    expect(h.engine.stats().kvCacheUsage).toBe(0);
  });

  it('abort from inside a token callback and abort of a waiting request', () => {
    const h = new Harness({ ...H100, maxNumSeqs: 1 });
    const tokens: number[] = [];
    h.engine.add(spec('self', prompt(40), 100), {
      onToken: (_id, index) => {
        tokens.push(index);
        if (index === 2) h.engine.abort('self');
      },
    });
    const waiting = h.add(spec('waiting', prompt(40), 10));
    expect(h.engine.stats().waiting).toBe(2);
    h.engine.abort('waiting');
    expect(h.engine.stats().waiting).toBe(1);
    h.clock.run();
    expect(tokens).toEqual([0, 1, 2]);
    expect(waiting.tokens).toEqual([]);
    expect(h.engine.stats().running).toBe(0);
  });

  it('reset drops requests silently and keeps the cache and counters unless it is a restart', () => {
    const h = new Harness();
    const p = prompt(160);
    h.ttftAlone(spec('warm', p, 2));
    const dropped = h.add(spec('dropped', prompt(100), 100));
    h.clock.run(h.clock.now() + 50);
    const seen = dropped.tokens.length;
    h.engine.reset();
    h.clock.run();
    expect(dropped.tokens.length).toBe(seen);
    expect(h.engine.stats().running + h.engine.stats().waiting).toBe(0);
    expect(h.engine.cachedPrefixTokens(p)).toBe(160);
    expect(h.engine.stats().prefixCacheQueries).toBeGreaterThan(0);
    h.engine.reset({ restart: true });
    expect(h.engine.cachedPrefixTokens(p)).toBe(0);
    // A restart counts from 0, as a new vLLM process does.
    expect(h.engine.stats()).toMatchObject({
      prefixCacheQueries: 0,
      promptTokens: 0,
      generationTokens: 0,
      steps: 0,
    });
    // Still usable afterwards.
    const after = h.add(spec('after', prompt(20), 3));
    h.clock.run();
    expect(after.tokens).toHaveLength(3);
  });

  it('same seed and prompt give the same tokens; another seed gives others', () => {
    const p = prompt(50);
    const run = (seed: number) => {
      const h = new Harness();
      const t = h.add(spec('d', p, 40, { seed }));
      h.clock.run();
      return t.tokens;
    };
    const a = run(7);
    expect(run(7)).toEqual(a);
    expect(run(8)).not.toEqual(a);
    for (const id of a) expect(id >= 0 && id < 100000).toBe(true);
  });
});

describe('engine on real timers', () => {
  const engines: Engine[] = [];
  afterEach(() => {
    for (const e of engines) e.close();
    engines.length = 0;
  });

  it('runs in scaled wall time, sleeps when idle and wakes on add', async () => {
    const itl: number[] = [];
    const engine = createEngine(H100, {
      timeScale: 0.2,
      observer: { onInterTokenLatency: (s) => itl.push(s) },
    });
    engines.push(engine);
    const runOne = (id: string) =>
      new Promise<number>((resolve) => {
        const t0 = performance.now();
        engine.add(spec(id, prompt(100), 40), {
          onToken: (_t, _i, finish) => {
            if (finish) resolve(performance.now() - t0);
          },
        });
      });
    const wall = await runOne('w1');
    // 40 steps of ≥ 6 ms simulated each, at 0.2 ⇒ ≥ 48 ms of wall time; generous upper bound.
    expect(wall).toBeGreaterThan(40 * 6 * 0.2 * 0.95);
    expect(wall).toBeLessThan(5000);
    expect(itl).toHaveLength(39);
    const steps = engine.stats().steps;
    await new Promise((r) => setTimeout(r, 30));
    expect(engine.stats().steps).toBe(steps); // idle: no steps
    await runOne('w2');
    expect(engine.stats().steps).toBe(steps * 2);
  });

  it('abort on real timers stops tokens within one step', async () => {
    const engine = createEngine(H100, { timeScale: 0.1 });
    engines.push(engine);
    let count = 0;
    let afterAbort = 0;
    let aborted = false;
    await new Promise<void>((resolve) => {
      engine.add(spec('long', prompt(100), 100000), {
        onToken: () => {
          count++;
          if (aborted) afterAbort++;
          if (count === 5) {
            setTimeout(() => {
              engine.abort('long');
              aborted = true;
              expect(engine.stats().running).toBe(0);
              setTimeout(resolve, 20);
            }, 3);
          }
        },
      });
    });
    expect(afterAbort).toBe(0);
  });
});
