// Per-request latency figures as vLLM's serving benchmark defines them, taken at the gateway.
// All times are performance.now() milliseconds. A "token event" is an SSE data event with a
// non-empty `choices` array (for chat the first one is the role chunk, whose content is ""; vLLM's
// benchmark counts it as the first token too), so ITL has one entry per chunk, not per token.

export interface Latencies {
  /** First token event − request start (includes the gateway queue and every failed attempt). */
  ttftMs: number | null;
  /**
   * (last token event − first token event) / (completion_tokens − 1); null unless there were two
   * token events and completion_tokens > 1 (a non-streamed body is one event: no TPOT there).
   */
  tpotMs: number | null;
  /** Gaps between consecutive token events. */
  itlMs: number[];
  /** Response end − request start. */
  e2eMs: number;
  firstTokenAt: number | null;
  lastTokenAt: number | null;
}

export class TokenClock {
  readonly startedAt: number;
  firstTokenAt: number | null = null;
  lastTokenAt: number | null = null;
  readonly itlMs: number[] = [];

  constructor(startedAt: number) {
    this.startedAt = startedAt;
  }

  token(now: number): void {
    if (this.lastTokenAt === null) this.firstTokenAt = now;
    else this.itlMs.push(now - this.lastTokenAt);
    this.lastTokenAt = now;
  }

  finish(endedAt: number, completionTokens: number | null): Latencies {
    const first = this.firstTokenAt;
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
      firstTokenAt: first,
      lastTokenAt: last,
    };
  }
}
