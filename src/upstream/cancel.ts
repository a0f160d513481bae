// A request's cancellation: its client left, or the gateway cut it (the shutdown's grace period
// ran out). One per request, made at its head (the server's lifecycle) and fed by both: the
// server aborts it with a GatewayError to cut, the proxy without a reason when the client's
// response closes early. The scheduler's wait and the relay listen to it.
//
// It stands in for AbortController and AbortSignal on the request path. Node's EventTarget made
// those about 15 µs a request (two controllers and three listener pairs, in a probe); this is an
// object and a short array.
//
// Invariants: it aborts at most once, and the first reason stays; a listener runs at most once,
// at the abort, in the order listeners were added; one removed before the abort never runs.

/** The reason an abort without one gets (a client that went away). */
export class CancelledError extends Error {
  override name = 'AbortError';
  constructor() {
    super('The request was cancelled.');
  }
}

export class Cancel {
  #aborted = false;
  #reason: unknown = undefined;
  #listeners: (() => void)[] = [];

  get aborted(): boolean {
    return this.#aborted;
  }

  /** Why it aborted (undefined before). */
  get reason(): unknown {
    return this.#reason;
  }

  /** Aborts with `reason` (a CancelledError when none), then runs the listeners; later calls do nothing. */
  abort(reason?: unknown): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#reason = reason === undefined ? new CancelledError() : reason;
    const listeners = this.#listeners;
    this.#listeners = [];
    for (const fn of listeners) fn();
  }

  /** Runs `fn` at the abort; never when already aborted (check `aborted` first). */
  onAbort(fn: () => void): void {
    if (!this.#aborted) this.#listeners.push(fn);
  }

  offAbort(fn: () => void): void {
    const i = this.#listeners.indexOf(fn);
    if (i >= 0) this.#listeners.splice(i, 1);
  }
}
