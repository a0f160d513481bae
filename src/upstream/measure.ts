// Per-request latency figures as vLLM's serving benchmark defines them, taken at the gateway.
// Each gap also goes to the backend's decode-pace meter (DecodeMeter, handed out with a slot), which
// the scheduler's concurrency controller reads: two additions per token event, nothing else on
// that path.
// All times are performance.now() milliseconds. A "token event" is an SSE data event with a
// non-empty `choices` array (for chat the first one is the role chunk, whose content is ""; vLLM's
// benchmark counts it as the first token too), so ITL has one entry per chunk, not per token.

/** Decode pace of one backend, summed by every stream on it (the scheduler reads and resets it). */
export interface DecodeMeter {
  /** Gaps between consecutive token events. */
  gaps: number;
  /** Their total, ms. */
  gapMs: number;
}

export interface Latencies {
  /**
   * First token event − request start (includes the gateway queue and every failed attempt); null
   * when no first token was observable (a pass-through non-streamed body).
   */
  ttftMs: number | null;
  /**
   * (last token event − first token event) / (completion_tokens − 1); null unless there were two
   * token events and completion_tokens > 1 (a pass-through body is one event: no TPOT there).
   */
  tpotMs: number | null;
  /** Gaps between consecutive token events. */
  itlMs: number[];
  /** Response end − request start. */
  e2eMs: number;
}

export class TokenClock {
  readonly startedAt: number;
  firstTokenAt: number | null = null;
  lastTokenAt: number | null = null;
  readonly itlMs: number[] = [];
  readonly #meter: DecodeMeter | null;

  constructor(startedAt: number, meter: DecodeMeter | null = null) {
    this.startedAt = startedAt;
    this.#meter = meter;
  }

  token(now: number): void {
    if (this.lastTokenAt === null) {
      this.firstTokenAt = now;
    } else {
      const gap = now - this.lastTokenAt;
      this.itlMs.push(gap);
      if (this.#meter !== null) {
        this.#meter.gaps++;
        this.#meter.gapMs += gap;
      }
    }
    this.lastTokenAt = now;
  }

  /** `observed`: token events were seen one by one (false for a pass-through body). */
  finish(endedAt: number, completionTokens: number | null, observed = true): Latencies {
    const first = observed ? this.firstTokenAt : null;
    const last = this.lastTokenAt;
    const tpotMs =
      first !== null &&
      last !== null &&
      this.itlMs.length > 0 &&
      completionTokens !== null &&
      completionTokens > 1
        ? (last - first) / (completionTokens - 1)
        : null;
    return {
      ttftMs: first === null ? null : first - this.startedAt,
      tpotMs,
      itlMs: this.itlMs,
      e2eMs: endedAt - this.startedAt,
    };
  }
}
