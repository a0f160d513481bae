// Passive outlier detection, Envoy style: after N consecutive backend failures the backend is
// ejected for base × (number of ejections), capped. Ejection ends lazily (checked when asked), so
// it owns no timer. Only failures the backend is to blame for reach here (see failure.ts).

export interface OutlierOptions {
  /** Consecutive failures that eject (Envoy consecutive_5xx: 5). */
  consecutiveFailures: number;
  baseEjectionMs: number;
  maxEjectionMs: number;
  /** Share of the set that may be ejected at once; at least one backend always may be. */
  maxEjectionPercent: number;
}

export class OutlierDetector {
  readonly #opts: OutlierOptions;
  readonly #now: () => number;
  #consecutive = 0;
  #ejections = 0;
  #ejectedUntil = Number.NEGATIVE_INFINITY;

  constructor(opts: OutlierOptions, now: () => number) {
    this.#opts = opts;
    this.#now = now;
  }

  get consecutiveFailures(): number {
    return this.#consecutive;
  }

  /** Times ejected, decayed by one per success: a flapping backend is ejected for longer each time. */
  get ejections(): number {
    return this.#ejections;
  }

  ejected(now = this.#now()): boolean {
    return now < this.#ejectedUntil;
  }

  /** Milliseconds left in the current ejection (0 when not ejected). */
  remainingMs(now = this.#now()): number {
    return Math.max(0, this.#ejectedUntil - now);
  }

  success(): void {
    this.#consecutive = 0;
    if (this.#ejections > 0 && !this.ejected()) this.#ejections--;
  }

  /**
   * Records one backend failure. `mayEject` asks the set whether the ejection cap leaves room.
   * Returns the ejection duration when this failure ejected the backend, else null.
   */
  failure(mayEject: () => boolean): number | null {
    this.#consecutive++;
    if (this.#consecutive < this.#opts.consecutiveFailures || this.ejected() || !mayEject()) return null;
    this.#ejections++;
    this.#consecutive = 0;
    const ms = Math.min(this.#opts.baseEjectionMs * this.#ejections, this.#opts.maxEjectionMs);
    this.#ejectedUntil = this.#now() + ms;
    return ms;
  }
}

/** How many backends of `total` may be ejected at once. */
export function maxEjected(total: number, maxEjectionPercent: number): number {
  return Math.max(1, Math.floor((total * maxEjectionPercent) / 100));
}
