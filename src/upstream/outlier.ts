// Passive outlier detection, Envoy style: after N consecutive backend failures the backend is
// ejected for base × (number of ejections), capped. Ejection ends lazily (checked when asked), so
// it owns no timer. Only failures the backend is to blame for reach here (see failure.ts).
//
// An ejection caused only by failures to reach the backend (connection refused or timed out)
// ends early when an active probe passes (Envoy's successful_active_health_check_uneject_host): a
// passing /health proves it is reachable again. One caused by errors the backend answered with
// runs its course, since /health says nothing about those, unless the backend's engine restarts
// while it is ejected for the first time (in the multiplier's memory): the failures were the old
// process's, and say nothing about the new one (a crashed replica that came back would otherwise
// sit idle, healthy, for the rest of the ejection). A backend ejected again since (one that keeps
// crashing, or whose new process fails as the old one did) serves its longer ejections whole.
// An ejection ended early starts the multiplier's decay from that moment, as one that ran out does.
//
// Two streaks, one threshold: failures before an answer began (connect errors, 5xx, first-token
// timeouts), which a request the backend began answering ends (success(), at its commit point, as
// the breaker and Envoy count it); and failures after an answer began (a stream reset, an in-band
// error, an idle timeout mid-stream), which only a request the backend answered to its end ends
// (completed()). One streak would not do: ended at the commit, a backend that fails every stream
// after its first token would never reach the threshold; ended at the end of a stream, the failures
// after a long stream still running would look consecutive.

export interface OutlierOptions {
  /** Consecutive failures that eject (Envoy consecutive_5xx: 5). */
  consecutiveFailures: number;
  baseEjectionMs: number;
  maxEjectionMs: number;
  /** Share of the set that may be ejected at once; at least one backend always may be, never the last in service for a model (backends.ts). */
  maxEjectionPercent: number;
}

export class OutlierDetector {
  readonly #opts: OutlierOptions;
  readonly #now: () => number;
  #consecutive = 0;
  /** Failures after an answer began, in a row (ended by an answer to its end). */
  #consecutiveAfter = 0;
  /** Every failure of the current streak was a failure to reach the backend. */
  #streakUnreachable = true;
  #ejectedUnreachable = false;
  #ejections = 0;
  #ejectedUntil = Number.NEGATIVE_INFINITY;
  /** The multiplier decays one step per base ejection time of health counted from here. */
  #decayFrom = Number.NEGATIVE_INFINITY;

  constructor(opts: OutlierOptions, now: () => number) {
    this.#opts = opts;
    this.#now = now;
  }

  /** The longer of the two streaks (see the header). */
  get consecutiveFailures(): number {
    return Math.max(this.#consecutive, this.#consecutiveAfter);
  }

  /**
   * Times ejected, decayed by one per base ejection time in which the backend served, after its
   * last ejection ended (Envoy decays per interval, not per success): a flapping backend, which
   * answers a request or two between bursts of failures, is ejected for longer each time.
   */
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

  /** The backend began an answer (a first token, a whole body): ends the streak before answers. */
  success(): void {
    this.#consecutive = 0;
    this.#streakUnreachable = true;
    const now = this.#now();
    if (this.#ejections > 0 && now >= this.#decayFrom + this.#opts.baseEjectionMs) {
      this.#ejections--;
      this.#decayFrom = now;
    }
  }

  /** The backend answered a request to its end: ends the streak after answers began. */
  completed(): void {
    this.#consecutiveAfter = 0;
  }

  /**
   * Records one backend failure; `unreachable`: the request never reached the backend;
   * `afterAnswer`: its answer had begun (see the header). `mayEject` asks the set whether the
   * ejection cap leaves room. Returns the ejection duration when this failure ejected the backend,
   * else null.
   */
  failure(mayEject: () => boolean, unreachable = false, afterAnswer = false): number | null {
    // A request sent before the ejection that fails during it says nothing new: not counted (it
    // would otherwise start the next streak, and eject again at once when this ejection ends).
    if (this.ejected()) return null;
    let streak: number;
    if (afterAnswer) streak = ++this.#consecutiveAfter;
    else {
      streak = ++this.#consecutive;
      this.#streakUnreachable &&= unreachable;
    }
    if (streak < this.#opts.consecutiveFailures || !mayEject()) return null;
    // An ejection for failures after answers began is for answered errors, never for reaching it.
    if (afterAnswer) this.#streakUnreachable = false;
    this.#ejections++;
    this.#ejectedUnreachable = this.#streakUnreachable;
    this.#endStreak();
    const ms = Math.min(this.#opts.baseEjectionMs * this.#ejections, this.#opts.maxEjectionMs);
    this.#ejectedUntil = this.#now() + ms;
    this.#decayFrom = this.#ejectedUntil;
    return ms;
  }

  /**
   * The backend's engine restarted (a new process): ends the streak of failures under
   * way, and a first ejection whatever caused it (see the header). True if it ended an ejection.
   */
  engineRestarted(): boolean {
    this.#endStreak();
    if (!this.ejected() || this.#ejections > 1) return false;
    this.#endEjection();
    return true;
  }

  /**
   * No other backend in service serves one of this backend's models (backends.ts): ends the
   * ejection, whatever caused it, since a replica that fails some requests serves better than none.
   * True if it ended one.
   */
  release(): boolean {
    if (!this.ejected()) return false;
    this.#endEjection();
    return true;
  }

  /** A probe passed: ends an ejection that failures to reach the backend caused. True if it did. */
  probePassed(): boolean {
    if (!this.ejected() || !this.#ejectedUnreachable) return false;
    this.#endEjection();
    return true;
  }

  #endStreak(): void {
    this.#consecutive = 0;
    this.#consecutiveAfter = 0;
    this.#streakUnreachable = true;
  }

  /** Ends the ejection now, and the multiplier's decay counts from now (as from an ejection's end). */
  #endEjection(): void {
    this.#ejectedUntil = Number.NEGATIVE_INFINITY;
    this.#decayFrom = this.#now();
  }
}

/** How many backends of `total` may be ejected at once. */
export function maxEjected(total: number, maxEjectionPercent: number): number {
  return Math.max(1, Math.floor((total * maxEjectionPercent) / 100));
}
