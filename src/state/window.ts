// A sliding window of one backend × class: TTFT, TPOT and queue-time histograms plus request and
// token counters, as a ring of fixed-width time buckets (default 60 × 1 s).
//
// Invariant: `total` always equals the sum of the buckets whose epoch lies inside the window as of
// the last advance(); recording is O(1) and an expiring bucket is subtracted bin by bin, so reading
// the window never walks the ring.

import { binIndex, Histogram } from './histogram.ts';

export const METRICS = ['ttft', 'tpot', 'queue'] as const;
export type LatencyMetric = (typeof METRICS)[number];

export interface WindowCounters {
  requests: number;
  promptTokens: number;
  completionTokens: number;
}

export interface WindowSample {
  ttftMs: number | null;
  tpotMs: number | null;
  queueMs: number | null;
  promptTokens: number;
  completionTokens: number;
}

interface SparseSeries {
  bins: Map<number, number>;
  sum: number;
}

interface Bucket {
  series: Record<LatencyMetric, SparseSeries>;
  counters: WindowCounters;
}

export interface WindowTotals {
  hist: Record<LatencyMetric, Histogram>;
  counters: WindowCounters;
}

export function emptyTotals(): WindowTotals {
  return {
    hist: { ttft: new Histogram(), tpot: new Histogram(), queue: new Histogram() },
    counters: { requests: 0, promptTokens: 0, completionTokens: 0 },
  };
}

export class SlidingWindow {
  readonly total = emptyTotals();
  readonly #ring: Bucket[];
  readonly #bucketMs: number;
  /** Epoch of the newest bucket the window has advanced to. */
  #epoch = Number.NEGATIVE_INFINITY;

  constructor(bucketMs: number, buckets: number) {
    this.#bucketMs = bucketMs;
    this.#ring = Array.from({ length: buckets }, () => ({
      series: {
        ttft: { bins: new Map(), sum: 0 },
        tpot: { bins: new Map(), sum: 0 },
        queue: { bins: new Map(), sum: 0 },
      },
      counters: { requests: 0, promptTokens: 0, completionTokens: 0 },
    }));
  }

  record(now: number, s: WindowSample): void {
    const bucket = this.#bucketAt(now);
    this.#observe(bucket, 'ttft', s.ttftMs);
    this.#observe(bucket, 'tpot', s.tpotMs);
    this.#observe(bucket, 'queue', s.queueMs);
    bucket.counters.requests++;
    bucket.counters.promptTokens += s.promptTokens;
    bucket.counters.completionTokens += s.completionTokens;
    this.total.counters.requests++;
    this.total.counters.promptTokens += s.promptTokens;
    this.total.counters.completionTokens += s.completionTokens;
  }

  /** Drops the buckets that slid out of the window as of `now`. */
  advance(now: number): void {
    const epoch = Math.floor(now / this.#bucketMs);
    const n = this.#ring.length;
    if (epoch <= this.#epoch) {
      // Invariant: a wall clock stepped back by more than the window (an NTP step, a restored VM)
      // starts the window afresh. Otherwise nothing would leave it until the clock caught up with
      // the newest bucket again: stale samples for as long as the step.
      if (epoch < this.#epoch - n) {
        for (const bucket of this.#ring) this.#expire(bucket);
        this.#epoch = epoch;
      }
      return;
    }
    // Only the slots that the new epochs map to can hold expired data, at most the whole ring.
    const from = Math.max(this.#epoch + 1, epoch - n + 1);
    for (let e = from; e <= epoch; e++) this.#expire(this.#ring[mod(e, n)] as Bucket);
    this.#epoch = epoch;
  }

  get empty(): boolean {
    return this.total.counters.requests === 0;
  }

  #bucketAt(now: number): Bucket {
    this.advance(now);
    const epoch = Math.floor(now / this.#bucketMs);
    // A sample stamped before the newest bucket (a caller's clock read earlier) counts in the
    // newest one rather than reopening an expired slot.
    const e = Math.max(epoch, this.#epoch);
    return this.#ring[mod(e, this.#ring.length)] as Bucket;
  }

  #observe(bucket: Bucket, metric: LatencyMetric, ms: number | null): void {
    if (ms === null || !Number.isFinite(ms)) return;
    const v = Math.max(0, ms);
    const bin = binIndex(v);
    const series = bucket.series[metric];
    series.bins.set(bin, (series.bins.get(bin) ?? 0) + 1);
    series.sum += v;
    this.total.hist[metric].add(bin, 1, v);
  }

  /** Subtracts the slot's old contents from the total and empties it for a new epoch. */
  #expire(bucket: Bucket): void {
    for (const metric of METRICS) {
      const series = bucket.series[metric];
      const hist = this.total.hist[metric];
      let n = 0;
      for (const [bin, c] of series.bins) {
        hist.add(bin, -c, 0);
        n += c;
      }
      if (n > 0) hist.add(0, 0, -series.sum);
      series.bins.clear();
      series.sum = 0;
    }
    const c = bucket.counters;
    this.total.counters.requests -= c.requests;
    this.total.counters.promptTokens -= c.promptTokens;
    this.total.counters.completionTokens -= c.completionTokens;
    c.requests = 0;
    c.promptTokens = 0;
    c.completionTokens = 0;
  }
}

function mod(a: number, n: number): number {
  return ((a % n) + n) % n;
}
