import { afterEach, describe, expect, it } from 'vitest';
import { createLiveState, type LiveState } from '../../src/state/index.ts';
import { rng } from '../helpers/rng.ts';
import { latencySample, observe, type Sample } from './fixtures/sample.ts';

const BACKENDS = [
  { name: 'gpu-0', url: 'http://127.0.0.1:1' },
  { name: 'gpu-1', url: 'http://127.0.0.1:2' },
];

const sample = (over: Partial<Sample> = {}) => latencySample({ loadAtDispatch: 2, ...over });
/** A sample of `backend` whose dispatch-to-first-token time is `baseMs` + `msPerToken` × its uncached tokens. */
const linear = (backend: string, uncached: number, baseMs: number, msPerToken: number) =>
  sample({ backend, queueMs: 0, ttftMs: baseMs + msPerToken * uncached, uncachedPromptTokens: uncached });

describe('LiveState with the memory store', () => {
  let clock = 1_000_000;
  let state: LiveState;
  const make = (opts: { bucketMs?: number; buckets?: number } = {}) => {
    clock = 1_000_000;
    state = createLiveState(
      { store: 'memory' },
      {
        backends: BACKENDS,
        scrape: false,
        now: () => clock,
        window: { bucketMs: opts.bucketMs ?? 1000, buckets: opts.buckets ?? 60 },
      },
    );
    return state;
  };
  afterEach(async () => {
    await state.close();
  });

  it('leases count requests and tokens until ended; end and prefillDone are idempotent', () => {
    const s = make();
    const a = s.lease('gpu-0', { promptTokens: 1000, expectedOutputTokens: 200, uncachedPromptTokens: 600 });
    const b = s.lease('gpu-0', { promptTokens: 50, expectedOutputTokens: 10 });
    s.lease('gpu-1', { promptTokens: 7, expectedOutputTokens: 1 });
    expect(s.inflight('gpu-0')).toEqual({
      requests: 2,
      promptTokens: 1050,
      expectedOutputTokens: 210,
      pendingPrefillTokens: 650,
    });
    a.prefillDone();
    a.prefillDone();
    expect(s.inflight('gpu-0').pendingPrefillTokens).toBe(50);
    a.end();
    a.end();
    b.end();
    expect(s.inflight('gpu-0')).toEqual({
      requests: 0,
      promptTokens: 0,
      expectedOutputTokens: 0,
      pendingPrefillTokens: 0,
    });
    expect(s.load('gpu-1')).toBe(1);
    expect(s.backendView('gpu-1')?.localInflight.requests).toBe(1);
    // A huge finite count (`"max_tokens": 1e300`) open alongside others does not absorb theirs.
    const huge = s.lease('gpu-0', { promptTokens: 10, expectedOutputTokens: 1e300 });
    const small = s.lease('gpu-0', { promptTokens: 10, expectedOutputTokens: 3 });
    huge.end();
    expect(s.inflight('gpu-0').expectedOutputTokens).toBe(3);
    small.end();
    expect(s.inflight('gpu-0')).toEqual({
      requests: 0,
      promptTokens: 0,
      expectedOutputTokens: 0,
      pendingPrefillTokens: 0,
    });
  });

  it("a tenant's tokens leave the minute's window where they were counted; what this instance never saw leaves within the minute", () => {
    const s = make();
    s.tenantLease('a', 300).end();
    clock += 20_000;
    s.tenantLease('a', 200).end();
    // The first 300 tokens leave 40 s from now, the next 200 a minute after they came.
    expect(s.tenantTokensFreedInMs('a', 300)).toBe(40_000);
    expect(s.tenantTokensFreedInMs('a', 400)).toBe(60_000);
    // A tenant whose usage is all on peers (only their totals are shared): the whole window, not 0.
    expect(s.tenantTokensFreedInMs('elsewhere', 100)).toBe(60_000);
  });

  it("a wall clock stepped back by more than the minute does not hold a tenant's tokens in the window until it catches up", () => {
    const s = make();
    s.tenantLease('a', 500).end();
    expect(s.tenantUsage('a').tokens).toBe(500);
    // An NTP step (or a restored VM) puts the clock an hour back.
    clock -= 3_600_000;
    s.tenantLease('a', 10).end();
    expect(s.tenantUsage('a').tokens).toBe(10);
    expect(s.tenantTokensFreedInMs('a', 10)).toBeLessThanOrEqual(60_000);
    // A small step back (a clock read a moment earlier) keeps what the window holds.
    clock -= 500;
    s.tenantLease('a', 5).end();
    expect(s.tenantUsage('a').tokens).toBe(15);
  });

  it("tells a backend's prefill rate only from its own prompts' spread, not the spread the fleet's prior lends it", () => {
    const s = make();
    const rand = rng(11);
    // gpu-1 serves chat prompts of every size; gpu-0 one template of 2,000 tokens, alone each time.
    for (let i = 0; i < 300; i++) {
      clock += 50;
      const uncached = 200 + Math.floor(rand() * 3800);
      observe(s, sample({ backend: 'gpu-1', ttftMs: 50 + 0.1 * uncached, uncachedPromptTokens: uncached }));
    }
    for (let i = 0; i < 40; i++) {
      clock += 50;
      observe(s, sample({ backend: 'gpu-0', ttftMs: 250, uncachedPromptTokens: 2000 }));
      // From its third sample on, its own prompts say nothing of its rate.
      if (i >= 2) expect(s.prefillRateTold('gpu-0')).toBe(false);
    }
    expect(s.prefillRateTold('gpu-1')).toBe(true);
    // gpu-0's prompts come to spread by 5% of their size (1,800 to 2,200 tokens): told.
    for (let i = 0; i < 40; i++) {
      clock += 50;
      const uncached = 1800 + 100 * (i % 5);
      observe(s, sample({ backend: 'gpu-0', ttftMs: 50 + 0.1 * uncached, uncachedPromptTokens: uncached }));
    }
    expect(s.prefillRateTold('gpu-0')).toBe(true);
  });

  it('an idle backend keeps its rates: after an hour, or a night, one new sample does not define its fit alone', () => {
    const s = make();
    const rand = rng(7);
    const teachBoth = () => {
      for (let i = 0; i < 500; i++) {
        clock += 50;
        for (const backend of ['gpu-0', 'gpu-1']) {
          const uncached = Math.floor(rand() * 4000);
          const load = Math.floor(rand() * 10);
          observe(
            s,
            sample({
              backend,
              ttftMs: 50 + 0.1 * uncached + 5 * load,
              uncachedPromptTokens: uncached,
              loadAtDispatch: load,
            }),
          );
        }
      }
    };
    teachBoth();
    const truth = (tokens: number) => 50 + 0.1 * tokens;
    expect(s.predictTtftMs('gpu-0', 4000)!).toBeCloseTo(truth(4000) + 5 * s.inflight('gpu-0').requests, -1);
    // An idle hour for the whole fleet, then one first token on gpu-0.
    clock += 60 * 60_000;
    observe(s, sample({ backend: 'gpu-0', ttftMs: 80, uncachedPromptTokens: 300, loadAtDispatch: 0 }));
    expect(s.prefillMs('gpu-0', 2000)!).toBeGreaterThan(150);
    expect(s.predictTtftMs('gpu-0', 4000)!).toBeGreaterThan(300);
    // A night with gpu-1 busy and gpu-0 idle: gpu-0's prediction is still its own rates.
    for (let h = 0; h < 18; h++) {
      clock += 60 * 60_000;
      observe(s, sample({ backend: 'gpu-1', ttftMs: 250, uncachedPromptTokens: 2000, loadAtDispatch: 0 }));
      s.predictTtftMs('gpu-1', 2000);
    }
    expect(s.predictTtftMs('gpu-0', 2000)!).toBeGreaterThan(200);
    expect(s.predictTtftMs('gpu-0', 2000)!).toBeLessThan(300);
    expect(s.predictTtftMs('gpu-0', 100)!).toBeGreaterThan(40);
  });

  it("one stalled first token does not take the backend's fit with it: the window shows it, the rates hold", () => {
    const s = make();
    const rand = rng(11);
    const truth = (tokens: number, load: number) => 40 + 0.1 * tokens + 5 * load;
    for (let i = 0; i < 300; i++) {
      clock += 250;
      const uncached = 200 + Math.floor(rand() * 1800);
      const load = Math.floor(rand() * 6);
      s.recordFirstToken({
        backend: 'gpu-0',
        backendTtftMs: truth(uncached, load),
        uncachedPromptTokens: uncached,
        prefillAheadTokens: 0,
        loadAtDispatch: load,
      });
    }
    const before = s.predictTtftMs('gpu-0', 2000)!;
    // A batch request of 8,000 tokens whose first token a stall held for 30 s.
    clock += 250;
    s.recordFirstToken({
      backend: 'gpu-0',
      backendTtftMs: 30_000,
      uncachedPromptTokens: 8000,
      prefillAheadTokens: 0,
      loadAtDispatch: 2,
    });
    clock += 50;
    const after = s.predictTtftMs('gpu-0', 2000)!;
    // Taken whole, the sample took this prediction from about 240 ms to about 1.5 s, and the
    // prefill rate 15 times down; bounded, it moves them by a fraction (the sample lies far out
    // along the prompt axis, where one point leans hardest on a slope).
    expect(after).toBeLessThan(before * 1.3);
    expect(s.prefillMs('gpu-0', 1000)!).toBeLessThan(0.1 * 1000 * 1.7);
    // A backend that turned slower for good is followed all the same: three times slower, for a
    // minute and a quarter (a half-life and a quarter of the fit's forgetting).
    for (let i = 0; i < 300; i++) {
      clock += 250;
      const uncached = 200 + Math.floor(rand() * 1800);
      s.recordFirstToken({
        backend: 'gpu-0',
        backendTtftMs: 3 * truth(uncached, 0),
        uncachedPromptTokens: uncached,
        prefillAheadTokens: 0,
        loadAtDispatch: 0,
      });
    }
    clock += 50;
    expect(s.predictTtftMs('gpu-0', 2000)!).toBeGreaterThan(before * 2.2);
  });

  it('bad token counts cannot poison the counters; unknown backends are not counted', () => {
    const s = make();
    const l = s.lease('gpu-0', { promptTokens: Number.NaN, expectedOutputTokens: -5 });
    expect(s.inflight('gpu-0')).toEqual({
      requests: 1,
      promptTokens: 0,
      expectedOutputTokens: 0,
      pendingPrefillTokens: 0,
    });
    l.end();
    const ghost = s.lease('nope', { promptTokens: 10, expectedOutputTokens: 10 });
    ghost.end();
    expect(s.inflight('nope').requests).toBe(0);
    expect(s.backendView('nope')).toBeUndefined();
  });

  it("a reload's classes are the ones tracked: windows of removed classes go, so renames never fill the cap", () => {
    const s = make();
    observe(s, sample({ class: 'old', ttftMs: 100 }));
    observe(s, sample({ class: 'kept', ttftMs: 200 }));
    s.retainClasses(new Set(['kept']));
    const v = s.backendView('gpu-0')!;
    expect(Object.keys(v.byClass)).toEqual(['kept']);
    // A request of the removed class still running when the reload came makes no window as it ends.
    observe(s, sample({ class: 'old', ttftMs: 100 }));
    expect(Object.keys(s.backendView('gpu-0')!.byClass)).toEqual(['kept']);
    // Many reloads, each renaming the class: the last one's samples are still recorded (past
    // MAX_CLASSES windows, a new class's would be dropped).
    for (let i = 0; i < 100; i++) {
      s.retainClasses(new Set(['kept', `renamed-${i}`]));
      observe(s, sample({ class: `renamed-${i}`, ttftMs: 300 }));
    }
    expect(s.backendView('gpu-0')!.byClass['renamed-99']?.ttft.count).toBe(1);
    expect(Object.keys(s.backendView('gpu-0')!.byClass).sort()).toEqual(['kept', 'renamed-99']);
  });

  it('per-class windows give percentiles of the recorded samples, and an all-classes view', () => {
    const s = make();
    for (let i = 1; i <= 100; i++) observe(s, sample({ ttftMs: i * 10, tpotMs: i, queueMs: i / 10 }));
    for (let i = 0; i < 50; i++) observe(s, sample({ class: 'batch', ttftMs: 5_000, tpotMs: null }));
    const v = s.backendView('gpu-0')!;
    const inter = v.byClass.interactive!;
    expect(inter.ttft.count).toBe(100);
    expect(inter.ttft.p50!).toBeGreaterThan(500 * 0.95);
    expect(inter.ttft.p50!).toBeLessThan(500 * 1.05);
    expect(inter.ttft.p99!).toBeGreaterThan(990 * 0.95);
    expect(inter.ttft.p99!).toBeLessThan(990 * 1.05);
    expect(inter.tpot.p90!).toBeGreaterThan(90 * 0.95);
    expect(inter.tpot.p90!).toBeLessThan(90 * 1.05);
    expect(inter.queue.mean).toBeCloseTo(5.05, 6);
    expect(inter.requests).toBe(100);
    expect(inter.promptTokens).toBe(80_000);
    expect(v.byClass.batch?.tpot.count).toBe(0);
    expect(v.latency.ttft.count).toBe(150);
    // A third of the samples are 5 s: the all-classes P90 is one of them.
    expect(v.latency.ttft.p90!).toBeGreaterThan(5_000 * 0.95);
    expect(s.backendView('gpu-1')?.latency.ttft.count).toBe(0);
    expect(s.backendView('gpu-1')?.latency.ttft.p99).toBeNull();
  });

  it('samples slide out of the window as the clock advances', () => {
    const s = make({ bucketMs: 1000, buckets: 10 });
    observe(s, sample({ ttftMs: 100 }));
    clock += 5_000;
    observe(s, sample({ ttftMs: 300 }));
    expect(s.backendView('gpu-0')?.latency.ttft.count).toBe(2);
    clock += 5_000;
    const v = s.backendView('gpu-0')!;
    expect(v.latency.ttft.count).toBe(1);
    expect(v.latency.ttft.mean).toBe(300);
    clock += 5_000;
    expect(s.backendView('gpu-0')?.latency.ttft.count).toBe(0);
    expect(s.view().windowMs).toBe(10_000);
  });

  it('fits recover a backend’s prefill rate and decode slope, and predict from them', () => {
    const s = make();
    const rand = rng(42);
    for (let i = 0; i < 400; i++) {
      clock += 50;
      const uncached = Math.floor(rand() * 3000);
      const load = Math.floor(rand() * 20);
      const queueMs = rand() * 30;
      // 25 ms + 0.1 ms/token (10,000 tok/s) + 3 ms per in-flight request; TPOT 12 ms + 0.8 ms/request.
      const after = (25 + 0.1 * uncached + 3 * load) * (1 + (rand() - 0.5) * 0.06);
      const tpot = (12 + 0.8 * load) * (1 + (rand() - 0.5) * 0.06);
      observe(
        s,
        sample({
          queueMs,
          ttftMs: queueMs + after,
          tpotMs: tpot,
          uncachedPromptTokens: uncached,
          loadAtDispatch: load,
        }),
      );
    }
    const r = s.backendView('gpu-0')!.rates;
    expect(r.prefillTokensPerS!).toBeGreaterThan(9_500);
    expect(r.prefillTokensPerS!).toBeLessThan(10_500);
    expect(r.ttft!.msPerLoad).toBeGreaterThan(2.7);
    expect(r.ttft!.msPerLoad).toBeLessThan(3.3);
    expect(r.tpot!.msPerLoad).toBeGreaterThan(0.75);
    expect(r.tpot!.msPerLoad).toBeLessThan(0.85);
    expect(r.tpot!.baseMs).toBeGreaterThan(11);
    expect(r.tpot!.baseMs).toBeLessThan(13);
    // The prediction reads the backend now: 10 in flight, each 1 uncached token still to prefill.
    const ten = Array.from({ length: 10 }, () =>
      s.lease('gpu-0', { promptTokens: 1, expectedOutputTokens: 1 }),
    );
    expect(s.predictTtftMs('gpu-0', 2000)!).toBeGreaterThan(256 * 0.95);
    expect(s.predictTtftMs('gpu-0', 2000)!).toBeLessThan(256 * 1.05);
    for (const l of ten) l.prefillDone();
    expect(s.predictTtftMs('gpu-0', 2000)!).toBeCloseTo(255, -1);
    for (const l of ten) l.end();
    expect(s.predictTpotMs('gpu-0', 5)!).toBeCloseTo(16, 0);
    // Load defaults to the backend's in-flight count: 0 now, 3 with three leases.
    const base = s.predictTpotMs('gpu-0')!;
    const leases = [1, 2, 3].map(() => s.lease('gpu-0', { promptTokens: 1, expectedOutputTokens: 1 }));
    expect(s.predictTpotMs('gpu-0')! - base).toBeCloseTo(3 * r.tpot!.msPerLoad, 6);
    for (const l of leases) l.end();
    expect(r.tpotNowMs).toBeCloseTo(base, 6);
    // Noise was ±3%: the recent prediction error says so (after the fit settled).
    expect(r.ttftError.mape!).toBeLessThan(0.1);
    expect(r.tpotError.mape!).toBeLessThan(0.1);
    expect(Math.abs(r.tpotError.bias!)).toBeLessThan(0.05);
  });

  it("the prefill pending on a backend drains at its fitted rate from when it was sent, never past the counters' count", () => {
    const s = make();
    const rand = rng(3);
    // gpu-0: 50 ms + 0.1 ms per prefill token (10 tokens per ms), at any load.
    for (let i = 0; i < 400; i++) {
      clock += 20;
      const uncached = 100 + Math.floor(rand() * 8000);
      observe(
        s,
        sample({
          backend: 'gpu-0',
          ttftMs: 50 + 0.1 * uncached,
          uncachedPromptTokens: uncached,
          loadAtDispatch: 0,
        }),
      );
    }
    const alone = s.predictTtftMs('gpu-0', 600)!;
    expect(alone).toBeCloseTo(110, -1);
    // A cold 7,000-token prompt sent at t.
    const cold = s.lease('gpu-0', {
      promptTokens: 7000,
      expectedOutputTokens: 100,
      uncachedPromptTokens: 7000,
    });
    expect(s.prefillAheadTokens('gpu-0')).toBe(7000);
    expect(s.predictTtftMs('gpu-0', 600)! - alone).toBeCloseTo(700, -1);
    // 300 ms later 3,000 of it are done: a follow-up with 600 tokens of its own waits for the rest.
    clock += 300;
    expect(s.prefillAheadTokens('gpu-0')).toBeCloseTo(4000, -2);
    expect(s.predictTtftMs('gpu-0', 600)! - alone).toBeCloseTo(400, -1);
    expect(s.inflight('gpu-0').pendingPrefillTokens).toBe(7000);
    // Past its prefill time nothing of it is ahead, though no first token has come yet; and that
    // idle time is no credit against the next prompt sent.
    clock += 1000;
    expect(s.prefillAheadTokens('gpu-0')).toBe(0);
    const next = s.lease('gpu-0', {
      promptTokens: 2000,
      expectedOutputTokens: 100,
      uncachedPromptTokens: 2000,
    });
    expect(s.prefillAheadTokens('gpu-0')).toBe(2000);
    cold.prefillDone();
    clock += 100;
    expect(s.prefillAheadTokens('gpu-0')).toBeCloseTo(1000, -2);
    next.end();
    expect(s.prefillAheadTokens('gpu-0')).toBe(0);
    cold.end();
  });

  it('prediction error rises when the backend changes speed', () => {
    const s = make();
    for (let i = 0; i < 100; i++) {
      clock += 100;
      observe(s, sample({ tpotMs: 10 + (i % 10), loadAtDispatch: i % 10 }));
    }
    const before = s.backendView('gpu-0')!.rates.tpotError.mape!;
    for (let i = 0; i < 20; i++) {
      clock += 100;
      observe(s, sample({ tpotMs: 3 * (10 + (i % 10)), loadAtDispatch: i % 10 }));
    }
    const after = s.backendView('gpu-0')!.rates.tpotError;
    expect(before).toBeLessThan(0.01);
    expect(after.mape!).toBeGreaterThan(0.1);
    expect(after.bias!).toBeLessThan(0); // predictions ran low
  });

  it('a clock stepped back does not freeze the fits', () => {
    const s = make();
    for (let i = 0; i < 50; i++) {
      clock += 100;
      observe(s, sample({ tpotMs: 10 + (i % 10), loadAtDispatch: i % 10 }));
    }
    const before = s.predictTpotMs('gpu-0', 5)!;
    clock -= 3_600_000;
    for (let i = 0; i < 50; i++) {
      clock += 100;
      observe(s, sample({ tpotMs: 10 * (10 + (i % 10)), loadAtDispatch: i % 10 }));
    }
    expect(s.predictTpotMs('gpu-0', 5)!).toBeGreaterThan(2 * before);
  });

  it('a backend with a few samples of one size borrows the fleet’s prefill rate; a well-sampled one keeps its own', () => {
    const s = make();
    const rand = rng(7);
    // gpu-0: 300 samples, 20 ms + 0.05 ms/token (20,000 tok/s).
    for (let i = 0; i < 300; i++) {
      clock += 20;
      observe(s, linear('gpu-0', 500 + Math.floor(rand() * 7000), 20, 0.05));
    }
    // gpu-1: three cold prompts of one size, nothing to tell a slope from. Alone they fit a flat
    // line (slope 0), and a prefill there would cost nothing.
    for (let i = 0; i < 3; i++) {
      clock += 20;
      observe(s, sample({ backend: 'gpu-1', queueMs: 0, ttftMs: 900 + i, uncachedPromptTokens: 6000 }));
    }
    clock += 100; // past the least time between two solves
    const own = s.prefillMs('gpu-0', 6000)!;
    expect(own).toBeGreaterThan(0.05 * 6000 * 0.97);
    expect(own).toBeLessThan(0.05 * 6000 * 1.03);
    // Borrowed: the fleet's prefill rate, at its own level (its samples' 900 ms at 6,000 tokens).
    const borrowed = s.prefillMs('gpu-1', 6000)!;
    expect(borrowed).toBeGreaterThan(0.05 * 6000 * 0.97);
    expect(borrowed).toBeLessThan(0.05 * 6000 * 1.03);
    expect(s.predictTtftMs('gpu-1', 6000)!).toBeCloseTo(901, 2); // the mean of 900, 901, 902
    expect(s.predictTtftMs('gpu-1', 12_000)! - s.predictTtftMs('gpu-1', 6000)!).toBeCloseTo(borrowed, 6);
    // Its sample count and prediction error stay its own.
    expect(s.backendView('gpu-1')!.rates.ttft!.samples).toBe(3);
    // The backend it borrowed from leaves, and nothing else changes: the prior goes with it.
    s.setBackends([{ name: 'gpu-1', url: 'http://127.0.0.1:2' }]);
    clock += 100;
    expect(s.prefillMs('gpu-1', 6000)).toBe(0);
  });

  it('backends with other bases and prompt sizes keep their own rates; an idle one keeps its own as the others go on', () => {
    const s = make();
    const rand = rng(9);
    // Both 0.1 ms per token. gpu-0: base 20 ms, long prompts; gpu-1: base 200 ms, short ones.
    const send = (backend: string, base: number, lo: number, span: number) =>
      observe(s, linear(backend, lo + Math.floor(rand() * span), base, 0.1));
    for (let i = 0; i < 400; i++) {
      clock += 50;
      send('gpu-0', 20, 2000, 4000);
      send('gpu-1', 200, 200, 1000);
    }
    clock += 100;
    const near = (x: number, to: number) => {
      expect(x).toBeGreaterThan(to * 0.98);
      expect(x).toBeLessThan(to * 1.02);
    };
    near(s.prefillMs('gpu-0', 1000)!, 100);
    near(s.prefillMs('gpu-1', 1000)!, 100);
    // gpu-1 idle for ten minutes (ten half-lives) while gpu-0 goes on at 0.05 ms per token.
    for (let i = 0; i < 1200; i++) {
      clock += 500;
      observe(s, linear('gpu-0', 2000 + Math.floor(rand() * 4000), 20, 0.05));
    }
    clock += 100;
    near(s.prefillMs('gpu-0', 1000)!, 50);
    near(s.prefillMs('gpu-1', 1000)!, 100);
  });

  it('no prediction before enough samples', () => {
    const s = make();
    expect(s.predictTtftMs('gpu-0', 100)).toBeNull();
    expect(s.predictTpotMs('gpu-0')).toBeNull();
    expect(s.backendView('gpu-0')!.rates.prefillTokensPerS).toBeNull();
    expect(s.predictTtftMs('unknown', 100)).toBeNull();
  });

  it('setBackends adds new backends and forgets removed ones; status is never degraded', async () => {
    const s = make();
    observe(s, sample({ backend: 'gpu-1' }));
    s.setBackends([BACKENDS[0]!, { name: 'gpu-2', url: 'http://127.0.0.1:3' }]);
    expect(s.view().backends.map((b) => b.name)).toEqual(['gpu-0', 'gpu-2']);
    expect(s.backendView('gpu-1')).toBeUndefined();
    s.setBackends(BACKENDS);
    expect(s.backendView('gpu-1')?.latency.ttft.count).toBe(0);
    expect(s.status()).toMatchObject({ store: 'memory', degraded: false, peers: 0 });
    await expect(s.ready()).resolves.toBeUndefined();
    expect(s.backendView('gpu-0')?.telemetry).toBeNull();
  });

  it('a change of the block size prompts are hashed at empties the prefix index before the first new block', async () => {
    let size = 16;
    const s = createLiveState(
      { store: 'memory' },
      { backends: BACKENDS, scrape: false, blockSizeTokens: () => size },
    );
    try {
      s.prefixInsert('gpu-0', [1, 2, 3, 4]);
      s.prefixInsert('gpu-1', [5, 6]);
      s.prefixInsert('gpu-0', [1, 2, 3, 4, 7]);
      expect(s.prefixSize('gpu-0').blocks).toBe(5);
      // Nothing scraped here: the capacity rests on an assumed KV cache, and says so.
      expect(s.prefixCapacityAssumed('gpu-0')).toBe(true);
      // A reload to 64: the blocks hashed at 16 go; the new one is the only block held.
      size = 64;
      s.prefixInsert('gpu-0', [9]);
      expect(s.prefixSize('gpu-0').blocks).toBe(1);
      expect(s.prefixSize('gpu-1').blocks).toBe(0);
      expect(s.prefixMatch('gpu-0', [1, 2, 3, 4])).toBe(0);
      expect(s.prefixMatch('gpu-0', [9])).toBe(1);
      // A request hashed at 16 before the reload and sent after it: its blocks stay out.
      s.prefixInsert('gpu-1', [1, 2, 3], 16);
      expect(s.prefixSize('gpu-1').blocks).toBe(0);
      s.prefixInsert('gpu-1', [10, 11], 64);
      expect(s.prefixSize('gpu-1').blocks).toBe(2);
    } finally {
      await s.close();
    }
  });

  it('a backend given a new URL starts afresh: nothing learnt, no cached blocks, nothing in flight', () => {
    const s = make();
    for (const b of ['gpu-0', 'gpu-1']) {
      observe(s, sample({ backend: b }));
      s.prefixInsert(b, [11, 12, 13]);
      s.lease(b, { promptTokens: 10, expectedOutputTokens: 5 });
    }
    s.setBackends([BACKENDS[0]!, { name: 'gpu-1', url: 'http://127.0.0.1:9' }]);
    expect(s.backendView('gpu-1')?.latency.ttft.count).toBe(0);
    expect(s.prefixSize('gpu-1').blocks).toBe(0);
    expect(s.load('gpu-1')).toBe(0);
    // The backend whose URL stayed keeps all of it.
    expect(s.backendView('gpu-0')?.latency.ttft.count).toBe(1);
    expect(s.prefixSize('gpu-0').blocks).toBe(3);
    expect(s.load('gpu-0')).toBe(1);
  });

  it('a backend removed while requests run and added back counts them until they end', () => {
    const s = make();
    const running = s.lease('gpu-1', {
      promptTokens: 100,
      expectedOutputTokens: 10,
      uncachedPromptTokens: 100,
    });
    s.setBackends([BACKENDS[0]!]);
    s.setBackends(BACKENDS);
    expect(s.load('gpu-1')).toBe(1);
    expect(s.inflight('gpu-1').pendingPrefillTokens).toBe(100);
    // Its prefill is still ahead of the next request there (no fit: whole, not drained).
    expect(s.prefillAheadTokens('gpu-1')).toBe(100);
    running.end();
    expect(s.load('gpu-1')).toBe(0);
    // Added back at another URL, it is another server: the old requests are not on it.
    const other = s.lease('gpu-1', { promptTokens: 1, expectedOutputTokens: 1 });
    s.setBackends([BACKENDS[0]!]);
    s.setBackends([BACKENDS[0]!, { name: 'gpu-1', url: 'http://127.0.0.1:9' }]);
    expect(s.load('gpu-1')).toBe(0);
    other.end();
    expect(s.load('gpu-1')).toBe(0);
  });
});
