// How long this process's event loop was held up while a test measured a reaction time. The
// gateway, its upstream and the test's client share the process in these tests, so a machine busy
// with the rest of the suite delays all three alike: a bound such as "the upstream sees the close
// within 100 ms" is checked as 100 ms plus the longest stall the loop had meanwhile, measured, not
// guessed. On a quiet machine that is a few milliseconds, and a reaction late by design (a timer,
// a poll) still fails.
import { type IntervalHistogram, monitorEventLoopDelay } from 'node:perf_hooks';

export class LoopLag {
  readonly #h: IntervalHistogram;

  private constructor() {
    this.#h = monitorEventLoopDelay({ resolution: 5 });
    this.#h.enable();
  }

  /** Starts measuring now. */
  static start(): LoopLag {
    return new LoopLag();
  }

  /** The longest stall since start, ms; measuring stops. */
  stop(): number {
    this.#h.disable();
    return this.#h.max / 1e6;
  }
}
