import { describe, expect, it } from 'vitest';
import { BIN_COUNT, binIndex, Histogram, quantiles } from '../../src/state/histogram.ts';
import { SlidingWindow } from '../../src/state/window.ts';
import { rng } from '../helpers/rng.ts';

/** Exact q-quantile of sorted values, by the same definition (smallest v with share ≥ q below). */
function exact(sorted: number[], q: number): number {
  return sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)] as number;
}

function histogramOf(values: number[]): Histogram {
  const h = new Histogram();
  for (const v of values) h.add(binIndex(v), 1, v);
  return h;
}

describe('log-binned histogram', () => {
  it('bins are monotonic and cover 0 ms to beyond 10 minutes', () => {
    let prev = -1;
    for (const v of [0, 0.5, 1, 1.04, 1.06, 10, 100, 1_000, 59_999, 599_999, 600_000, 1e9]) {
      const b = binIndex(v);
      expect(b).toBeGreaterThanOrEqual(prev);
      expect(b).toBeLessThan(BIN_COUNT);
      prev = b;
    }
    expect(binIndex(Number.NaN)).toBe(0);
    expect(binIndex(-5)).toBe(0);
    expect(binIndex(1e9)).toBe(BIN_COUNT - 1);
  });

  it('P50/P90/P99 lie within the 5% bin width of the exact quantiles', () => {
    const rand = rng(7);
    // Log-normal-ish latencies from ~5 ms to ~20 s.
    const values = Array.from({ length: 5000 }, () => Math.exp(1.5 + rand() * 8.5));
    const sorted = [...values].sort((a, b) => a - b);
    const q = quantiles([histogramOf(values)]);
    expect(q.count).toBe(5000);
    expect(q.mean).toBeCloseTo(values.reduce((a, b) => a + b, 0) / values.length, 6);
    for (const [got, p] of [
      [q.p50, 0.5],
      [q.p90, 0.9],
      [q.p99, 0.99],
    ] as const) {
      const want = exact(sorted, p);
      expect(Math.abs((got as number) - want) / want).toBeLessThan(0.05);
    }
  });

  it('a known small sample set: 1..100 ms', () => {
    const q = quantiles([histogramOf(Array.from({ length: 100 }, (_, i) => i + 1))]);
    expect(q.p50 as number).toBeGreaterThan(50 * 0.95);
    expect(q.p50 as number).toBeLessThan(50 * 1.05);
    expect(q.p90 as number).toBeGreaterThan(90 * 0.95);
    expect(q.p90 as number).toBeLessThan(90 * 1.05);
    expect(q.p99 as number).toBeGreaterThan(99 * 0.95);
    expect(q.p99 as number).toBeLessThan(99 * 1.05);
  });

  it('merging is adding: quantiles of parts equal quantiles of the union', () => {
    const rand = rng(3);
    const a = Array.from({ length: 700 }, () => 10 + rand() * 90);
    const b = Array.from({ length: 300 }, () => 500 + rand() * 500);
    const split = quantiles([histogramOf(a), histogramOf(b)]);
    const union = quantiles([histogramOf([...a, ...b])]);
    expect(split).toEqual(union);
    const viaWire = new Histogram();
    expect(viaWire.addEncoded(histogramOf(a).encode())).toBe(true);
    expect(viaWire.addEncoded(histogramOf(b).encode())).toBe(true);
    expect(quantiles([viaWire]).p99).toBeCloseTo(union.p99 as number, 6);
  });

  it('rejects malformed wire data without applying any of it', () => {
    const h = new Histogram();
    expect(h.addEncoded([1, 5, BIN_COUNT + 3, 1])).toBe(false);
    expect(h.addEncoded([1, 5, 3])).toBe(false);
    expect(h.addEncoded('x')).toBe(false);
    expect(h.addEncoded([1, 5, 3, -1])).toBe(false);
    expect(h.count).toBe(0);
    expect(quantiles([h]).p50).toBeNull();
  });
});

describe('sliding window (injected clock)', () => {
  const sample = (ttftMs: number) => ({
    ttftMs,
    tpotMs: null,
    queueMs: 0,
    promptTokens: 10,
    completionTokens: 5,
  });

  it('keeps exactly the last N buckets and forgets older samples', () => {
    const w = new SlidingWindow(1000, 60);
    w.record(0, sample(100));
    w.record(30_500, sample(200));
    w.advance(59_999);
    expect(w.total.hist.ttft.count).toBe(2);
    expect(w.total.counters).toEqual({ requests: 2, promptTokens: 20, completionTokens: 10 });
    // Bucket 0 leaves when bucket 60 begins.
    w.advance(60_000);
    expect(w.total.hist.ttft.count).toBe(1);
    expect(quantiles([w.total.hist.ttft]).mean).toBe(200);
    w.advance(90_500);
    expect(w.total.hist.ttft.count).toBe(0);
    expect(w.total.hist.ttft.sum).toBe(0);
    expect(w.empty).toBe(true);
  });

  it('a wall clock stepped back by more than the window starts it afresh; a small step keeps it', () => {
    const w = new SlidingWindow(1000, 10);
    w.record(100_000, sample(50));
    w.record(99_500, sample(60));
    expect(w.total.hist.ttft.count).toBe(2);
    // An hour back: the old samples would otherwise stay until the clock reached 100 s again.
    w.record(100_000 - 3_600_000, sample(7));
    expect(w.total.hist.ttft.count).toBe(1);
    expect(quantiles([w.total.hist.ttft]).mean).toBe(7);
    // And it slides from there as usual.
    w.advance(100_000 - 3_600_000 + 10_000);
    expect(w.empty).toBe(true);
  });

  it('a long silence empties the window in one step and reuse starts clean', () => {
    const w = new SlidingWindow(1000, 10);
    for (let t = 0; t < 10_000; t += 100) w.record(t, sample(50));
    expect(w.total.hist.ttft.count).toBe(100);
    w.record(1_000_000, sample(7));
    expect(w.total.hist.ttft.count).toBe(1);
    expect(w.total.hist.queue.count).toBe(1);
    expect(quantiles([w.total.hist.ttft]).mean).toBe(7);
  });

  it('null and non-finite latencies are not samples, the request still counts', () => {
    const w = new SlidingWindow(1000, 60);
    w.record(0, { ttftMs: null, tpotMs: Number.NaN, queueMs: null, promptTokens: 3, completionTokens: 0 });
    expect(w.total.hist.ttft.count).toBe(0);
    expect(w.total.hist.tpot.count).toBe(0);
    expect(w.total.counters.requests).toBe(1);
  });

  it('a sample stamped before the newest bucket, within the window, counts in the newest, not in an older slot', () => {
    const w = new SlidingWindow(1000, 5);
    w.record(10_000, sample(1));
    // Stamped 4 s before (a clock read earlier): its own slot would leave the window first.
    w.record(6_000, sample(2));
    w.advance(14_999);
    expect(w.total.hist.ttft.count).toBe(2);
    w.advance(15_000);
    expect(w.total.hist.ttft.count).toBe(0);
  });
});
