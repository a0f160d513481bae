// How predictions of dispatch to first token have turned out, and the bound planned on from it:
// a ring of recent (predicted, actual) pairs, read at its P99 of actual ÷ predicted.
//
// The scheduler keeps one ring for the whole fleet and one per backend. A backend plans on its
// own ring while enough of its own first tokens came in the window, and on the fleet's otherwise.
// On a fleet of one GPU kind the two agree; on a mixed one they need not: on two H100s and four
// A100s the H100s, which the router loaded hardest, had a P99 of 2.8–3.5 and the A100s 1.3–2.7,
// and the fleet's one P99 planned every A100 on the H100s' (docs/benchmarks.md, "One planning
// bound per backend, and late on spare room": over 600 s there, +18% goodput, the A100s serving
// a third of the requests instead of a sixth).
import { quantile } from './controller.ts';

/**
 * Recent actual ÷ predicted dispatch-to-first-token times kept (the fleet's, and each backend's),
 * and the fewest that give a P99. Of those, the planning P99 reads the ones of the last
 * RATIO_WINDOW_MS, or the last MIN_RATIO_SAMPLES when fewer came in it (PlanRing). A backend plans
 * on its own P99 while MIN_BACKEND_RATIO_SAMPLES of its own came in that window, and on the
 * fleet's otherwise: a P99 of 50 is about the largest of them, and on a fleet of eight a backend
 * takes eight times as long as the fleet to gather its own.
 */
export const RATIO_SAMPLES = 1024;
export const MIN_RATIO_SAMPLES = 50;
export const MIN_BACKEND_RATIO_SAMPLES = 100;
export const RATIO_WINDOW_MS = 300_000;

/** What a ring says, read at one time. */
export interface Plan {
  /** The 5th percentile of the actual times: no prediction counts as less (Scheduler.upperBackendMs). */
  readonly floorMs: number;
  /** P99 of actual ÷ predicted, each prediction counted as at least the floor; at least 1. */
  readonly multiplier: number;
  /** Median of |actual ÷ predicted − 1|: the predictor's typical relative error. */
  readonly spread: number;
  /** How many of the samples read came in the window (the rest are older: too few came in it). */
  readonly inWindow: number;
}

/**
 * `predictedMs` as `plan` bounds it: counted as at least its floor, times its multiplier; the
 * prediction itself without a plan.
 */
export function atPlan(plan: Plan | null, predictedMs: number): number {
  return plan === null ? predictedMs : Math.max(predictedMs, plan.floorMs) * plan.multiplier;
}

/**
 * Recent actual and predicted dispatch-to-first-token times, side by side, with when each came.
 * A read takes those of the last `windowMs`, or the last `minSamples` when fewer came in it.
 * Bounded in time as well as in number: the last 1,024 first tokens of an instance that sees a few
 * requests a minute go back an hour or more, and a burst of late ones then (a backend restarted
 * cold, say) would set how every request is planned long after. Not shorter than five minutes at
 * the defaults: at one minute, each of three instances sharing a fleet planned on a P99 of a third
 * of the samples one instance has, which swung more and refused more (docs/benchmarks.md, "The
 * planning P99 over a window of time").
 */
export class PlanRing {
  readonly #capacity: number;
  readonly #minSamples: number;
  readonly #windowMs: number;
  readonly #predicted: number[] = [];
  readonly #actual: number[] = [];
  readonly #atMs: number[] = [];
  #at = 0;

  constructor(capacity: number, minSamples: number, windowMs: number) {
    this.#capacity = capacity;
    this.#minSamples = minSamples;
    this.#windowMs = windowMs;
  }

  push(predictedMs: number, actualMs: number, now: number): void {
    this.#predicted[this.#at] = predictedMs;
    this.#actual[this.#at] = actualMs;
    this.#atMs[this.#at] = now;
    this.#at = (this.#at + 1) % this.#capacity;
  }

  /** The plan from the samples recent at `now`; null with fewer than minSamples in all. */
  read(now: number): Plan | null {
    const n = this.#actual.length;
    if (n < this.#minSamples) return null;
    const from = now - this.#windowMs;
    const recent: number[] = [];
    let inWindow = 0;
    for (let k = 1; k <= n; k++) {
      const i = (this.#at - k + n) % n;
      const old = (this.#atMs[i] as number) < from;
      if (old && recent.length >= this.#minSamples) break;
      if (!old) inWindow++;
      recent.push(i);
    }
    const actual = recent.map((i) => this.#actual[i] as number);
    const floorMs = quantile(actual, 0.05);
    const ratios = recent.map(
      (i, k) => (actual[k] as number) / Math.max(this.#predicted[i] as number, floorMs, 1e-3),
    );
    return {
      floorMs,
      multiplier: Math.max(1, quantile(ratios, 0.99)),
      spread: quantile(
        ratios.map((r) => Math.abs(r - 1)),
        0.5,
      ),
      inWindow,
    };
  }
}
