import { Counter, collectDefaultMetrics, Gauge, Registry } from 'prom-client';
import type { AdmissionRecord } from './admission-log.ts';
import { BatchHistogram, type BatchHistogramChild } from './batch-histogram.ts';
import type { Outcome } from './outcome.ts';

export interface ClassTargets {
  ttft_p99_ms: number;
  tpot_p99_ms: number;
}

// Base bucket lists in seconds, close to vLLM's own (research/vllm.md) so dashboards line up. Each
// class's targets are added to them, so "share of requests under the target" is an exact bucket.
export const TTFT_BUCKETS_S: readonly number[] = [
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2, 2.5, 5, 10, 20, 40, 80,
];
export const TPOT_BUCKETS_S: readonly number[] = [
  0.005, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5,
];
/**
 * A queue wait is usually well under a millisecond (a grant at once): TTFT's buckets below 5 ms
 * too, or every such wait reads as 2.5–5 ms in a histogram_quantile.
 */
export const QUEUE_WAIT_BUCKETS_S: readonly number[] = [
  0.0001,
  0.00025,
  0.0005,
  0.001,
  0.0025,
  ...TTFT_BUCKETS_S,
];
export const E2E_BUCKETS_S: readonly number[] = [
  0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 15, 20, 30, 60, 120, 240, 480, 960,
];
/** |predicted − actual| / actual of the TTFT predictor. */
export const PREDICTION_ERROR_BUCKETS: readonly number[] = [0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5];
export const OVERHEAD_BUCKETS_S: readonly number[] = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/** `base` ∪ every target (ms → s), sorted, without duplicates. */
export function bucketsWithTargets(base: readonly number[], targetsMs: readonly number[]): number[] {
  // Rounding to nanoseconds makes 100/1000 and a listed 0.1 the same bucket.
  const all = [...base, ...targetsMs.map((ms) => ms / 1000)].map((s) => Math.round(s * 1e9) / 1e9);
  return [...new Set(all)].filter((s) => s > 0).sort((a, b) => a - b);
}

export interface BackendGauges {
  inflight?: number;
  concurrency_limit?: number;
  healthy?: boolean;
  /**
   * 0..1, from the backend's vLLM metrics. For these three, null means unknown now (never
   * scraped, the last scrape stale, no fit yet): the series is dropped, not left at its last value.
   */
  kv_cache_usage?: number | null;
  waiting?: number | null;
  prefill_tokens_per_second?: number | null;
}

export interface MetricsOptions {
  /** Node's process_* and nodejs_* metrics (unprefixed, standard names). Default true. */
  processMetrics?: boolean;
}

const NONE = 'none';

/**
 * What happens to a backend that is counted, one series per backend in service, from 0: a
 * re-probe learnt (src/upstream/reprobe.ts), an ejection by outlier detection, a restart of its
 * engine seen by the live state.
 */
export type BackendCount = 'reprobe' | 'ejection' | 'engine_restart';
const PREFIX = 'slagate_';
// Each admitted request moves the prefix-hit gauge by 1% of its weight, so the gauge follows
// roughly the last hundred requests.
const PREFIX_DECAY = 0.99;

type CounterChild = ReturnType<Counter<string>['labels']>;

// Label children are made once per label set and kept, so the per-request path does no label
// lookups of its own; prom-client's `labels()` builds objects on every call.
interface ClassSeries {
  slaMet: CounterChild;
  slaJudged: CounterChild;
  admitted: Map<string, CounterChild>;
  refused: Map<string, CounterChild>;
  /** Requests that ended before any decision (decision="none"). */
  undecided: Map<string, CounterChild>;
  backends: Map<string, SeriesBundle>;
}

/** The children of one (class, backend) pair. */
interface SeriesBundle {
  ttft: BatchHistogramChild;
  tpot: BatchHistogramChild;
  itl: BatchHistogramChild;
  e2e: BatchHistogramChild;
  queue: BatchHistogramChild;
  requests: Map<Outcome, CounterChild>;
}

