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
//   tpot = the larger of: the median gap between token events on the backend over the last few
//          periods ÷ (tpot_share × the tightest TPOT target among the classes running there),
//          and the mean gap over the same periods ÷ that target
//   ttft = p90 over the last few periods' first tokens of (dispatch→first token − own predicted
//          prefill − two median token gaps) ÷ class TTFT target, ÷ ttft_share
// The second is the waiting inside the backend that a lower limit could take away: every first
// token waits for the decode step under way and then for its own step, and a long prompt is slow
// because it is long; what is left is queueing inside vLLM (KV cache full, too many sequences,
// prefill budget spent on others). A first token is left out of it while the backend's TTFT fit
// cannot tell its prefill rate (no fit yet, or prompts all of about one size: src/scheduler/README.md).
// e = max(tpot, ttft),
// B = the requests the backend runs now (every gateway instance), and S = the batch the signals
// were measured on (the requests it ran over their periods, weighted by the gaps each measured):
//   e > 1, B > 0            → limit = min(limit, max(B, S) ÷ min(e, 2))  (decrease)
//   e ≤ 1 and limit binding → limit = max(limit, B) × min(1.5, 1/√e), ≥ +1 (growth that vanishes
//                                                                         at the setpoint)
//   otherwise, or no signal → unchanged
// then clamped to [concurrency.min, concurrency.max]. "Binding": requests waited for this backend
// in the period, or it ran at its limit; a limit nobody presses against does not grow (no windup).
//
// Why the median gap and not the mean: a decode step takes about a + b·B (a weight read, and a
// cost per sequence), and a step that also carries a prefill chunk takes that plus the chunk's
// compute, for every sequence in it. The limit sets B; it does not set how much prefill arrives
// (that is the arrivals' uncached prompt tokens, whatever the limit), so lowering it does not
// shorten those steps. Where long uncached prompts are common (a tenant's first 5,000-token system
// prompt, chunked over a few steps of 100-170 ms against 20-40 ms for a decode step), the mean gap
// was set by them: the loop cut B to bring it under the setpoint, the backends ran a few requests
// under a limit that tracked them, and bursts waited for slots and were refused
// (docs/benchmarks.md, "The decode pace the limit sets"). The median is the typical step, which
// the batch sets. What the slow steps add to each request's TPOT is in the completed requests'
// TPOT, which the outer loop reads: it lowers tpot_share until their P99 sits under the target.
// The outer loop can make up for slow steps only down to its floor (0.6), and the number of slow
// steps does grow with the batch once the backend is saturated (a larger batch admits prompts
// faster). So the mean still bounds the loop, at the whole target rather than its share: a
// backend whose mean gap is over the TPOT target has its average request late, and its limit comes
// down whatever the median says.
//
// Why B and not the limit: a lower limit takes effect only as running requests finish (seconds
// for long outputs), so for a while the signal still describes the old batch. Stepping from the
// batch that produced the signal, not from the last limit, means the same evidence seen again in
// the next period asks for the same limit instead of halving it again: decreases do not compound
// while the batch drains.
//
// Why it is stable: both signals grow with the batch (a decode step is a weight read plus a cost
// per sequence, so the typical gap is about a + b·B; internal waiting grows with what runs ahead). In
// log space each step is proportional to ln e: −ln e above the setpoint, −½·ln e below it. If e
// were proportional to B, a decrease would land on the setpoint and an increase would cover half
// the remaining distance; e grows more slowly than B (the a in a + b·B), so both fall short of
// the setpoint rather than past it, and the loop converges without oscillating. An increase
// shows in the signal once the new requests have been prefilled and decode, a step or two after
// their admission; growth is capped at 1.5× the larger of the limit and the batch running now, per
// period. That is not a bound on the batch the evidence was measured on: the signal's window is a
// few periods long, so the same evidence can grow the limit in several periods running (2.25× the
// measured batch after two), and the limit can overshoot the setpoint by a step before the signal
// of the larger batch arrives and brings it back down. From far below the limit still
// grows 1.5× every period: from 16 to a few hundred in about two seconds.

// Outer loop, every `outer_periods` periods: the inner loop holds the typical step, while the
// target is on the P99 of per-request TPOT, which also carries the slow steps. tpot_share is
// servoed so that the measured P99 TPOT of the requests the backend completed sits at 95% of the
// target, over the last four outer periods, or as many more (up to 24) as it takes to hold 50
// completions:
//   tpot_share ← clamp(tpot_share × (1 + 0.1·(1 − p99 / (0.95 × target))), 0.6, 1)
// A step down is always taken; a step up only when the backend spent at least half the outer
// period at its limit with e ≥ 0.8. A request completes a whole output after its decode began, so
// while load ramps up the completions report the lighter batches before it: raising the share on
// that evidence let the batch outgrow its target (TPOT misses at 1.25× capacity).
// Slow (a tenth of the error per step, every few seconds) against the inner loop's quarter
// second, so the two do not fight, and bounded below, so that a transient (a burst, a slow
// backend) cannot wind it down to where the limit starves the backend. There is no outer loop on TTFT: a lower limit moves waiting from the
// backend to the gateway, so the total TTFT does not fall monotonically with it; the admission
// controller holds the total under its target by refusing early what cannot meet it.

