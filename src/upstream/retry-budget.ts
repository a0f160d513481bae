// Envoy's retry budget: retries in flight may not exceed max(minRetries, ratio × active requests),
// so a fleet-wide failure cannot multiply the load by the retry count. One budget is shared by
// every request of the gateway. It counts only its own retries: the active requests are read from
// their one owner (the gateway's in-flight registry), never counted here a second time.

export interface RetryBudgetOptions {
  /** Share of active requests that may be retrying at once (Envoy: 0.2). */
  ratio: number;
  /** Retries always allowed in flight regardless of load (Envoy: 3). */
  minRetries: number;
}

export class RetryBudget {
  readonly #opts: RetryBudgetOptions;
  readonly #active: () => number;
  #retrying = 0;

  /** `active`: requests in flight now (queued ones included), from their owner. */
  constructor(opts: RetryBudgetOptions, active: () => number) {
    this.#opts = opts;
    this.#active = active;
  }

  get retrying(): number {
    return this.#retrying;
  }

  /** Takes one retry slot if the budget allows; pair with releaseRetry() when that attempt ends. */
  tryAcquireRetry(): boolean {
    const cap = Math.max(this.#opts.minRetries, Math.floor(this.#opts.ratio * this.#active()));
    if (this.#retrying >= cap) return false;
    this.#retrying++;
    return true;
  }

  releaseRetry(): void {
    this.#retrying--;
  }
}
