// The figures of vLLM's serving benchmark (`calculate_metrics` in vllm/benchmarks/serve.py),
// computed from per-request records alone so they can be checked by hand:
// - only successful requests count toward tokens, latencies and throughputs;
// - TPOT per request = (latency − ttft)/(output_len − 1), only when output_len > 1; for goodput
//   such a request's TPOT is 0;
// - ITL pools every chunk gap of every request;
// - mean, median, population std (numpy ddof=0) and percentiles with numpy's default linear
//   interpolation; an empty list gives 0 everywhere (numpy on `[] or 0`);
// - peak output tokens/s counts one token per `choices` chunk in 1 s buckets from the first
//   start; peak concurrency is a sweep over half-open [start, start + latency) intervals.
import type { RequestRecord } from './client.ts';

export type MetricName = 'ttft' | 'tpot' | 'itl' | 'e2el';
export const METRIC_NAMES: readonly MetricName[] = ['ttft', 'tpot', 'itl', 'e2el'];

/** Service-level objectives in ms; a request is good when every given one holds (value ≤ slo). */
export interface Slo {
  ttft?: number;
  tpot?: number;
  e2el?: number;
}

/** Each figure is null when nothing was measured (no successful request, or none with a gap). */
export interface Distribution {
  mean: number | null;
  median: number | null;
  std: number | null;
  /** [percentile, value] in the order asked for. */
  percentiles: [number, number | null][];
}

export interface BenchMetrics {
  completed: number;
  failed: number;
  totalInput: number;
  totalOutput: number;
  requestThroughput: number;
  /** null without an SLO. */
  requestGoodput: number | null;
  /** Requests meeting every SLO (0 without an SLO). */
  goodCompleted: number;
  outputThroughput: number;
  totalTokenThroughput: number;
  maxOutputTokensPerS: number;
  maxConcurrentRequests: number;
  /** Each in milliseconds. */
  ttft: Distribution;
  tpot: Distribution;
  itl: Distribution;
  e2el: Distribution;
}

/** numpy.percentile with the default 'linear' method; p in [0, 100]. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = sorted[lo] as number;
  const b = sorted[hi] as number;
  return a + (b - a) * (rank - lo);
}

export function distribution(
  values: readonly number[],
  percentiles: readonly number[],
  scale = 1,
): Distribution {
  const xs = values.map((v) => v * scale).sort((a, b) => a - b);
  const n = xs.length;
  // Nothing measured is no figure, not a 0 that reads as a perfect latency (vLLM writes 0 here).
  if (n === 0) return { mean: null, median: null, std: null, percentiles: percentiles.map((p) => [p, null]) };
  const mean = xs.reduce((s, x) => s + x, 0) / n;
  const variance = xs.reduce((s, x) => s + (x - mean) ** 2, 0) / n;
  return {
    mean,
    median: percentile(xs, 50),
    std: Math.sqrt(variance),
    percentiles: percentiles.map((p) => [p, percentile(xs, p)]),
  };
}

function peakOutputTokensPerSecond(ok: readonly RequestRecord[]): number {
  if (ok.length === 0) return 0;
  let first = Number.POSITIVE_INFINITY;
  let last = Number.NEGATIVE_INFINITY;
  for (const r of ok) {
    first = Math.min(first, r.startTime);
    last = Math.max(last, r.startTime + r.latency);
  }
  const buckets = new Array<number>(Math.ceil(last - first) + 1).fill(0);
  for (const r of ok) {
    let t = r.startTime + r.ttft;
    const times = [t];
    for (const gap of r.itl) {
      t += gap;
      times.push(t);
    }
    for (const time of times) {
      const b = Math.floor(time - first);
      if (b >= 0 && b < buckets.length) buckets[b] = (buckets[b] as number) + 1;
    }
  }
  return buckets.reduce((m, x) => Math.max(m, x), 0);
}

function peakConcurrency(ok: readonly RequestRecord[]): number {
  const events: [number, number][] = [];
  for (const r of ok) events.push([r.startTime, 1], [r.startTime + r.latency, -1]);
  // At equal times an end sorts before a start: the intervals are half-open.
  events.sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  let now = 0;
  let peak = 0;
  for (const [, delta] of events) {
    now += delta;
    peak = Math.max(peak, now);
  }
  return peak;
}

/** A served request that met every target of `slo` (what goodput counts). */
export function meetsSlo(r: RequestRecord, slo: Slo): boolean {
  return r.success && isGood(r, r.outputLen > 1 ? (r.latency - r.ttft) / (r.outputLen - 1) : 0, slo);
}

function isGood(r: RequestRecord, tpot: number, slo: Slo): boolean {
  if (slo.ttft !== undefined && r.ttft * 1000 > slo.ttft) return false;
  if (slo.tpot !== undefined && tpot * 1000 > slo.tpot) return false;
  if (slo.e2el !== undefined && r.latency * 1000 > slo.e2el) return false;
  return true;
}

export function computeMetrics(
  records: readonly RequestRecord[],
  durationS: number,
  options: { percentiles: readonly number[]; slo?: Slo },
): BenchMetrics {
  const ok = records.filter((r) => r.success);
  const hasSlo = options.slo !== undefined && Object.values(options.slo).some((v) => v !== undefined);
  const tpots: number[] = [];
  let good = 0;
  for (const r of ok) {
    const tpot = r.outputLen > 1 ? (r.latency - r.ttft) / (r.outputLen - 1) : 0;
    if (r.outputLen > 1) tpots.push(tpot);
    if (hasSlo && isGood(r, tpot, options.slo as Slo)) good++;
  }
  const totalInput = ok.reduce((s, r) => s + r.promptLen, 0);
  const totalOutput = ok.reduce((s, r) => s + r.outputLen, 0);
  const p = options.percentiles;
  return {
    completed: ok.length,
    failed: records.length - ok.length,
    totalInput,
    totalOutput,
    requestThroughput: ok.length / durationS,
    requestGoodput: hasSlo ? good / durationS : null,
    goodCompleted: good,
    outputThroughput: totalOutput / durationS,
    totalTokenThroughput: (totalInput + totalOutput) / durationS,
    maxOutputTokensPerS: peakOutputTokensPerSecond(ok),
    maxConcurrentRequests: peakConcurrency(ok),
    ttft: distribution(
      ok.map((r) => r.ttft),
      p,
      1000,
    ),
    tpot: distribution(tpots, p, 1000),
    itl: distribution(
      ok.flatMap((r) => r.itl),
      p,
      1000,
    ),
    e2el: distribution(
      ok.map((r) => r.latency),
      p,
      1000,
    ),
  };
}