/** The loggers' counts the log metrics read. */
export interface LogCounts {
  dropped(): number;
  writeErrors(): number;
}

export class GatewayMetrics {
  readonly registry = new Registry();
  private readonly ttft: BatchHistogram<'class' | 'backend'>;
  private readonly tpot: BatchHistogram<'class' | 'backend'>;
  private readonly itl: BatchHistogram<'class' | 'backend'>;
  private readonly e2e: BatchHistogram<'class' | 'backend'>;
  private readonly queueWait: BatchHistogram<'class' | 'backend'>;
  private readonly overhead: BatchHistogramChild;
  private readonly predictionError: BatchHistogram<'class'>;
  private readonly predictionErrorByClass = new Map<string, BatchHistogramChild>();
  private readonly requests: Counter<'class' | 'backend' | 'outcome'>;
  private readonly admission: Counter<'class' | 'decision' | 'reason'>;
  private readonly slaMet: Counter<'class'>;
  private readonly slaJudged: Counter<'class'>;
  private readonly backendGauges: Record<keyof BackendGauges, Gauge<'backend'>>;
  private readonly backendEvents: Record<BackendCount, Counter<'backend'>>;
  private readonly queueDepth: Gauge<'class'>;
  private readonly prefixHitRatio: Gauge<string>;
  private readonly storeDegraded: Gauge<string>;
  private readonly series = new Map<string, ClassSeries>();
  /** The configured classes (their queue depths are exported). */
  private configured = new Set<string>();
  /** Backends a reload removed and whose series are gone: a late record names none of them. */
  private readonly retired = new Set<string>();
  /** The backends in service, from the start or the last reload (setBackends). */
  private inService = new Set<string>();
  /** Each removed name's latest removal, until its drain ends (backendRemoved, backendDrained). */
  private readonly removals = new Map<string, number>();
  private removalSeq = 0;
  /** Classes no longer configured whose queue depth is still shown (their requests wait). */
  private readonly unconfigured = new Set<string>();
  private prefixHitTokens = 0;
  private prefixPromptTokens = 0;

