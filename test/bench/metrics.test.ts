// metrics.ts against a hand-written request log. Every expected value is derived by hand in the
// comments (not by calling the code under test), following vLLM's calculate_metrics.
import { describe, expect, it } from 'vitest';
import type { RequestRecord } from '../../src/bench/client.ts';
import { computeMetrics, percentile } from '../../src/bench/metrics.ts';

function rec(
  index: number,
  startTime: number,
  ttft: number,
  itl: number[],
  latency: number,
  promptLen: number,
  outputLen: number,
  success = true,
): RequestRecord {
  return {
    index,
    requestId: `r${index}`,
    startTime,
    queueTime: 0,
    ttft,
    itl,
    latency,
    promptLen,
    outputLen,
    success,
    error: success ? '' : 'HTTP 500: boom',
    status: success ? 200 : 500,
    headers: {},
  };
}

// Times in seconds. Each successful request has one chunk per output token, and
// latency = ttft + Σ itl.
//   A: [0.0, 0.30)   ttft 0.10, itl 0.05 0.05 0.10, 100 in / 4 out, TPOT (0.3−0.1)/3 = 66.667 ms
//   B: [0.2, 0.60)   ttft 0.20, itl 0.15 0.05,      200 in / 3 out, TPOT (0.4−0.2)/2 = 100 ms
//   C: [0.3, 0.35)   ttft 0.05, no itl,             50 in / 1 out,  TPOT skipped (0 for goodput)
//   D: [0.8, 1.28)   ttft 0.40, itl .02 .03 .01 .02, 300 in / 5 out, TPOT 0.08/4 = 20 ms
//   E: failed at 1.5 (HTTP 500), 80-token prompt: excluded from every figure but `failed`.
const LOG: RequestRecord[] = [
  rec(0, 0.0, 0.1, [0.05, 0.05, 0.1], 0.3, 100, 4),
  rec(1, 0.2, 0.2, [0.15, 0.05], 0.4, 200, 3),
  rec(2, 0.3, 0.05, [], 0.05, 50, 1),
  rec(3, 0.8, 0.4, [0.02, 0.03, 0.01, 0.02], 0.48, 300, 5),
  rec(4, 1.5, 0, [], 0, 80, 0, false),
];
const DURATION = 2.0;

