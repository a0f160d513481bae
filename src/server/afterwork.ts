// What a finished request still has to do once its client has the whole response: its admission
// record, its metrics, and what it teaches the live state and the predictor. None of it changes
// what that client gets, and run at once it delays whatever the event loop has next: with one
// client in a closed loop, that is the client's next request, which arrives while the last one's
// bookkeeping runs (about 0.2 ms of it). Queued here, it runs a moment later (AFTER_MS), when the
// next request has been read and sent on; a busy loop runs each batch in its timers phase.
//
// Invariants:
// - jobs run once each, in the order they were queued;
// - whoever reads what they write (the metrics page, the state page, the logs' flush, shutdown,
//   a reload before it drops a removed backend's series) calls settle() first, so no read sees a
//   request answered but not yet counted;
// - a job that throws is logged and does not stop the ones after it.

/** How long a job may wait for the loop to be past the next request: one timer tick. */
export const AFTER_MS = 1;

export class Afterwork {
  #jobs: (() => void)[] = [];
  #timer: NodeJS.Timeout | null = null;
  readonly #onError: (err: unknown) => void;

  constructor(onError: (err: unknown) => void) {
    this.#onError = onError;
  }

  /** Jobs queued and not yet run. */
  get pending(): number {
    return this.#jobs.length;
  }

  defer(job: () => void): void {
    this.#jobs.push(job);
    if (this.#timer !== null) return;
    this.#timer = setTimeout(this.#onTimer, AFTER_MS);
    this.#timer.unref();
  }

  /** Runs every queued job now (jobs queued meanwhile included). */
  settle(): void {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    while (this.#jobs.length > 0) {
      const jobs = this.#jobs;
      this.#jobs = [];
      for (const job of jobs) {
        try {
          job();
        } catch (err) {
          this.#onError(err);
        }
      }
    }
  }

  readonly #onTimer = (): void => {
    this.#timer = null;
    this.settle();
  };
}
