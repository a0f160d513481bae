// The pure pieces under simulated time: outlier ejection arithmetic, the retry budget, TPOT.
import { describe, expect, it } from 'vitest';
import { assemblable } from '../../src/upstream/assemble.ts';
import { DecodeMeter, gapStats, TokenClock } from '../../src/upstream/measure.ts';

const medianGapMs = (meters: DecodeMeter[]) => gapStats(meters)?.medianMs ?? null;

/** A stream's token events at `times` on a clock that feeds a fresh meter, finished at `endedAt`. */
function metered(times: number[], endedAt: number, completionTokens: number) {
  const m = new DecodeMeter();
  const c = new TokenClock(0, m);
  for (const t of times) c.token(t);
  return { m, l: c.finish(endedAt, completionTokens) };
}

import { maxEjected, OutlierDetector } from '../../src/upstream/outlier.ts';
import { RetryBudget } from '../../src/upstream/retry-budget.ts';

describe('OutlierDetector', () => {
  const opts = {
    consecutiveFailures: 3,
    baseEjectionMs: 1_000,
    maxEjectionMs: 2_500,
    maxEjectionPercent: 10,
  };

  it('ejects for base × n, capped, and a success in between resets the streak', () => {
    let now = 0;
    const o = new OutlierDetector(opts, () => now);
    const yes = () => true;
    expect([o.failure(yes), o.failure(yes)]).toEqual([null, null]);
    o.success();
    expect([o.failure(yes), o.failure(yes), o.failure(yes)]).toEqual([null, null, 1_000]);
    expect(o.ejected()).toBe(true);
    now = 1_000;
    expect(o.ejected()).toBe(false);
    expect([o.failure(yes), o.failure(yes), o.failure(yes)]).toEqual([null, null, 2_000]);
    now = 3_000;
    expect([o.failure(yes), o.failure(yes), o.failure(yes)]).toEqual([null, null, 2_500]);
    expect(o.ejections).toBe(3);
  });

  it('successes after an ejection shorten the next one; the cap can refuse an ejection', () => {
    let now = 0;
    const o = new OutlierDetector(opts, () => now);
    for (let i = 0; i < 3; i++) o.failure(() => true);
    now = 5_000;
    o.success();
    expect(o.ejections).toBe(0);
    for (let i = 0; i < 5; i++) expect(o.failure(() => false)).toBeNull();
    expect(o.ejected()).toBe(false);
  });

  it('a flapping backend is ejected for longer each time; failures during an ejection are not counted', () => {
    let now = 0;
    const o = new OutlierDetector(opts, () => now);
    const yes = () => true;
    const burst = () => [o.failure(yes), o.failure(yes), o.failure(yes)];
    expect(burst()).toEqual([null, null, 1_000]);
    // Requests sent before the ejection fail during it: nothing counted.
    now = 500;
    expect([o.failure(yes), o.failure(yes)]).toEqual([null, null]);
    // Back, it answers once, then fails again: the multiplier did not decay on that one success.
    now = 1_000;
    o.success();
    expect(o.consecutiveFailures).toBe(0);
    expect(burst()).toEqual([null, null, 2_000]);
    // After a base ejection time of serving, one success takes a step off.
    now = 3_000 + 1_000;
    o.success();
    expect(o.ejections).toBe(1);
  });

  it('an engine restart ends a first ejection only; a later one is served whole', () => {
    let now = 0;
    const o = new OutlierDetector(opts, () => now);
    const yes = () => true;
    const burst = () => [o.failure(yes), o.failure(yes), o.failure(yes)];
    expect(burst()).toEqual([null, null, 1_000]);
    now = 200;
    expect(o.engineRestarted()).toBe(true);
    expect(o.ejected()).toBe(false);
    // The new process fails as the old one did: ejected again, for twice as long, and a restart
    // (one that keeps crashing) no longer ends it.
    expect(burst()).toEqual([null, null, 2_000]);
    now = 300;
    expect(o.engineRestarted()).toBe(false);
    expect(o.ejected()).toBe(true);
    now = 2_300;
    expect(o.ejected()).toBe(false);
  });

  it('an ejection ended early decays the multiplier from then, as one that ran out does', () => {
    let now = 0;
    const o = new OutlierDetector(opts, () => now);
    for (let i = 0; i < 3; i++) o.failure(() => true, true);
    expect(o.ejections).toBe(1);
    // Its failures were failures to reach it: a passing probe ends it 100 ms in, not at 1,000.
    now = 100;
    expect(o.probePassed()).toBe(true);
    // A base ejection time of serving counted from the early end takes the step off.
    now = 1_100;
    o.success();
    expect(o.ejections).toBe(0);
    for (let i = 0; i < 3; i++) o.failure(() => true);
    now = 1_200;
    expect(o.engineRestarted()).toBe(true);
    now = 2_200;
    o.success();
    expect(o.ejections).toBe(0);
  });

  it('allows max(1, floor(share × n)) ejected backends', () => {
    expect([maxEjected(1, 10), maxEjected(4, 10), maxEjected(20, 10), maxEjected(3, 34)]).toEqual([
      1, 1, 2, 1,
    ]);
  });
});

