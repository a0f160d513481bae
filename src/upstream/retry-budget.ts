// Envoy's retry budget: retries in flight may not exceed max(minRetries, ratio × active requests),
// so a fleet-wide failure cannot multiply the load by the retry count. One budget is shared by
// every request of the gateway (it lives on the BackendSet).

export interface RetryBudgetOptions {
  /** Share of active requests that may be retrying at once (Envoy: 0.2). */
  ratio: number;
  /** Retries always allowed in flight regardless of load (Envoy: 3). */
  minRetries: number;
}

export class RetryBudget {
  readonly #opts: RetryBudgetOptions;
  #active = 0;
  #retrying = 0;

  constructor(opts: RetryBudgetOptions) {
    this.#opts = opts;
  }

  get active(): number {
    return this.#active;
  }

  get retrying(): number {
    return this.#retrying;
  }

  requestStarted(): void {
    this.#active++;
  }

  requestEnded(): void {
    this.#active--;
  }

  /** Takes one retry slot if the budget allows; pair with releaseRetry() when that attempt ends. */
  tryAcquireRetry(): boolean {
    const cap = Math.max(this.#opts.minRetries, Math.floor(this.#opts.ratio * this.#active));
    if (this.#retrying >= cap) return false;
    this.#retrying++;
    return true;
  }

  releaseRetry(): void {
    this.#retrying--;
  }
}
