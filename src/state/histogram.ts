// Latency histograms with FIXED log-spaced bins, so two histograms (two seconds, two gateway
// instances) merge by adding counts, and a one-second bucket can be subtracted from a window sum
// exactly: counts are integers and every histogram in the system has the same bin edges.
//
// Bin 0 holds [0, 1 ms); bin k (1 ≤ k < OVERFLOW) holds [GROWTH^(k-1), GROWTH^k) ms; the last bin
// holds everything from 10 minutes up. GROWTH = 1.05 bounds a quantile's relative error by the
// bin width (~5%; linear interpolation inside the bin usually does much better).

const GROWTH = 1.05;
const LOG_GROWTH = Math.log(GROWTH);
const MAX_MS = 600_000;
/** Index of the overflow bin ([MAX_MS, ∞)). */
const OVERFLOW = Math.ceil(Math.log(MAX_MS) / LOG_GROWTH) + 1;
export const BIN_COUNT = OVERFLOW + 1;

export function binIndex(ms: number): number {
  if (!(ms >= 1)) return 0; // also NaN and negatives: a clock oddity is not a 10-minute sample
  if (ms >= MAX_MS) return OVERFLOW;
  return Math.min(OVERFLOW - 1, 1 + Math.floor(Math.log(ms) / LOG_GROWTH));
}

function binLow(i: number): number {
  if (i === 0) return 0;
  if (i === OVERFLOW) return MAX_MS;
  return GROWTH ** (i - 1);
}

function binHigh(i: number): number {
  return i === OVERFLOW - 1 ? MAX_MS : GROWTH ** i;
}

/** Dense bin counts plus count and sum; the unit of merging. */
export class Histogram {
  readonly bins = new Float64Array(BIN_COUNT);
  count = 0;
  sum = 0;

  add(bin: number, n: number, sum: number): void {
    this.bins[bin] = (this.bins[bin] as number) + n;
    this.count += n;
    this.sum += sum;
    // Subtracting the last samples leaves float residue in `sum`; an empty histogram has none.
    if (this.count <= 0) {
      this.count = 0;
      this.sum = 0;
    }
  }

  addHistogram(other: Histogram): void {
    for (let i = 0; i < BIN_COUNT; i++) {
      const c = other.bins[i] as number;
      if (c !== 0) this.bins[i] = (this.bins[i] as number) + c;
    }
    this.count += other.count;
    this.sum += other.sum;
    if (this.count <= 0) {
      this.count = 0;
      this.sum = 0;
    }
  }

  clear(): void {
    this.bins.fill(0);
    this.count = 0;
    this.sum = 0;
  }

  /** Sparse form for the wire: `[count, sum, bin, n, bin, n, ...]` (non-zero bins only). */
  encode(): number[] {
    const out = [this.count, round3(this.sum)];
    for (let i = 0; i < BIN_COUNT; i++) {
      const c = this.bins[i] as number;
      if (c !== 0) out.push(i, c);
    }
    return out;
  }

  /** Adds an encoded histogram; malformed input is ignored (returns false), never half-applied. */
  addEncoded(enc: unknown): boolean {
    if (!Array.isArray(enc) || enc.length < 2 || enc.length % 2 !== 0) return false;
    if (!enc.every((v) => typeof v === 'number' && Number.isFinite(v) && v >= 0)) return false;
    for (let j = 2; j < enc.length; j += 2) {
      const bin = enc[j] as number;
      if (!Number.isInteger(bin) || bin >= BIN_COUNT) return false;
    }
    for (let j = 2; j < enc.length; j += 2) {
      const bin = enc[j] as number;
      this.bins[bin] = (this.bins[bin] as number) + (enc[j + 1] as number);
    }
    this.count += enc[0] as number;
    this.sum += enc[1] as number;
    return true;
  }
}

export interface Quantiles {
  count: number;
  /** Null when the window holds no sample. */
  mean: number | null;
  p50: number | null;
  p90: number | null;
  p99: number | null;
}

const QS = [0.5, 0.9, 0.99] as const;

/**
 * P50/P90/P99 of the sum of `parts` (all bins added), in one pass over the bins. The q-quantile is
 * the value below which a share q of the samples lies, interpolated linearly inside its bin.
 */
export function quantiles(parts: readonly Histogram[]): Quantiles {
  let count = 0;
  let sum = 0;
  for (const h of parts) {
    count += h.count;
    sum += h.sum;
  }
  if (count <= 0) return { count: 0, mean: null, p50: null, p90: null, p99: null };
  const out: number[] = [];
  let cumulative = 0;
  let q = 0;
  for (let i = 0; i < BIN_COUNT && q < QS.length; i++) {
    let inBin = 0;
    for (const h of parts) inBin += h.bins[i] as number;
    if (inBin <= 0) continue;
    while (q < QS.length && cumulative + inBin >= (QS[q] as number) * count) {
      const rank = (QS[q] as number) * count - cumulative;
      out.push(i === OVERFLOW ? MAX_MS : binLow(i) + (binHigh(i) - binLow(i)) * (rank / inBin));
      q++;
    }
    cumulative += inBin;
  }
  // Float residue can leave the top quantile unassigned; it lies in the highest non-empty bin.
  while (out.length < QS.length) out.push(highestValue(parts));
  return { count, mean: sum / count, p50: out[0] as number, p90: out[1] as number, p99: out[2] as number };
}

function highestValue(parts: readonly Histogram[]): number {
  for (let i = BIN_COUNT - 1; i >= 0; i--) {
    if (parts.some((h) => (h.bins[i] as number) > 0)) return i === OVERFLOW ? MAX_MS : binHigh(i);
  }
  return 0;
}

function round3(v: number): number {
  return Math.round(v * 1000) / 1000;
}