describe('RetryBudget', () => {
  it('allows max(minRetries, ratio × active) retries in flight', () => {
    let active = 20;
    const b = new RetryBudget({ ratio: 0.2, minRetries: 3 }, () => active);
    expect([b.tryAcquireRetry(), b.tryAcquireRetry(), b.tryAcquireRetry(), b.tryAcquireRetry()]).toEqual([
      true,
      true,
      true,
      true,
    ]);
    expect(b.tryAcquireRetry()).toBe(false);
    b.releaseRetry();
    expect(b.tryAcquireRetry()).toBe(true);
    active = 2;
    b.releaseRetry();
    expect(b.tryAcquireRetry()).toBe(false); // 4 in flight, cap now max(3, 0)
  });
});

describe('TokenClock', () => {
  it('follows vLLM: TTFT from the request start, TPOT over completion tokens − 1, ITL per chunk', () => {
    const c = new TokenClock(100);
    for (const t of [150, 160, 175, 190]) c.token(t);
    const l = c.finish(200, 7);
    expect(l).toMatchObject({
      ttftMs: 50,
      e2eMs: 100,
      itlMs: [10, 15, 15],
    });
    expect(l.tpotMs).toBeCloseTo(40 / 6, 10);
    expect(new TokenClock(0).finish(5, 3).tpotMs).toBeNull();
  });

  it('calls a decode whose every token came within a read of the first unseen: its TPOT is no pace', () => {
    // One read handled chunk by chunk, microseconds apart: 5 tokens in 0.2 ms.
    const read = new TokenClock(100);
    for (const t of [150, 150.05, 150.1, 150.15, 150.2]) read.token(t);
    const r = read.finish(151, 5);
    expect(r.tpotMs).toBeCloseTo(0.05, 10);
    expect(r.decodeUnseen).toBe(true);
    // A decode of real steps, however short, is seen: 2 tokens a step of 1 ms apart.
    const paced = new TokenClock(100);
    for (const t of [150, 151]) paced.token(t);
    expect(paced.finish(152, 2)).toMatchObject({ tpotMs: 1, decodeUnseen: false });
    // No TPOT, nothing unseen: a single token.
    const one = new TokenClock(100);
    one.token(150);
    expect(one.finish(151, 1)).toMatchObject({ tpotMs: null, decodeUnseen: false });
    // Several sequences read together alike.
    const many = new TokenClock(100, null, 2);
    for (const [t, seq] of [
      [150, 0],
      [150, 1],
      [150.1, 0],
      [150.1, 1],
    ] as const)
      many.token(t, seq);
    const m = many.finish(151, 4);
    expect(m.tpotMs).toBeCloseTo(0.1, 10);
    expect(m.decodeUnseen).toBe(true);
  });

  it('times a stream of several sequences per sequence, and gives neither ITL nor meter gaps', () => {
    const m = new DecodeMeter();
    const c = new TokenClock(100, m, 3);
    // Three sequences a step apart (10 ms), their events of one step together: 4 tokens each,
    // sequence 2 done a step early (3 tokens), 11 tokens in all.
    for (const [t, seq] of [
      [150, 0],
      [150, 1],
      [150, 2],
      [160, 0],
      [160, 1],
      [160, 2],
      [170, 0],
      [170, 1],
      [170, 2],
      [180, 0],
      [180, 1],
    ] as const)
      c.token(t, seq);
    const l = c.finish(190, 11);
    expect(l.ttftMs).toBe(50);
    // (30 + 30 + 20) ms over the 11 − 3 tokens after each sequence's first.
    expect(l.tpotMs).toBeCloseTo(80 / 8, 10);
    expect(l.itlMs).toEqual([]);
    expect(m.gaps).toBe(0);
    // An index outside the sequences asked for is timed with the stream, not as a sequence.
    const odd = new TokenClock(0, null, 2);
    odd.token(10, 0);
    odd.token(20, 1);
    odd.token(30, 7);
    odd.token(40, 1);
    expect(odd.finish(50, 4)).toMatchObject({ ttftMs: 10, tpotMs: 20 / 2 });
    // vLLM's role chunks of a chat, one per choice at the first token of any: the stream's first
    // token, but no choice's own first output. Choice 1's output starts 20 ms later.
    const chat = new TokenClock(0, null, 2);
    chat.token(10, 0, false);
    chat.token(10, 1, false);
    for (const [t, seq] of [
      [10, 0],
      [20, 0],
      [30, 1],
      [30, 0],
      [40, 1],
    ] as const)
      chat.token(t, seq);
    // (20 + 10) ms over the 5 − 2 tokens after each choice's first.
    expect(chat.finish(50, 5)).toMatchObject({ ttftMs: 10, tpotMs: 30 / 3 });
    // A sequence that never showed a token: no per-sequence figure.
    const missing = new TokenClock(0, null, 2);
    missing.token(10, 0);
    missing.token(20, 0);
    expect(missing.finish(30, 3).tpotMs).toBeNull();
  });

  it("feeds each gap to the backend's meter", () => {
    const { m } = metered([10, 30, 60, 100], 110, 4);
    expect(m.gaps).toBe(3);
    expect(medianGapMs([m])).toBeCloseTo(30, -0.5);
  });

  it('spreads the wall time over events read together, and gives the meter no gap of 0', () => {
    // The role chunk and the first token in one read; then one event 40 ms later, two events
    // 40 ms after that (20 ms each), two 80 ms after those (40 ms each).
    const { m, l } = metered([10, 10, 50, 90, 90, 170, 170], 180, 6);
    expect(l.itlMs).toEqual([0, 40, 40, 0, 80, 0]); // the events as read, for the ITL figures
    expect(m.gaps).toBe(5);
    expect(m.totalMs).toBe(160);
    expect(medianGapMs([m])).toBeCloseTo(40, -0.5);
  });

  it('takes events handled microseconds apart (one read, one HTTP chunk each) as read together', () => {
    // A loop that lagged by three 40 ms steps handles their events 10 µs apart.
    const { m } = metered([10, 130, 130.01, 130.02], 140, 4);
    expect(m.gaps).toBe(3);
    expect(medianGapMs([m])).toBeCloseTo(40, -0.5);
  });

  it('does not meter the gap across a pause for a slow client', () => {
    const m = new DecodeMeter();
    const c = new TokenClock(0, m);
    c.token(10);
    c.token(50);
    c.paused();
    c.token(29_050); // the client read again after 29 s
    c.token(29_090);
    c.finish(29_100, 4);
    expect([m.gaps, m.totalMs]).toEqual([2, 80]);
  });
});

