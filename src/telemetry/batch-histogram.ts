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
  #upper: Float64Array;
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
   * The boundaries from now on: the base list and `extra` (the class targets configured now).
   * Invariant: no count is lost and every boundary kept goes on as it was (rebucket): a new
   * boundary's series counts exactly from now on, and one no longer listed (a target a reload
   * changed) is no longer exported, so the list stays as long as the configuration makes it, however
   * many reloads move the targets.
   */
  setBuckets(extra: readonly number[]): void {
    const next = [...new Set([...this.#base, ...extra])].sort((a, b) => a - b);
    if (next.length === this.#upper.length && next.every((b, i) => b === this.#upper[i])) return;
    this.#upper = Float64Array.from(next);
    for (const { child } of this.#children.values()) child.rebucket(this.#upper);
  }

  /** The bucket boundaries now (every `le` but +Inf). */
  get buckets(): readonly number[] {
    return [...this.#upper];
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
        const le = b < this.#upper.length ? (this.#upper[b] as number) : '+Inf';
        values.push({ value: cumulative, labels: { ...base, le }, metricName: `${this.name}_bucket` });
      }
      values.push({ value: child.sum, labels: base, metricName: `${this.name}_sum` });
      values.push({ value: child.count, labels: base, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }
}
