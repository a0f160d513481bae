// Online linear fits with exponential forgetting, kept as raw weighted sums (sufficient statistics)
// so that fits from several gateway instances combine by adding their sums: the result is the fit
// over everyone's samples, each weighted by its age, as if one instance had seen them all.
//
//   y ≈ intercept + Σ slope_j · x_j,  every slope ≥ 0  (more tokens or more load never speed a
//   backend up; a negative slope is noise, and the feature is dropped from the fit instead)
//
// Forgetting is by wall time (half-life), not by sample count, so sums taken on different
// instances at about the same time decay alike, and scaling every sum by one factor leaves the fit
// unchanged: the solution only changes when a sample is added or a peer's sums change. A prior
// (addPrior: other fits' spread, pooled in PooledSpread) is added to the sums only for a solve,
// scaled with them by its caller, so the same holds for the fit with its prior.

export interface FitCoefficients {
  intercept: number;
  /** One per feature, ≥ 0; 0 when the feature did not vary or its slope came out negative. */
  slopes: number[];
  /** Sum of the samples' decayed weights (1 per sample when new), a prior's pseudo-samples included. */
  weight: number;
  /** Samples ever added. */
  samples: number;
}

/** Where Σx_i·x_j (i ≤ j) sits in FitStats.v: the packed upper triangle of Σxxᵀ, after w and Σx. */
function sxxOffset(k: number, i: number, j: number): number {
  return 1 + k + i * k - (i * (i - 1)) / 2 + (j - i);
}

/** Raw decayed sums over samples (x, y), the prediction-error sums and a plain sample count. */
export class FitStats {
  readonly k: number;
  /** [w, Σx (k), Σxxᵀ upper triangle (k(k+1)/2), Σy, Σxy (k), Σ|e|, Σe, Σw_e, n]; all but n decay. */
  readonly v: Float64Array;

  constructor(k: number) {
    this.k = k;
    this.v = new Float64Array(FitStats.size(k));
  }

  static size(k: number): number {
    return 1 + k + (k * (k + 1)) / 2 + 1 + k + 3 + 1;
  }

  /** The samples' weighted mean y; null without weight. */
  meanY(): number | null {
    const w = this.v[0] as number;
    if (!(w > 1e-9)) return null;
    const k = this.k;
    return (this.v[1 + k + (k * (k + 1)) / 2] as number) / w;
  }

  /**
   * Feature `j`'s weighted standard deviation over its weighted mean (0 when it did not vary, or
   * without weight): how far a slope on it can be told apart from the intercept.
   */
  spread(j: number): number {
    const w = this.v[0] as number;
    if (!(w > 1e-9)) return 0;
    const k = this.k;
    const m = (this.v[1 + j] as number) / w;
    const sxx = this.v[sxxOffset(k, j, j)] as number;
    const variance = sxx / w - m * m;
    return m > 0 && variance > 0 ? Math.sqrt(variance) / m : 0;
  }

  /** Samples ever added (not decayed): a fit needs a few before it means anything, however old. */
  get samples(): number {
    return this.v[this.v.length - 1] as number;
  }

  /** Decays every sum by `f`; the sample count does not decay. */
  scale(f: number): void {
    for (let i = 0; i < this.v.length - 1; i++) this.v[i] = (this.v[i] as number) * f;
  }

  /** Adds `other`'s sums decayed by `factor` (its sample count in full). */
  addStats(other: FitStats, factor = 1): void {
    this.#addArray(other.v, factor);
  }

  addSample(x: readonly number[], y: number): void {
    const { k, v } = this;
    v[0] = (v[0] as number) + 1;
    let o = 1;
    for (let j = 0; j < k; j++) v[o + j] = (v[o + j] as number) + (x[j] as number);
    o += k;
    for (let a = 0; a < k; a++) {
      for (let b = a; b < k; b++, o++) v[o] = (v[o] as number) + (x[a] as number) * (x[b] as number);
    }
    v[o] = (v[o] as number) + y;
    o++;
    for (let j = 0; j < k; j++) v[o + j] = (v[o + j] as number) + (x[j] as number) * y;
    v[v.length - 1] = (v[v.length - 1] as number) + 1;
  }

