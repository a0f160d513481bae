// Small measurements the benchmark scripts share.
import { readFileSync } from 'node:fs';

/** numpy's default (linear) percentile over sorted values; NaN (printed "NaN", never 0) when empty. */
export function percentile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const pos = (q / 100) * (sorted.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (pos - lo);
}

/** A process's CPU time so far (utime + stime from /proc, 10 ms ticks), in seconds. Linux only. */
export function cpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

/**
 * A process's main thread's CPU time so far (its event loop's, JavaScript's and the syscalls it
 * makes, without V8's and libuv's helper threads: garbage collection, compilation), in seconds.
 */
export function mainThreadCpuSeconds(pid: number): number {
  const f = readFileSync(`/proc/${pid}/task/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}

/**
 * The Poisson rate that holds `streams` requests in flight on average (Little's law): streams ÷
 * the mean request time of `records` (a warm-up's successful requests, times in seconds).
 */
export function poissonRate(
  records: readonly { success: boolean; latency: number }[],
  streams: number,
): number {
  const ok = records.filter((r) => r.success);
  return streams / (ok.reduce((sum, r) => sum + r.latency, 0) / ok.length);
}

/** runBench's load options: a closed loop of `streams`, or Poisson at `rate` (capped at 8 × streams). */
export function arrivals(streams: number, rate: number | undefined): { concurrency: number; rate?: number } {
  return rate === undefined ? { concurrency: streams } : { rate, concurrency: 8 * streams };
}
