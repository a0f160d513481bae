// Percentiles of an unbounded stream of latencies in bounded memory, to a stated relative accuracy
// (the construction of DDSketch, Masson et al., VLDB 2019): a value v > 0 is counted in bucket
// k = ⌈log_γ v⌉, γ = (1 + α) / (1 − α), and every value of bucket k is read back as
// 2γ^k / (γ + 1), which is within α of each of them. A bucket is a map entry, so the memory is the
// number of distinct buckets the values touch: at α = 0.1% about 1,150 per decade of range, however
// many values there are. `slagate logs` keeps one per series (class or backend, and metric), where
// it once kept every value (scripts/logs-memory.ts: 481 MB resident at most for a million records,
// 1,004 MB for three million; with the sketches 113 and 118 MB).
//
// Values at or below MIN_VALUE (0 among them) are counted as 0 exactly.

export const ACCURACY = 0.001;
const GAMMA = (1 + ACCURACY) / (1 - ACCURACY);
const LOG_GAMMA = Math.log(GAMMA);
/** 1 ns in ms: anything at or under it is a zero (a queue wait of 0). */
const MIN_VALUE = 1e-6;

export class QuantileSketch {
  #count = 0;
  #zeros = 0;
  readonly #buckets = new Map<number, number>();

  get count(): number {
    return this.#count;
  }

  /** Distinct buckets held (what the memory grows with). */
  get size(): number {
    return this.#buckets.size + (this.#zeros > 0 ? 1 : 0);
  }

  add(v: number): void {
    this.#count++;
    if (!(v > MIN_VALUE)) {
      this.#zeros++;
      return;
    }
    const k = Math.ceil(Math.log(v) / LOG_GAMMA);
    this.#buckets.set(k, (this.#buckets.get(k) ?? 0) + 1);
  }

  /**
   * The p-th percentiles (0–100) by linear interpolation between closest ranks, as numpy and vLLM's
   * benchmark compute them, over the values as the buckets hold them (each within ACCURACY); null
   * when nothing was added.
   */
  percentiles(ps: readonly number[]): (number | null)[] {
    if (this.#count === 0) return ps.map(() => null);
    const keys = [...this.#buckets.keys()].sort((a, b) => a - b);
    // The i-th smallest value (0-based), walking the buckets in order.
    const at = (i: number): number => {
      if (i < this.#zeros) return 0;
      let seen = this.#zeros;
      for (const k of keys) {
        seen += this.#buckets.get(k) as number;
        if (i < seen) return (2 * GAMMA ** k) / (GAMMA + 1);
      }
      throw new Error('rank past the count');
    };
    return ps.map((p) => {
      const rank = (p / 100) * (this.#count - 1);
      const lo = Math.floor(rank);
      const a = at(lo);
      return a + (at(Math.ceil(rank)) - a) * (rank - lo);
    });
  }
}