  /**
   * Adds a prior of `weight` pseudo-samples (at most `pool.weight`): as many samples at this fit's
   * own means, spread as the pooled fits spread around theirs. The means (the fit's level) stay
   * its own; only the slopes are pulled toward the pool's. Neither the prediction-error sums nor
   * the sample count move, so `samples` and `error()` stay this fit's own.
   */
  addPrior(pool: PooledSpread, weight: number): void {
    const { k, v } = this;
    const w = v[0] as number;
    if (!(w > 0) || !(pool.weight > 0) || !(weight > 0)) return;
    const p = Math.min(weight, pool.weight);
    const f = p / pool.weight;
    const mx = Array.from({ length: k }, (_, j) => (v[1 + j] as number) / w);
    const syOff = 1 + k + (k * (k + 1)) / 2;
    const my = (v[syOff] as number) / w;
    v[0] = w + p;
    for (let j = 0; j < k; j++) v[1 + j] = (v[1 + j] as number) + p * (mx[j] as number);
    let o = 1 + k;
    for (let a = 0; a < k; a++) {
      for (let b = a; b < k; b++, o++) {
        v[o] =
          (v[o] as number) + f * (pool.cxx[o - 1 - k] as number) + p * (mx[a] as number) * (mx[b] as number);
      }
    }
    v[syOff] = (v[syOff] as number) + p * my;
    for (let j = 0; j < k; j++) {
      v[syOff + 1 + j] =
        (v[syOff + 1 + j] as number) + f * (pool.cxy[j] as number) + p * (mx[j] as number) * my;
    }
  }

  /** Adds one relative prediction error (predicted − actual) / actual. */
  addError(e: number): void {
    const n = this.v.length - 1;
    this.v[n - 3] = (this.v[n - 3] as number) + Math.abs(e);
    this.v[n - 2] = (this.v[n - 2] as number) + e;
    this.v[n - 1] = (this.v[n - 1] as number) + 1;
  }

  /** Mean absolute and mean signed relative error, over the decayed error samples. */
  error(): { mape: number | null; bias: number | null; weight: number } {
    const n = this.v.length - 1;
    const w = this.v[n - 1] as number;
    if (w < 1e-9) return { mape: null, bias: null, weight: 0 };
    return { mape: (this.v[n - 3] as number) / w, bias: (this.v[n - 2] as number) / w, weight: w };
  }

  encode(): number[] {
    return Array.from(this.v, (x) => Number(x.toPrecision(12)));
  }

  /** Adds encoded sums; malformed input is ignored (returns false). */
  addEncoded(enc: unknown): boolean {
    if (!Array.isArray(enc) || enc.length !== this.v.length) return false;
    if (!enc.every((x) => typeof x === 'number' && Number.isFinite(x))) return false;
    this.#addArray(enc as number[], 1);
    return true;
  }

  #addArray(src: ArrayLike<number>, factor: number): void {
    const last = this.v.length - 1;
    for (let i = 0; i < last; i++) this.v[i] = (this.v[i] as number) + (src[i] as number) * factor;
    this.v[last] = (this.v[last] as number) + (src[last] as number);
  }

  /**
   * Weighted least squares on centred features, so an intercept is fitted without penalty and a
   * feature that never varied gets slope 0 instead of trading off against the intercept.
   */
  solve(minSamples: number): FitCoefficients | null {
    const { k, v } = this;
    const w = v[0] as number;
    if (this.samples < minSamples || !(w > 0)) return null;
    const mx = Array.from({ length: k }, (_, j) => (v[1 + j] as number) / w);
    const sxxAt = (a: number, b: number) => v[a <= b ? sxxOffset(k, a, b) : sxxOffset(k, b, a)] as number;
    const syOff = 1 + k + (k * (k + 1)) / 2;
    const my = (v[syOff] as number) / w;
    const cov = (a: number, b: number) => sxxAt(a, b) / w - (mx[a] as number) * (mx[b] as number);
    const covY = (a: number) => (v[syOff + 1 + a] as number) / w - (mx[a] as number) * my;

    // Features whose variance is lost in rounding carry no information about their slope.
    let active = Array.from({ length: k }, (_, j) => j).filter(
      (j) => cov(j, j) > 1e-9 * ((mx[j] as number) ** 2 + 1),
    );
    let slopes = new Array<number>(k).fill(0);
    while (active.length > 0) {
      const a = active.map((r) => active.map((c) => cov(r, c) + (r === c ? 1e-9 * cov(r, r) : 0)));
      const b = active.map((r) => covY(r));
      const beta = solveLinear(a, b);
      if (beta === null) break;
      let worst = -1;
      for (let i = 0; i < active.length; i++) {
        if ((beta[i] as number) < 0 && (worst < 0 || (beta[i] as number) < (beta[worst] as number)))
          worst = i;
      }
      if (worst < 0) {
        slopes = new Array<number>(k).fill(0);
        active.forEach((j, i) => {
          slopes[j] = beta[i] as number;
        });
        break;
      }
      active = active.filter((_, i) => i !== worst);
    }
    let intercept = my;
    for (let j = 0; j < k; j++) intercept -= (slopes[j] as number) * (mx[j] as number);
    return { intercept, slopes, weight: w, samples: this.samples };
  }
}

export function predict(c: FitCoefficients, x: readonly number[]): number {
  let y = c.intercept;
  for (let j = 0; j < c.slopes.length; j++) y += (c.slopes[j] as number) * (x[j] as number);
  return Math.max(0, y);
}

