// The prefill this instance's requests still wait for on one backend, as the backend works it off.
//
// The lease counters hold a dispatched request's uncached tokens as pending until its first token
// comes back: exact, but whole to the end. A backend four fifths through a cold 7,000-token prompt
// still counted all 7,000 ahead of the next request, and that request, a follow-up of the same
// prefix with 600 tokens of its own, was predicted as late as the cold prompt itself (450–550 ms
// on the prefix-sharing fleet) and refused, where it came back in about 150 (docs/benchmarks.md).
//
// So the backlog drains as a fluid queue at the TTFT fit's own rate, 1 ÷ (ms per prefill token):
// the fit predicts a first token at base + slope × (own + ahead) + load term, so in its own terms
// the work ahead goes at that rate. Invariants:
// - never above the exact count: what has produced its first token is not ahead of anything, and a
//   fit that drains too slowly overstates no more than the counters did;
// - drained only while there is something to drain: time with nothing pending earns no credit
//   that new work would then be counted against;
// - without a rate (no fit yet, or a slope of 0) nothing drains: the exact count, as before. The
//   caller passes none while a peer instance has prefill ahead on the same backend (whose the
//   backend works first no instance can tell: live-state.ts, drainMsPerToken), and brings the
//   backlog up to date (settle) before the rate it passes changes.

export class PrefillBacklog {
  #tokens = 0;
  #at = 0;

  /** `tokens` more were dispatched at `now`. */
  add(tokens: number, now: number, msPerToken: number | null): void {
    this.#tokens = drained(this.#tokens, now - this.#at, msPerToken) + tokens;
    this.#at = now;
  }

  /** A request's prefill ended (first token, or it left) at `now`; `exact` is the counters' pending now. */
  settle(exact: number, now: number, msPerToken: number | null): void {
    this.#tokens = Math.min(exact, drained(this.#tokens, now - this.#at, msPerToken));
    this.#at = now;
  }

  /** The tokens still ahead at `now`, at most `exact`. */
  ahead(exact: number, now: number, msPerToken: number | null): number {
    return Math.min(exact, drained(this.#tokens, now - this.#at, msPerToken));
  }
}

function drained(tokens: number, elapsedMs: number, msPerToken: number | null): number {
  if (msPerToken === null || !(msPerToken > 0) || !(elapsedMs > 0)) return tokens;
  return Math.max(0, tokens - elapsedMs / msPerToken);
}
