// The gateway's Prometheus histogram. Whoever observes holds the child of its label set (made once)
// and counts straight into its buckets: one value, or a request's inter-token gaps (dozens to
// thousands) in one tight loop when the request ends. prom-client's own Histogram hashes the label
// object and looks the bucket up by its string key on every observe(). Registered in a prom-client
// Registry like any metric; the exposition is prom-client's own (cumulative `_bucket` with `le`,
// `_sum`, `_count`).
import type { Registry } from 'prom-client';

/** One label set's counts: non-cumulative per bucket, +Inf last. */
export class BatchHistogramChild {
  #counts: Float64Array;
  sum = 0;
  count = 0;
  #upper: Float64Array;

  constructor(upper: Float64Array) {
    this.#upper = upper;
    this.#counts = new Float64Array(upper.length + 1);
  }

  /** Observations per bucket (not cumulative), the last one +Inf's. */
  get counts(): Float64Array {
    return this.#counts;
  }

  /**
   * Onto `upper`: each bucket's count moves to the first boundary there at or above its own (its
   * own, when `upper` keeps it). So every boundary kept keeps its cumulative count exactly; a
   * boundary taken away is no longer exported, its bucket's count counted at the one above it; a
   * new boundary's bucket starts empty (its cumulative count starts at the boundary below it, and
   * counts exactly from now on).
   */
  rebucket(upper: Float64Array): void {
    const counts = new Float64Array(upper.length + 1);
    let j = 0;
    for (let i = 0; i < this.#upper.length; i++) {
      while (j < upper.length && (upper[j] as number) < (this.#upper[i] as number)) j++;
      counts[j] = (counts[j] as number) + (this.#counts[i] as number);
    }
    counts[upper.length] = (counts[upper.length] as number) + (this.#counts[this.#upper.length] as number);
    this.#upper = upper;
    this.#counts = counts;
  }

  /**
   * Observes one value. A value that is not finite is not counted: prom-client's observe() throws
   * on it, and it would poison _sum (a gap or a latency is never one).
   */
  observe(v: number): void {
    if (!Number.isFinite(v)) return;
    const upper = this.#upper;
    const n = upper.length;
    // Buckets are few (about 15): a linear scan beats a binary search at this size.
    let b = 0;
    while (b < n && v > (upper[b] as number)) b++;
    this.#counts[b] = (this.#counts[b] as number) + 1;
    this.sum += v;
    this.count++;
  }

  /** Observes every value / `divisor` (e.g. milliseconds / 1000 for seconds). */
  observeMany(values: ArrayLike<number>, divisor = 1): void {
    for (let i = 0; i < values.length; i++) this.observe((values[i] as number) / divisor);
  }

  /** Back to no observations (the child stays valid: whoever holds it keeps observing). */
  clear(): void {
    this.#counts.fill(0);
    this.sum = 0;
    this.count = 0;
  }
}

/**
 * Extra boundaries (targets, current and past) a histogram counts at, at most, beside its base
 * list: past this, the one longest out of use is folded away. Small, because every observation
 * scans the boundaries (and a request's gaps each do).
 */
export const MAX_EXTRA_BOUNDARIES = 16;

interface MetricValue {
  value: number;
  labels: Record<string, string | number>;
  metricName: string;
}

export class BatchHistogram<L extends string> {
  readonly name: string;
  readonly help: string;
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  readonly #labelNames: readonly L[];
  /** The boundaries it was made with: always among its boundaries, whatever setBuckets adds. */
  readonly #base: readonly number[];
  /**
   * The boundaries it counts at: the base list and every extra one setBuckets has been given
   * (at most MAX_EXTRA_BOUNDARIES of them), exported or not.
   */
  #upper: Float64Array;
  /** Per boundary of #upper: exported now (the base list and the extras given last). */
  #exported: Uint8Array;
  /** The extra boundaries counted at, the longest unexported first out when there are too many. */
  #extras: number[] = [];
  readonly #children = new Map<string, { labels: string[]; child: BatchHistogramChild }>();

  constructor(opts: {
    name: string;
    help: string;
    labelNames: readonly L[];
    buckets: readonly number[];
    registers: Registry[];
  }) {
    this.name = opts.name;
    this.help = opts.help;
    this.#labelNames = opts.labelNames;
    this.#base = [...opts.buckets];
    this.#upper = Float64Array.from([...opts.buckets].sort((a, b) => a - b));
    this.#exported = new Uint8Array(this.#upper.length).fill(1);
    // The registry only reads name, help, type and get(); its type names prom-client's own classes.
    for (const r of opts.registers)
      r.registerMetric(this as unknown as Parameters<Registry['registerMetric']>[0]);
  }

  /** The child of one label set (made once; keep it). */
  labels(...values: string[]): BatchHistogramChild {
    const key = values.join('\u0000');
    let entry = this.#children.get(key);
    if (entry === undefined) {
      entry = { labels: values, child: new BatchHistogramChild(this.#upper) };
      this.#children.set(key, entry);
    }
    return entry.child;
  }

  /**
   * The boundaries exported from now on: the base list and `extra` (the class targets configured
   * now). Invariants: no count is lost; every exported boundary's cumulative count only grows. A
   * new boundary's series counts exactly from now on (its count starts at the boundary below it);
   * one no longer listed (a target a reload changed) is no longer exported but still counted at,
   * so that if a later reload lists it again it comes back at its true count (had its bucket been
   * folded into the one above, it would come back lower than it left, which Prometheus reads as a
   * counter reset). The exported list stays as long as the configuration makes it; what is counted
   * at is bounded: past MAX_EXTRA_BOUNDARIES extras (current and past together), the one longest
   * unexported is folded into the boundary above it (rebucket), and that one alone would come back
   * inexact.
   */
  setBuckets(extra: readonly number[]): void {
    const wanted = new Set([...this.#base, ...extra]);
    for (const b of wanted) {
      if (this.#base.includes(b)) continue;
      const at = this.#extras.indexOf(b);
      if (at >= 0) this.#extras.splice(at, 1);
      this.#extras.push(b);
    }
    // Oldest first; an extra exported now is never dropped (there are at most as many as classes).
    while (this.#extras.length > MAX_EXTRA_BOUNDARIES) {
      const out = this.#extras.findIndex((b) => !wanted.has(b));
      if (out < 0) break;
      this.#extras.splice(out, 1);
    }
    const counted = [...new Set([...this.#base, ...this.#extras])].sort((a, b) => a - b);
    if (counted.length !== this.#upper.length || counted.some((b, i) => b !== this.#upper[i])) {
      this.#upper = Float64Array.from(counted);
      for (const { child } of this.#children.values()) child.rebucket(this.#upper);
    }
    this.#exported = Uint8Array.from(counted, (b) => (wanted.has(b) ? 1 : 0));
  }

  /** The bucket boundaries exported now (every `le` but +Inf). */
  get buckets(): readonly number[] {
    return [...this.#upper].filter((_, i) => this.#exported[i] === 1);
  }

  remove(...values: string[]): void {
    this.#children.delete(values.join('\u0000'));
  }

  /** Registry.resetMetrics(): every series back to none; children handed out stay in use. */
  reset(): void {
    for (const { child } of this.#children.values()) child.clear();
  }

  async get(): Promise<{
    name: string;
    help: string;
    type: string;
    values: MetricValue[];
    aggregator: string;
  }> {
    const values: MetricValue[] = [];
    for (const { labels, child } of this.#children.values()) {
      // Like prom-client, a label set is exported from its first observation on, not when made;
      // a histogram without labels from the start.
      if (child.count === 0 && this.#labelNames.length > 0) continue;
      const base: Record<string, string | number> = {};
      this.#labelNames.forEach((n, i) => {
        base[n] = labels[i] as string;
      });
      let cumulative = 0;
      for (let b = 0; b <= this.#upper.length; b++) {
        cumulative += child.counts[b] as number;
        if (b < this.#upper.length && this.#exported[b] === 0) continue;
        const le = b < this.#upper.length ? (this.#upper[b] as number) : '+Inf';
        values.push({ value: cumulative, labels: { ...base, le }, metricName: `${this.name}_bucket` });
      }
      values.push({ value: child.sum, labels: base, metricName: `${this.name}_sum` });
      values.push({ value: child.count, labels: base, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }
}