/** Gaussian elimination with partial pivoting; null when the system is singular. */
function solveLinear(a: number[][], b: number[]): number[] | null {
  const n = b.length;
  const m = a.map((row, i) => [...row, b[i] as number]);
  for (let col = 0; col < n; col++) {
    let pivot = col;
    for (let r = col + 1; r < n; r++) {
      if (Math.abs(m[r]?.[col] as number) > Math.abs(m[pivot]?.[col] as number)) pivot = r;
    }
    const p = m[pivot] as number[];
    if (Math.abs(p[col] as number) < 1e-300) return null;
    [m[col], m[pivot]] = [p, m[col] as number[]];
    for (let r = 0; r < n; r++) {
      if (r === col) continue;
      const row = m[r] as number[];
      const f = (row[col] as number) / (p[col] as number);
      for (let c = col; c <= n; c++) row[c] = (row[c] as number) - f * (p[c] as number);
    }
  }
  return m.map((row, i) => (row[n] as number) / (row[i] as number));
}

/**
 * Several fits' sums around their own means, added up: Σ (Σxxᵀ − w·x̄x̄ᵀ), Σ (Σxy − w·x̄ȳ) and Σ w.
 * How y moves with x within each fit, pooled, without where each fit sits: a backend with a
 * higher base or other prompt sizes adds no slope of its own to the pool (a pool of raw sums would
 * read the differences between backends as a slope, even a negative one).
 */
export class PooledSpread {
  readonly k: number;
  /** The packed upper triangle of the centred Σxxᵀ, as FitStats packs it. */
  readonly cxx: Float64Array;
  readonly cxy: Float64Array;
  weight = 0;

  constructor(k: number) {
    this.k = k;
    this.cxx = new Float64Array((k * (k + 1)) / 2);
    this.cxy = new Float64Array(k);
  }

  add(s: FitStats): void {
    const { k } = this;
    const v = s.v;
    const w = v[0] as number;
    if (!(w > 0)) return;
    const sx = (j: number) => v[1 + j] as number;
    const syOff = 1 + k + (k * (k + 1)) / 2;
    const sy = v[syOff] as number;
    let o = 0;
    for (let a = 0; a < k; a++) {
      for (let b = a; b < k; b++, o++) {
        // sx · (sx ÷ w), not (sx · sx) ÷ w: after hours of idle w is tiny and the product underflows.
        this.cxx[o] = (this.cxx[o] as number) + (v[1 + k + o] as number) - sx(a) * (sx(b) / w);
      }
    }
    for (let j = 0; j < k; j++)
      this.cxy[j] = (this.cxy[j] as number) + (v[syOff + 1 + j] as number) - sx(j) * (sy / w);
    this.weight += w;
  }
}

/**
 * Samples' worth of weight that time alone never takes a fit's sums below. Decay is how a fit
 * follows a backend that changed, and new samples do that at their weight whatever the floor; with
 * no new samples it would only erase what is known: after an idle hour one new sample outweighed a
 * long history by 2⁶⁰ and defined the fit alone (a flat one, prefill for free), and after a night
 * the sums reached the subnormal floats, where scaling stops being exact and their ratios drift.
 * Small, because every instance publishes its floored sums: an instance that stopped sending to a
 * backend keeps this much old data in everyone's fit of it (3 is the samples a fit needs to predict).
 */
export const DECAY_FLOOR_SAMPLES = 3;

/** A local fit: sums decayed to `updatedAt` by a half-life, never below DECAY_FLOOR_SAMPLES by time. */
export class DecayingFit {
  readonly stats: FitStats;
  #updatedAt: number | null = null;
  readonly #lambda: number;

  constructor(k: number, halfLifeMs: number) {
    this.stats = new FitStats(k);
    this.#lambda = Math.LN2 / halfLifeMs;
  }

  /**
   * Decays the sums to `now`, down to the floor at most. Invariant: a wall clock stepped back does
   * not stop the decay until it has caught up with the time it left: the sums then age from the
   * new time (held at the old one, an hour's step meant an hour of samples kept at full weight,
   * and peers adding them took this instance's fit for the whole fleet's).
   */
  decayTo(now: number): void {
    if (this.#updatedAt !== null && now > this.#updatedAt) {
      const w = this.stats.v[0] as number;
      let f = Math.exp(-this.#lambda * (now - this.#updatedAt));
      if (w * f < DECAY_FLOOR_SAMPLES) f = w > DECAY_FLOOR_SAMPLES ? DECAY_FLOOR_SAMPLES / w : 1;
      if (f < 1) this.stats.scale(f);
    }
    this.#updatedAt = now;
  }

  /** Factor by which sums taken `ageMs` ago have decayed. */
  decayFactor(ageMs: number): number {
    return Math.exp(-this.#lambda * Math.max(0, ageMs));
  }
}