  constructor(classes: Readonly<Record<string, ClassTargets>>, opts: MetricsOptions = {}) {
    const reg = this.registry;
    // The base lists here; the class targets join them in setClasses, at start and at every reload.
    // Every histogram is a BatchHistogram (batch-histogram.ts): its children count straight into
    // their buckets, without prom-client's label hashing on each observation.
    const perRequest = (name: string, help: string, buckets: readonly number[]) =>
      new BatchHistogram({
        name: PREFIX + name,
        help,
        labelNames: ['class', 'backend'] as const,
        buckets,
        registers: [reg],
      });
    this.ttft = perRequest(
      'ttft_seconds',
      'Time to first token: arrival at the gateway to first token.',
      TTFT_BUCKETS_S,
    );
    this.tpot = perRequest(
      'tpot_seconds',
      'Time per output token after the first, per request.',
      TPOT_BUCKETS_S,
    );
    // One request's gaps are counted in one call when it ends.
    this.itl = perRequest('itl_seconds', 'Gap between successive streamed chunks.', TPOT_BUCKETS_S);
    this.e2e = perRequest(
      'e2e_seconds',
      'Arrival at the gateway to the last byte, requests that completed (outcome ok).',
      E2E_BUCKETS_S,
    );
    this.queueWait = perRequest(
      'queue_wait_seconds',
      'Time spent in the gateway queue.',
      QUEUE_WAIT_BUCKETS_S,
    );
    this.overhead = new BatchHistogram({
      name: `${PREFIX}overhead_seconds`,
      help: "Time from a request's body being read to the end of admission (parse, validation, estimate, admission); the API key check (at the request's head, before its body), the client's upload, queueing, routing and the relay are not in it.",
      labelNames: [],
      buckets: OVERHEAD_BUCKETS_S,
      registers: [reg],
    }).labels();
    this.predictionError = new BatchHistogram({
      name: `${PREFIX}ttft_prediction_error_ratio`,
      help: "The admission controller's TTFT prediction error, |predicted − measured| / measured, completed requests.",
      labelNames: ['class'] as const,
      buckets: PREDICTION_ERROR_BUCKETS,
      registers: [reg],
    });
    this.requests = new Counter({
      name: `${PREFIX}requests_total`,
      help: 'Requests ended, by outcome.',
      labelNames: ['class', 'backend', 'outcome'] as const,
      registers: [reg],
    });
    this.admission = new Counter({
      name: `${PREFIX}admission_total`,
      help: 'Admission decisions and the reason a request ended.',
      labelNames: ['class', 'decision', 'reason'] as const,
      registers: [reg],
    });
    this.slaMet = new Counter({
      name: `${PREFIX}sla_met_total`,
      help: 'Requests that met both their class TTFT and TPOT targets.',
      labelNames: ['class'] as const,
      registers: [reg],
    });
    this.slaJudged = new Counter({
      name: `${PREFIX}sla_judged_total`,
      help: 'Requests judged against their class targets (met or missed): the denominator of SLA attainment.',
      labelNames: ['class'] as const,
      registers: [reg],
    });
    const backendGauge = (name: string, help: string) =>
      new Gauge({ name: PREFIX + name, help, labelNames: ['backend'] as const, registers: [reg] });
    this.backendGauges = {
      inflight: backendGauge('backend_inflight', 'Requests the gateway has in flight on the backend.'),
      concurrency_limit: backendGauge(
        'backend_concurrency_limit',
        'Current concurrency cap the scheduler applies to the backend.',
      ),
      healthy: backendGauge('backend_healthy', '1 when the backend is healthy and its breaker closed.'),
      kv_cache_usage: backendGauge('backend_kv_cache_usage', 'KV cache usage reported by the backend, 0..1.'),
      waiting: backendGauge(
        'backend_waiting',
        'Requests waiting inside the backend (vLLM num_requests_waiting).',
      ),
      prefill_tokens_per_second: backendGauge(
        'backend_prefill_tokens_per_second',
        "The router's current estimate of the backend's prefill rate.",
      ),
    };
    const backendCounter = (name: string, help: string) =>
      new Counter({ name: `${PREFIX}${name}`, help, labelNames: ['backend'] as const, registers: [reg] });
    this.backendEvents = {
      reprobe: backendCounter(
        'backend_reprobes_total',
        'Timed completions the backend was sent because the fleet passed it over, that its TTFT fit learnt (re-probing).',
      ),
      ejection: backendCounter(
        'backend_ejections_total',
        'Times outlier detection ejected the backend (each ejection longer than the last while they recur).',
      ),
      engine_restart: backendCounter(
        'backend_engine_restarts_total',
        "Times this instance saw the backend's engine restart between two scrapes (a later process_start_time_seconds, or a vLLM prefix-cache counter that fell).",
      ),
    };
    this.queueDepth = new Gauge({
      name: `${PREFIX}queue_depth`,
      help: 'Requests waiting in the gateway queue.',
      labelNames: ['class'] as const,
      registers: [reg],
    });
    this.prefixHitRatio = new Gauge({
      name: `${PREFIX}prefix_hit_ratio`,
      help: 'Estimated share of prompt tokens cached at the chosen backend, token-weighted, recent requests.',
      registers: [reg],
    });
    this.storeDegraded = new Gauge({
      name: `${PREFIX}state_store_degraded`,
      help: '1 while the shared state store is unreachable and the gateway runs on local state.',
      registers: [reg],
    });
    // The loggers keep these counts themselves; each scrape reads them.
    const logCounter = (name: string, help: string, read: () => number) =>
      new Counter({
        name: `${PREFIX}${name}`,
        help,
        registers: [reg],
        collect() {
          this.reset();
          this.inc(read());
        },
      });
    logCounter(
      'log_lines_dropped_total',
      'Log lines (admission records included) dropped because their reader fell 64 MiB behind.',
      () => this.#logs.dropped(),
    );
    logCounter(
      'log_write_errors_total',
      'Writes of the logs that failed (a full disk, a closed pipe); their lines are held and tried again.',
      () => this.#logs.writeErrors(),
    );
    // Absent until a request carries an estimate (prom-client starts an unlabelled gauge at 0).
    this.prefixHitRatio.remove();
    this.setClasses(classes);
    this.storeDegraded.set(0);
    if (opts.processMetrics ?? true) collectDefaultMetrics({ register: reg });
  }