describe('DecodeMeter and the median gap', () => {
  it('reads a gap back to within half its bin (2.5%) alone, from a millisecond to minutes, and its mean exactly', () => {
    for (const ms of [1, 7.3, 20, 40, 123.4, 1_000, 60_000]) {
      const m = new DecodeMeter();
      m.add(ms);
      expect(Math.abs(medianGapMs([m])! / ms - 1)).toBeLessThan(0.025);
      expect(gapStats([m])!.meanMs).toBe(ms);
    }
  });

  it('is the typical gap, whatever a few long ones are: a mean of these would be 108 ms', () => {
    const m = new DecodeMeter();
    for (let i = 0; i < 20; i++) m.add(20);
    for (let i = 0; i < 6; i++) m.add(400);
    expect(medianGapMs([m])).toBeCloseTo(20, -0.5);
    // The lower median of an even count; and over several periods together.
    const a = new DecodeMeter();
    const b = new DecodeMeter();
    a.add(10);
    b.add(90);
    expect(medianGapMs([a, b])).toBeCloseTo(10, -0.5);
    b.add(90);
    expect(medianGapMs([a, b])).toBeCloseTo(90, -0.5);
    expect(medianGapMs([new DecodeMeter()])).toBeNull();
  });

  it('drainInto moves a period out and starts afresh', () => {
    const m = new DecodeMeter();
    const period = new DecodeMeter();
    m.add(5);
    m.add(5);
    period.add(700); // what the period held before is replaced, not added to
    m.drainInto(period);
    expect([m.gaps, medianGapMs([m])]).toEqual([0, null]);
    expect(period.gaps).toBe(2);
    expect(medianGapMs([period])).toBeCloseTo(5, -0.5);
  });
});

describe('assemblable', () => {
  const chat = { model: 'm', messages: [] };
  it("the prompt's logprobs pass the body through, a 0 included (it asks for the prompt's own); a completion's output logprobs are assembled, a chat's (a boolean to vLLM: 0 asks nothing) pass through", () => {
    expect(assemblable('completion', { model: 'm', prompt: 'p', prompt_logprobs: 0 })).toBe(false);
    expect(assemblable('chat', { ...chat, prompt_logprobs: 0 })).toBe(false);
    expect(assemblable('chat', { ...chat, prompt_logprobs: null })).toBe(true);
    expect(assemblable('completion', { model: 'm', prompt: 'p', logprobs: 0 })).toBe(true);
    expect(assemblable('chat', { ...chat, logprobs: true, top_logprobs: 3 })).toBe(false);
    expect(assemblable('chat', { ...chat, logprobs: 0, top_logprobs: 0 })).toBe(true);
    expect(assemblable('chat', { ...chat, tools: [{ type: 'function', function: { name: 'f' } }] })).toBe(
      true,
    );
    expect(assemblable('chat', { ...chat, functions: [{ name: 'f' }] })).toBe(false);
    expect(assemblable('completion', { model: 'm', prompt: 'p', logprobs: null, echo: false })).toBe(true);
  });
});
