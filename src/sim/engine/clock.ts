// Time source and timers of an engine. The real clock uses performance.now() and Node timers;
// the virtual clock runs timers in time order without waiting, for tests and calibration sweeps.

export interface EngineClock {
  now(): number;
  /** Run `fn` after `delayMs` (≤ 0: on the next turn). Returns a cancel function. */
  setTimer(fn: () => void, delayMs: number): () => void;
}

export function realClock(): EngineClock {
  return {
    now: () => performance.now(),
    setTimer(fn, delayMs) {
      if (delayMs <= 0) {
        const h = setImmediate(fn);
        return () => clearImmediate(h);
      }
      const h = setTimeout(fn, delayMs);
      return () => clearTimeout(h);
    },
  };
}

interface VirtualTimer {
  at: number;
  seq: number;
  fn: () => void;
  cancelled: boolean;
}

/** A discrete-event clock: time only moves when run() pops the next timer. */
export class VirtualClock implements EngineClock {
  private t = 0;
  private seq = 0;
  private heap: VirtualTimer[] = [];

  now(): number {
    return this.t;
  }

  setTimer(fn: () => void, delayMs: number): () => void {
    const timer: VirtualTimer = { at: this.t + Math.max(0, delayMs), seq: this.seq++, fn, cancelled: false };
    this.push(timer);
    return () => {
      timer.cancelled = true;
    };
  }

  /** Run timers in time order until none is left or the next one is later than `untilMs`. */
  run(untilMs = Number.POSITIVE_INFINITY): void {
    for (;;) {
      const top = this.heap[0];
      if (top === undefined || top.at > untilMs) break;
      this.pop();
      if (top.cancelled) continue;
      this.t = top.at;
      top.fn();
    }
    if (Number.isFinite(untilMs) && untilMs > this.t) this.t = untilMs;
  }

  private before(a: VirtualTimer, b: VirtualTimer): boolean {
    return a.at < b.at || (a.at === b.at && a.seq < b.seq);
  }

  private push(x: VirtualTimer): void {
    const h = this.heap;
    h.push(x);
    let i = h.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!this.before(h[i]!, h[p]!)) break;
      [h[i], h[p]] = [h[p]!, h[i]!];
      i = p;
    }
  }

  private pop(): void {
    const h = this.heap;
    const last = h.pop()!;
    if (h.length === 0) return;
    h[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < h.length && this.before(h[l]!, h[m]!)) m = l;
      if (r < h.length && this.before(h[r]!, h[m]!)) m = r;
      if (m === i) break;
      [h[i], h[m]] = [h[m]!, h[i]!];
      i = m;
    }
  }
}