  #logs: LogCounts = { dropped: () => 0, writeErrors: () => 0 };

  /** Where slagate_log_lines_dropped_total and slagate_log_write_errors_total are read from: the loggers' own counts. */
  countLogs(counts: LogCounts): void {
    this.#logs = counts;
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /**
   * Updates every per-request series from one finished request's record. `itlMs` holds the gaps
   * between its streamed chunks, if any.
   *
   * Latency samples come only from requests whose measurement is whole (checklist item 11): TTFT
   * when a first token really arrived (ok, failed_after_commit); TPOT, ITL and E2E only when the
   * request completed (ok), since a failed stream's are cut short. A client cancel adds nothing
   * but its counters: its times measure the client, not the fleet. Queue wait is observed for
   * every other record that has one, a queue_timeout refusal included.
   */
  observeRequest(r: AdmissionRecord, itlMs?: ArrayLike<number>): void {
    const cls = r.class ?? NONE;
    const c = this.classSeries(cls);
    // A request that ends after its backend's series went (a retry still queued when the drain
    // ended names the backend of its last attempt) is counted under none: a series of a backend no
    // longer configured would come back and stay.
    const backend = r.backend === null || this.retired.has(r.backend) ? NONE : r.backend;
    const s = this.bundle(c, cls, backend);
    let req = s.requests.get(r.outcome);
    if (req === undefined) {
      req = this.requests.labels(cls, backend, r.outcome);
      s.requests.set(r.outcome, req);
    }
    req.inc();
    const byReason =
      r.decision === 'refused' ? c.refused : r.decision === 'admitted' ? c.admitted : c.undecided;
    let adm = byReason.get(r.reason);
    if (adm === undefined) {
      adm = this.admission.labels(cls, r.decision ?? NONE, r.reason);
      byReason.set(r.reason, adm);
    }
    adm.inc();
    if (r.sla_met !== null) {
      c.slaJudged.inc();
      if (r.sla_met) c.slaMet.inc();
    }
    if (r.queue_ms !== null && r.outcome !== 'client_cancelled') s.queue.observe(r.queue_ms / 1000);
    if (r.decision === 'refused') return;
    const gotFirstToken = r.outcome === 'ok' || r.outcome === 'failed_after_commit';
    if (gotFirstToken && r.ttft_ms !== null) s.ttft.observe(r.ttft_ms / 1000);
    if (r.outcome === 'ok') {
      if (r.tpot_ms !== null) s.tpot.observe(r.tpot_ms / 1000);
      if (r.e2e_ms !== null) s.e2e.observe(r.e2e_ms / 1000);
      if (itlMs) s.itl.observeMany(itlMs, 1000);
    }
    if (r.prefix_hit_est !== null && r.prompt_tokens_est !== null) {
      this.prefixHitTokens = this.prefixHitTokens * PREFIX_DECAY + r.prefix_hit_est * r.prompt_tokens_est;
      this.prefixPromptTokens = this.prefixPromptTokens * PREFIX_DECAY + r.prompt_tokens_est;
      const hit = this.prefixHit();
      if (hit !== null) this.prefixHitRatio.set(hit);
    }
  }

  /** Requests counted so far by decision and reason: slagate_admission_total summed over classes. */
  async decisionCounts(): Promise<Record<'admitted' | 'refused', Record<string, number>>> {
    const counts: Record<'admitted' | 'refused', Record<string, number>> = { admitted: {}, refused: {} };
    for (const { value, labels } of (await this.admission.get()).values) {
      const by = counts[labels.decision as 'admitted' | 'refused'];
      if (by === undefined) continue;
      const reason = String(labels.reason);
      by[reason] = (by[reason] ?? 0) + value;
    }
    return counts;
  }

  /** The prefix hit ratio gauge's value; null until a request carried an estimate. */
  prefixHit(): number | null {
    return this.prefixPromptTokens > 0 ? this.prefixHitTokens / this.prefixPromptTokens : null;
  }

  /** Sets the given gauges of one backend; absent fields keep their last value, null ones go. */
  setBackendGauges(backend: string, g: BackendGauges): void {
    const gauges = this.backendGauges;
    if (g.inflight != null) gauges.inflight.labels(backend).set(g.inflight);
    if (g.concurrency_limit != null) gauges.concurrency_limit.labels(backend).set(g.concurrency_limit);
    if (g.healthy != null) gauges.healthy.labels(backend).set(g.healthy ? 1 : 0);
    setOrDrop(gauges.kv_cache_usage, backend, g.kv_cache_usage);
    setOrDrop(gauges.waiting, backend, g.waiting);
    setOrDrop(gauges.prefill_tokens_per_second, backend, g.prefill_tokens_per_second);
  }

  /** Counts one `event` of `backend` (BackendCount); none for a backend whose series went. */
  backendEvent(event: BackendCount, backend: string): void {
    if (!this.retired.has(backend)) this.backendEvents[event].labels(backend).inc();
  }

  /**
   * Drops every series labelled with this backend (after a reload removed it and its requests
   * drained); records that still name it count under none until a reload brings the name back.
   */
  removeBackend(backend: string): void {
    this.retired.add(backend);
    for (const counter of Object.values(this.backendEvents)) counter.remove(backend);
    for (const gauge of Object.values(this.backendGauges)) gauge.remove(backend);
    for (const [cls, { backends: byBackend }] of this.series) {
      const s = byBackend.get(backend);
      if (s === undefined) continue;
      for (const h of [this.ttft, this.tpot, this.itl, this.e2e, this.queueWait]) h.remove(cls, backend);
      for (const outcome of s.requests.keys()) this.requests.remove(cls, backend, outcome);
      byBackend.delete(backend);
    }
  }

  /** The backends in service, at the start and after each reload: a name that comes back is counted as itself again. */
  setBackends(names: Iterable<string>): void {
    this.inService = new Set(names);
    for (const name of this.inService) {
      this.retired.delete(name);
      // Invariant: a backend in service has its event counters from 0 (an existing one keeps its
      // count): a series born at its first event would show that event to no increase() or rate().
      for (const counter of Object.values(this.backendEvents)) counter.labels(name).inc(0);
    }
  }

  /**
   * A reload removed this backend: its current-state gauges go at once (from then on nothing
   * updates them: the scrape stops, /metrics refreshes the backends in service, and a frozen last
   * value would read as current while its last requests drain). Returns the removal's token for
   * backendDrained.
   */
  backendRemoved(backend: string): number {
    for (const gauge of Object.values(this.backendGauges)) gauge.remove(backend);
    this.removals.set(backend, ++this.removalSeq);
    return this.removalSeq;
  }

  /**
   * The requests of the removal `token` names have drained: the backend's series go, unless a
   * reload has brought the name back meanwhile (they are that backend's), or removed it again.
   * Invariant: only a name's latest removal drops its series, so an older drain that ends after
   * the name came back and went again leaves the newer removal's requests counted as the backend's.
   */
  backendDrained(backend: string, token: number): void {
    if (this.inService.has(backend) || this.removals.get(backend) !== token) return;
    this.removals.delete(backend);
    this.removeBackend(backend);
  }

  /**
   * The configured classes, at start and after a reload. A new class's series start at zero, so
   * rate() and absent() behave from the first scrape; a removed class's queue depth stays while
   * its requests still wait (setQueueDepths), then goes; its counters stay, as counters do.
   * Every class's targets become bucket boundaries of the TTFT and queue-wait histograms (TTFT
   * target) and of the TPOT and ITL ones (TPOT target), so that the share under a target is an
   * exact bucket. A reload sets the targets it configures; a boundary no class targets any more
   * is no longer exported, and comes back at its true count if a later reload targets it again
   * (BatchHistogram.setBuckets).
   */
  setClasses(classes: Readonly<Record<string, ClassTargets>>): void {
    const targets = Object.values(classes);
    const ttftMs = targets.map((t) => t.ttft_p99_ms);
    const tpotMs = targets.map((t) => t.tpot_p99_ms);
    for (const h of [this.ttft, this.queueWait]) h.setBuckets(bucketsWithTargets([], ttftMs));
    for (const h of [this.tpot, this.itl]) h.setBuckets(bucketsWithTargets([], tpotMs));
    const next = new Set(Object.keys(classes));
    for (const cls of this.configured) if (!next.has(cls)) this.unconfigured.add(cls);
    for (const cls of next) {
      this.unconfigured.delete(cls);
      if (this.configured.has(cls)) continue;
      this.classSeries(cls);
      this.queueDepth.labels(cls).set(0);
    }
    this.configured = next;
  }

  /**
   * The queue's depth by class: every configured class (0 when none of its requests waits), and a
   * class no longer configured while some of its requests still wait (its series goes at 0).
   */
  setQueueDepths(depth: Readonly<Record<string, number>>): void {
    // Own keys only: a class may be named like a method of every object (`toString`).
    const of = (cls: string) => (Object.hasOwn(depth, cls) ? (depth[cls] as number) : 0);
    for (const cls of this.configured) this.queueDepth.labels(cls).set(of(cls));
    for (const [cls, n] of Object.entries(depth)) {
      if (!this.configured.has(cls) && n > 0) this.unconfigured.add(cls);
    }
    for (const cls of this.unconfigured) {
      const n = of(cls);
      if (n > 0) this.queueDepth.labels(cls).set(n);
      else {
        this.queueDepth.remove(cls);
        this.unconfigured.delete(cls);
      }
    }
  }

  setStoreDegraded(degraded: boolean): void {
    this.storeDegraded.set(degraded ? 1 : 0);
  }

  observeOverheadMs(ms: number): void {
    this.overhead.observe(ms / 1000);
  }

  observePredictionError(cls: string, ratio: number): void {
    let h = this.predictionErrorByClass.get(cls);
    if (h === undefined) {
      h = this.predictionError.labels(cls);
      this.predictionErrorByClass.set(cls, h);
    }
    h.observe(ratio);
  }

  /** The Prometheus text exposition; serve it with `contentType`. */
  render(): Promise<string> {
    return this.registry.metrics();
  }

  private classSeries(cls: string): ClassSeries {
    let c = this.series.get(cls);
    if (c === undefined) {
      const slaMet = this.slaMet.labels(cls);
      const slaJudged = this.slaJudged.labels(cls);
      // A configured class's SLA counters exist from the start so rate() works from the first scrape.
      slaMet.inc(0);
      slaJudged.inc(0);
      c = {
        slaMet,
        slaJudged,
        admitted: new Map(),
        refused: new Map(),
        undecided: new Map(),
        backends: new Map(),
      };
      this.series.set(cls, c);
    }
    return c;
  }

  private bundle(c: ClassSeries, cls: string, backend: string): SeriesBundle {
    let s = c.backends.get(backend);
    if (s === undefined) {
      s = {
        ttft: this.ttft.labels(cls, backend),
        tpot: this.tpot.labels(cls, backend),
        itl: this.itl.labels(cls, backend),
        e2e: this.e2e.labels(cls, backend),
        queue: this.queueWait.labels(cls, backend),
        requests: new Map(),
      };
      c.backends.set(backend, s);
    }
    return s;
  }
}

export function createMetrics(
  classes: Readonly<Record<string, ClassTargets>>,
  opts: MetricsOptions = {},
): GatewayMetrics {
  return new GatewayMetrics(classes, opts);
}

/** A figure known now is set; one unknown now (null) has no series: a stale value is not a measurement. */
function setOrDrop(gauge: Gauge<'backend'>, backend: string, v: number | null | undefined): void {
  if (v === undefined) return;
  if (v === null) gauge.remove(backend);
  else gauge.labels(backend).set(v);
}
