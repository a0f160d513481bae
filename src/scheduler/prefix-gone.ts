// Was a first token late because the prefix the index counted on was gone? The scheduler learns
// each first token (scheduler.ts, firstToken); this says how much of its lateness to learn as a
// prefill of the cached part rather than as waiting.

/**
 * A first token later than predicted by at least this share of the time the cached part of the
 * prompt would take to prefill is judged to have found that part gone. On prefix-sharing traffic
 * (docs/benchmarks.md, "A prefix the index counted on was gone") such first tokens came 0.9 to
 * 1.3 times the cached part's prefill late, and first tokens late behind other requests' prefill
 * thinned out from 0.5 of it to none past 0.8: a wait is rarely taken for a miss, a miss rarely
 * for a wait.
 */
const GONE_SHARE = 0.8;

/**
 * The part of a first token's lateness that was a prefill of its cached part, ms: 0 unless judged
 * gone (GONE_SHARE), then that part's prefill time, or the lateness where less (a prefix partly
 * gone). The prediction counts as at least `floorMs`, the quickest first tokens, as in the planning
 * ratio. Null when the request cannot be judged: no prediction, no fit, or a cached part whose
 * prefill is shorter than the prediction.
 * A lateness of most of such a part is a lateness any wait may reach: a block or two of a short
 * shared system prompt would pass for gone at every wait.
 */
export function gonePrefillMs(
  predictedMs: number | null,
  actualMs: number,
  cachedMs: number,
  floorMs: number,
): number | null {
  if (predictedMs === null) return null;
  // As in the planning ratio, a prediction counts as at least the quickest first tokens.
  const expectedMs = Math.max(predictedMs, floorMs);
  if (!(cachedMs > 0) || cachedMs < expectedMs) return null;
  const lateMs = actualMs - expectedMs;
  return lateMs >= GONE_SHARE * cachedMs ? Math.min(cachedMs, lateMs) : 0;
}
