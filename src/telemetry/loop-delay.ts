// This process's own event-loop delay: how long a ready callback waits for the loop to get to it.
//
// A request's bytes that arrive while the loop is busy wait that long before the gateway sees the
// request and stamps its arrival, so the client's TTFT holds a part no gateway-side clock can
// measure. When the gateway is short of CPU (relaying tens of thousands of events a second) that
// part grows to hundreds of milliseconds and every admitted request is late by it although the
// gateway's own records say it was on time. Admission takes it out of each request's budget
// (src/admission/predict.ts), so an overloaded gateway refuses what it would deliver late, and
// what it refuses also relieves its own loop.
//
//   a timer every TICK_MS: lateness = time since the last tick − TICK_MS
//     └─ every WINDOW_MS: the window's largest lateness (about its P98: 50 ticks)
//          └─ ms(): exponentially smoothed over windows (half of each new window, the first
//                   one against an idle loop)
//
// A timer of our own rather than perf_hooks' monitorEventLoopDelay: that histogram drops the
// interval in progress when it is reset, so a stall just after a window closes went unseen.
//
// Invariant: ms() is read from memory, null until the first window has closed (nothing is
// measured yet), then ≥ 0; nothing on the request path waits for it. The first window counts half,
// as every new one does, against an idle loop: it holds the gateway's start (its modules compiling,
// the fleet starting), a stall no request waited behind, which taken whole would come out of the
// first requests' budgets for a second or more.

/** The timer's period: lateness is measured to about this resolution. */
export const TICK_MS = 10;
/** One window's largest lateness is one reading. */
export const WINDOW_MS = 500;
/** Weight of the newest window in the smoothed estimate. */
const SMOOTHING = 0.5;

export class LoopDelay {
  readonly #timer: NodeJS.Timeout;
  #last = performance.now();
  #windowStart = this.#last;
  #windowMax = 0;
  #ms: number | null = null;
  #waiting: ((ms: number) => void)[] = [];

  constructor() {
    this.#timer = setInterval(() => this.#tick(), TICK_MS);
    this.#timer.unref();
  }

  /** The estimate, ms: the smoothed largest lateness of the loop in recent windows; null before the first. */
  ms(): number | null {
    return this.#ms;
  }

  /** Resolves with the estimate once the next window has closed. */
  nextWindow(): Promise<number> {
    return new Promise((resolve) => this.#waiting.push(resolve));
  }

  close(): void {
    clearInterval(this.#timer);
  }

  #tick(): void {
    const now = performance.now();
    const late = now - this.#last - TICK_MS;
    this.#last = now;
    if (late > this.#windowMax) this.#windowMax = late;
    if (now - this.#windowStart < WINDOW_MS) return;
    const ms = SMOOTHING * this.#windowMax + (1 - SMOOTHING) * (this.#ms ?? 0);
    this.#ms = ms;
    this.#windowMax = 0;
    this.#windowStart = now;
    for (const resolve of this.#waiting.splice(0)) resolve(ms);
  }
}