export interface LimitBounds {
  min: number;
  max: number;
}

export interface Setpoints {
  /** Share of the TPOT target the median token gap may use. */
  tpotShare: number;
  /** Share of the TTFT target the p90 waiting inside the backend may use. */
  ttftShare: number;
}

export interface ControlSignals {
  /** Median gap between token events on the backend over the recent periods, ms; null: too few gaps. */
  itlMs: number | null;
  /** Mean gap over the same periods, ms; null: too few gaps. */
  meanItlMs: number | null;
  /** The tightest TPOT target among the classes the backend served, ms. */
  tpotTargetMs: number;
  /** p90 of the waiting share described above over the recent periods; null: too few first tokens. */
  ttftQueueShare: number | null;
  /** The backend ran at its limit, or requests waited for it while it was at its limit, in the period. */
  binding: boolean;
  /**
   * The batch the signals were measured on (the requests the backend ran over their periods,
   * weighted by the gaps each measured); null when unknown.
   */
  batch: number | null;
}

export interface ControlStep {
  limit: number;
  /** e above; null when there was no signal. */
  error: number | null;
}

const MAX_DECREASE = 2;
const MAX_GROWTH = 1.5;

export function controlError(s: ControlSignals, sp: Setpoints): number | null {
  const parts: number[] = [];
  // No finite TPOT target (no class holds a slot there): the gaps are not judged, not judged as 0.
  const tpotJudged = Number.isFinite(s.tpotTargetMs) && s.tpotTargetMs > 0;
  if (s.itlMs !== null && tpotJudged) parts.push(s.itlMs / (sp.tpotShare * s.tpotTargetMs));
  if (s.meanItlMs !== null && tpotJudged) parts.push(s.meanItlMs / s.tpotTargetMs);
  if (s.ttftQueueShare !== null) parts.push(s.ttftQueueShare / sp.ttftShare);
  return parts.length === 0 ? null : Math.max(...parts);
}

/** `inflight`: the requests the backend runs now, every gateway instance (B above). */
export function nextLimit(
  limit: number,
  inflight: number,
  s: ControlSignals,
  sp: Setpoints,
  b: LimitBounds,
): ControlStep {
  const e = controlError(s, sp);
  let next = limit;
  // With nothing running there is no batch to cut: the signal, a few periods long, describes one
  // that has left (traffic stopped, the backend went down), and a step from 0 would throw away
  // the limit learnt for it. It holds. (Below the setpoint, a limit a request pressed against in the
  // period still grows, as when anything runs.) With some running, the step is from the larger of
  // them and the batch the signal was measured on: a signal from 60 requests says nothing of what
  // 1 would do, and the 1 left as traffic ebbs would otherwise take the limit to its minimum, for
  // the next burst to climb back from.
  if (e !== null && e > 1) {
    const from = Math.max(inflight, s.batch ?? 0);
    if (inflight > 0) next = Math.min(limit, from / Math.min(e, MAX_DECREASE));
  } else if (e !== null && s.binding) {
    const grown = Math.max(limit, inflight) * Math.min(MAX_GROWTH, 1 / Math.sqrt(Math.max(e, 1e-9)));
    next = Math.max(limit + 1, grown);
  }
  return { limit: Math.min(b.max, Math.max(b.min, next)), error: e };
}

export const OUTER_TARGET = 0.95;
const OUTER_GAIN = 0.1;
export const TPOT_SHARE_BOUNDS = { min: 0.6, max: 1 } as const;

/**
 * The outer loop's step: `p99Ratio` = measured P99 TPOT / target over its window. `weight` (0–1)
 * scales the step: a window that reaches back over more outer periods than the usual four
 * counts each completion in more steps, so each step takes a proportionally smaller part of it.
 */
export function nextTpotShare(share: number, p99Ratio: number, weight = 1): number {
  const next = share * (1 + weight * OUTER_GAIN * (1 - p99Ratio / OUTER_TARGET));
  return Math.min(TPOT_SHARE_BOUNDS.max, Math.max(TPOT_SHARE_BOUNDS.min, next));
}

/**
 * The q-th quantile (0..1) of `xs` by nearest rank; `xs` is left as it is. Sorted as a typed
 * array: a numeric sort in native code, where a comparator over an array of doubles boxes a number
 * for every comparison (a 1,024-sample window sorted a few times a period was a steady stream of
 * garbage, and four times slower).
 */
export function quantile(xs: ArrayLike<number>, q: number): number {
  const sorted = Float64Array.from(xs).sort();
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i] as number;
}
