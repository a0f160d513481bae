// Open-loop send schedule, as vLLM's `get_request` builds it: gaps drawn from
// Gamma(shape = burstiness, scale = 1 / (rate · burstiness)) (mean gap 1/rate; burstiness 1 is a
// Poisson process, below 1 burstier, above 1 more regular), accumulated, then rescaled so the
// last arrival lands exactly at N / rate (or at a given end: a run of a set duration ends its
// schedule there, so all of its ceil(rate × S) requests are sent). The rescale removes the 1–2%
// run-to-run drift in total send time, so throughput figures from different seeds compare.
import type { Rng } from '../sim/rng.ts';

/**
 * Send offsets in seconds from the start of the run, one per request, non-decreasing.
 * rate = Infinity sends everything at t = 0; burstiness = Infinity gives constant gaps. `endAt`,
 * seconds: where the last arrival lands (N / rate without it).
 */
export function arrivalOffsets(
  n: number,
  rate: number,
  burstiness: number,
  rng: Rng,
  endAt: number = n / rate,
): number[] {
  if (!Number.isInteger(n) || n < 0) throw new Error(`request count must be a whole number >= 0, got ${n}`);
  if (!(rate > 0)) throw new Error(`request rate must be > 0, got ${rate}`);
  if (!(burstiness > 0)) throw new Error(`burstiness must be > 0, got ${burstiness}`);
  if (rate === Number.POSITIVE_INFINITY) return new Array<number>(n).fill(0);
  const offsets: number[] = [];
  let t = 0;
  for (let i = 0; i < n; i++) {
    t += burstiness === Number.POSITIVE_INFINITY ? 1 / rate : rng.gamma(burstiness, 1 / (rate * burstiness));
    offsets.push(t);
  }
  const last = offsets[n - 1];
  if (last === undefined || last === 0) return offsets;
  const factor = endAt / last;
  return offsets.map((x) => x * factor);
}