describe('computeMetrics on a recorded log', () => {
  const m = computeMetrics(LOG, DURATION, { percentiles: [50, 90, 99], slo: { ttft: 300, tpot: 50 } });

  it('counts and throughputs', () => {
    expect(m.completed).toBe(4);
    expect(m.failed).toBe(1);
    // 100 + 200 + 50 + 300 (the failed request's 80 is not counted)
    expect(m.totalInput).toBe(650);
    // 4 + 3 + 1 + 5
    expect(m.totalOutput).toBe(13);
    expect(m.requestThroughput).toBeCloseTo(4 / 2, 12); // 2.0
    expect(m.outputThroughput).toBeCloseTo(6.5, 12); // 13 / 2
    expect(m.totalTokenThroughput).toBeCloseTo(331.5, 12); // (650 + 13) / 2
  });

  it('goodput needs every target: meeting TTFT alone or TPOT alone is not good', () => {
    // ttft ≤ 300 ms and tpot ≤ 50 ms:
    //   A: 100 ✓, 66.7 ✗   B: 200 ✓, 100 ✗   C: 50 ✓, 0 ✓ (1 token)   D: 400 ✗, 20 ✓
    // → only C is good: 1 / 2 s = 0.5 req/s.
    expect(m.goodCompleted).toBe(1);
    expect(m.requestGoodput).toBeCloseTo(0.5, 12);
    // TTFT alone (≤ 300): A, B, C → 3 / 2 = 1.5.
    const ttftOnly = computeMetrics(LOG, DURATION, { percentiles: [99], slo: { ttft: 300 } });
    expect(ttftOnly.requestGoodput).toBeCloseTo(1.5, 12);
    // E2EL ≤ 350: A 300 ✓, B 400 ✗, C 50 ✓, D 480 ✗ → 2 / 2 = 1.0.
    const e2el = computeMetrics(LOG, DURATION, { percentiles: [99], slo: { e2el: 350 } });
    expect(e2el.requestGoodput).toBeCloseTo(1.0, 12);
    // A target equal to the value counts as met (value ≤ slo): TTFT ≤ 100 → A and C.
    const edge = computeMetrics(LOG, DURATION, { percentiles: [99], slo: { ttft: 100 } });
    expect(edge.goodCompleted).toBe(2);
  });

  it('goodput is null without an SLO', () => {
    const none = computeMetrics(LOG, DURATION, { percentiles: [99] });
    expect(none.requestGoodput).toBeNull();
  });

  it('TTFT: mean, median, population std, linear-interpolated percentiles', () => {
    // ms, sorted: 50 100 200 400; mean 750/4 = 187.5
    expect(m.ttft.mean).toBeCloseTo(187.5, 9);
    // median: rank 0.5·3 = 1.5 → 100 + 0.5·(200 − 100) = 150
    expect(m.ttft.median).toBeCloseTo(150, 9);
    // variance: (137.5² + 87.5² + 12.5² + 212.5²)/4 = 71875/4 = 17968.75 (ddof = 0)
    expect(m.ttft.std).toBeCloseTo(Math.sqrt(17968.75), 9); // 134.05
    // p50 = 150; p90: rank 2.7 → 200 + 0.7·200 = 340; p99: rank 2.97 → 200 + 0.97·200 = 394
    expect(m.ttft.percentiles).toHaveLength(3);
    expect(m.ttft.percentiles[0]?.[0]).toBe(50);
    expect(m.ttft.percentiles[0]?.[1]).toBeCloseTo(150, 9);
    expect(m.ttft.percentiles[1]?.[1]).toBeCloseTo(340, 9);
    expect(m.ttft.percentiles[2]?.[1]).toBeCloseTo(394, 9);
  });

  it('TPOT skips 1-token outputs', () => {
    // ms: 20, 200/3, 100 (C excluded); mean = 560/9 = 62.222
    expect(m.tpot.mean).toBeCloseTo(560 / 9, 9);
    expect(m.tpot.median).toBeCloseTo(200 / 3, 9);
    // deviations ×9: −380, 40, 340 → Σ² = 261600/81; /3 → variance 87200/81
    expect(m.tpot.std).toBeCloseTo(Math.sqrt(87200 / 81), 9); // 32.81
    // p99: rank 1.98 → 66.667 + 0.98·33.333 = 99.333
    expect(m.tpot.percentiles[2]?.[1]).toBeCloseTo(66.6666667 + 0.98 * 33.3333333, 5);
  });

  it('ITL pools every chunk gap of every successful request', () => {
    // ms, sorted: 10 20 20 30 50 50 50 100 150 (A: 50 50 100, B: 150 50, D: 20 30 10 20)
    expect(m.itl.mean).toBeCloseTo(480 / 9, 9); // 53.333
    expect(m.itl.median).toBeCloseTo(50, 9); // rank 4
    // deviations ×3 from 160: −130 −100 −100 −70 −10 −10 −10 140 290 → Σ² = 145800 → /9/9 = 1800
    expect(m.itl.std).toBeCloseTo(Math.sqrt(1800), 9); // 42.43
    // p90: rank 7.2 → 100 + 0.2·50 = 110; p99: rank 7.92 → 100 + 0.92·50 = 146
    expect(m.itl.percentiles[1]?.[1]).toBeCloseTo(110, 9);
    expect(m.itl.percentiles[2]?.[1]).toBeCloseTo(146, 9);
  });

  it('E2EL', () => {
    // ms, sorted: 50 300 400 480; mean 1230/4 = 307.5; median 300 + 0.5·100 = 350
    expect(m.e2el.mean).toBeCloseTo(307.5, 9);
    expect(m.e2el.median).toBeCloseTo(350, 9);
    // deviations: −257.5 −7.5 92.5 172.5 → Σ² = 104675 → /4 = 26168.75
    expect(m.e2el.std).toBeCloseTo(Math.sqrt(26168.75), 9);
    // p99: rank 2.97 → 400 + 0.97·80 = 477.6
    expect(m.e2el.percentiles[2]?.[1]).toBeCloseTo(477.6, 9);
  });

  it('peak concurrency treats intervals as half-open', () => {
    // A [0, .3) and B [.2, .6) overlap → 2. C starts at 0.3 exactly when A ends, so at 0.3 the
    // count is B + C = 2, not 3. D [.8, 1.28) overlaps nothing.
    expect(m.maxConcurrentRequests).toBe(2);
  });

  it('peak output tokens per second counts chunks in 1 s buckets from the first start', () => {
    // Chunk times: A .1 .15 .2 .3; B .4 .55 .6; C .35 → bucket 0 holds 8.
    // D 1.2 1.22 1.25 1.26 1.28 → bucket 1 holds 5.
    expect(m.maxOutputTokensPerS).toBe(8);
  });
});

describe('degenerate logs', () => {
  it('all failed: counts of 0, and no latency figure at all (null, where vLLM writes 0)', () => {
    const m = computeMetrics([rec(0, 0, 0, [], 0, 10, 0, false)], 1, { percentiles: [99] });
    expect(m.completed).toBe(0);
    expect(m.failed).toBe(1);
    for (const d of [m.ttft, m.tpot, m.itl, m.e2el])
      expect(d).toEqual({ mean: null, median: null, std: null, percentiles: [[99, null]] });
    expect(m.maxOutputTokensPerS).toBe(0);
    expect(m.maxConcurrentRequests).toBe(0);
  });

  it('percentile of one value is that value; of two interpolates', () => {
    expect(percentile([7], 99)).toBe(7);
    expect(percentile([0, 10], 25)).toBeCloseTo(2.5, 12);
    expect(percentile([0, 10], 100)).toBe(10);
    expect(percentile([0, 10], 0)).toBe(0);
  });
});
