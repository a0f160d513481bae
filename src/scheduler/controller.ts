// The closed loop that sets each backend's concurrency limit (how many requests the gateway lets
// it run at once). Pure functions of what was measured; the scheduler calls them on its timers.
//
// Why a limit at all: a vLLM replica admits everything it is sent, and a bigger batch raises its
// throughput and every sequence's latency together (the seed document's trade-off). Past some
// batch size TPOT misses its target for everyone, and requests queue inside vLLM, where nothing
// can reorder or reroute them. The limit keeps the batch where the targets hold and the waiting
// at the gateway, where the scheduler orders it.
//
// Inner loop, every `interval_ms`, per backend. Two signals, each as a ratio to its setpoint:
//   tpot = mean gap between token events on the backend in the period
//          ÷ (tpot_share × the tightest TPOT target among the classes it served)
//   ttft = p90 over the period's first tokens of (dispatch→first token − own predicted prefill)
//          ÷ class TTFT target, ÷ ttft_share
// The second is the waiting inside the backend, with the request's own work taken out (a long
// prompt is slow because it is long, and a lower limit would not help it). e = max(tpot, ttft):
//   e > 1                  → limit ÷ min(e, 2)               (multiplicative decrease)
//   e ≤ 1 and limit binding → limit × (1 + ½·(1 − e)), ≥ +1  (growth that vanishes at the setpoint)
//   otherwise, or no signal → unchanged
// then clamped to [concurrency.min, concurrency.max]. "Binding": requests waited for this backend
// in the period, or it ran at its limit; a limit nobody presses against does not grow (no windup).
//
// Why it is stable: both signals grow with the batch (a decode step is a weight read plus a cost
// per sequence, so the mean gap is about a + b·L; internal waiting grows with what runs ahead). In
// log space the law is a proportional step, Δln L = −ln e above the setpoint and ≈ ½·(1 − e) ≤ ½
// below it: with e roughly proportional to L, a decrease lands near the setpoint in one period and
// an increase covers at most half the remaining distance, so it converges without oscillating.
// The dead time is short: the gap signal reflects a new batch within one decode step, far inside
// one period.
//
// Outer loop, every `outer_periods` periods: the inner loop holds a mean, while the target is on
// the P99 of per-request TPOT. tpot_share is servoed so that the measured P99 TPOT of the
// requests the backend completed in that time sits at 95% of the target:
//   tpot_share ← clamp(tpot_share × (1 + ⅕·(1 − p99 / (0.95 × target))), 0.3, 1)
// Slow (a fifth of the error per step, every few seconds) against the inner loop's half-second,
// so the two do not fight. There is no outer loop on TTFT: a lower limit moves waiting from the
// backend to the gateway, so the total TTFT does not fall monotonically with it; the admission
// controller holds the total under its target by refusing early what cannot meet it.

export interface LimitBounds {
  min: number;
  max: number;
}

export interface Setpoints {
  /** Share of the TPOT target the mean token gap may use. */
  tpotShare: number;
  /** Share of the TTFT target the p90 waiting inside the backend may use. */
  ttftShare: number;
}

export interface ControlSignals {
  /** Mean gap between token events on the backend over the period, ms; null: too few gaps. */
  meanItlMs: number | null;
  /** The tightest TPOT target among the classes the backend served, ms. */
  tpotTargetMs: number;
  /** p90 of (dispatch→first token − own prefill) / class TTFT target over the period; null: too few. */
  ttftQueueShare: number | null;
  /** Requests waited for this backend in the period, or it ran at its limit. */
  binding: boolean;
}

export interface ControlStep {
  limit: number;
  /** e above; null when there was no signal. */
  error: number | null;
}

const INCREASE_GAIN = 0.5;
const MAX_DECREASE = 2;

export function controlError(s: ControlSignals, sp: Setpoints): number | null {
  const parts: number[] = [];
  if (s.meanItlMs !== null && s.tpotTargetMs > 0) parts.push(s.meanItlMs / (sp.tpotShare * s.tpotTargetMs));
  if (s.ttftQueueShare !== null) parts.push(s.ttftQueueShare / sp.ttftShare);
  return parts.length === 0 ? null : Math.max(...parts);
}

export function nextLimit(limit: number, s: ControlSignals, sp: Setpoints, b: LimitBounds): ControlStep {
  const e = controlError(s, sp);
  let next = limit;
  if (e !== null && e > 1) next = limit / Math.min(e, MAX_DECREASE);
  else if (e !== null && s.binding) next = Math.max(limit + 1, limit * (1 + INCREASE_GAIN * (1 - e)));
  return { limit: Math.min(b.max, Math.max(b.min, next)), error: e };
}

export const OUTER_TARGET = 0.95;
const OUTER_GAIN = 0.2;
export const TPOT_SHARE_BOUNDS = { min: 0.3, max: 1 } as const;

/** The outer loop's step: `p99Ratio` = measured P99 TPOT / target over the last outer period. */
export function nextTpotShare(share: number, p99Ratio: number): number {
  const next = share * (1 + OUTER_GAIN * (1 - p99Ratio / OUTER_TARGET));
  return Math.min(TPOT_SHARE_BOUNDS.max, Math.max(TPOT_SHARE_BOUNDS.min, next));
}

/** The q-th quantile (0..1) of `xs` by nearest rank; sorts `xs` in place. */
export function quantile(xs: number[], q: number): number {
  xs.sort((a, b) => a - b);
  const i = Math.min(xs.length - 1, Math.max(0, Math.ceil(q * xs.length) - 1));
  return xs[i] as number;
}
