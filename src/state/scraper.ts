// Scrapes each backend's vLLM /metrics on its own loop: one small GET per backend per interval,
// never two at once for one backend, each bounded by a timeout and a body-size cap.
//
// Invariants:
// - STALE MEANS SATURATED (research/reliability.md item 16, after the EPP): a backend never
//   scraped, or whose last good scrape is older than `staleAfterMs`, reports `saturated: true`, and
//   its readers take none of its figures as current (the router's view and the exported gauges
//   drop them), so a silent backend's last idle-looking scrape is never read as now; the router's
//   load comes from the gateway's own in-flight counts, not from scrapes;
// - after close() resolves the scraper owns no timer, socket or in-flight request.

import { Agent, request } from 'undici';
import { parseVllmMetrics, type VllmMetrics } from './vllm-metrics.ts';

export interface ScrapeTarget {
  name: string;
  /** Base URL of the backend's OpenAI server; metrics are read from `<url>/metrics`. */
  url: string;
}

export interface BackendTelemetry {
  running: number | null;
  waiting: number | null;
  /** 0–1. */
  kvCacheUsage: number | null;
  /** Prefix cache lookups and hits in tokens since the engine started. */
  prefixQueries: number | null;
  prefixHits: number | null;
  /** Hits / queries between the last two scrapes that saw lookups; else since the engine started. */
  prefixHitRate: number | null;
  blockSize: number | null;
  numGpuBlocks: number | null;
  /** Clock time (the `now` option) of the last good scrape; null if never. */
  scrapedAt: number | null;
  ageMs: number | null;
  /** Never scraped, or the data is older than the staleness threshold. */
  saturated: boolean;
  lastError: string | null;
  consecutiveFailures: number;
}

/**
 * The telemetry as figures of now, or null when there are none: never scraped, or the last good
 * scrape stale (saturated). What routing and the exported gauges read; /admin/state shows the
 * last values with their age.
 */
export function currentTelemetry(t: BackendTelemetry | null | undefined): BackendTelemetry | null {
  return t === null || t === undefined || t.saturated ? null : t;
}

/** A larger /metrics body is refused: 8 MiB (vLLM's is tens of KiB). */
const MAX_BODY_BYTES = 8 * 1024 * 1024;

export interface ScraperOptions {
  intervalMs: number;
  /** Data older than this marks the backend saturated. Default 3 × intervalMs. */
  staleAfterMs?: number;
  /** Bound on one scrape (connect to last byte). Default max(100 ms, 2 × intervalMs). */
  timeoutMs?: number;
  now?: () => number;
  /**
   * Called when a backend's engine restarted (a later process start time, or a counter of its went
   * down, between two scrapes): a new process holds nothing of what the old one had cached.
   */
  onRestart?: (backend: string, startS: { before: number | null; after: number | null }) => void;
  /**
   * Called at every scrape whose page reports the process start time, its gauges there or not
   * (after onRestart, if both).
   */
  onStart?: (backend: string, startS: number) => void;
}

interface TargetState {
  name: string;
  metricsUrl: string;
  metrics: VllmMetrics | null;
  prefixHitRate: number | null;
  /** Wall-clock ms of the last good scrape (shown); its age is taken from scrapedMono. */
  scrapedAt: number | null;
  /** performance.now() of the same scrape: a wall clock stepped back or forth moves no age. */
  scrapedMono: number | null;
  lastError: string | null;
  consecutiveFailures: number;
  /** The process start time of the last page that had one, whether its gauges were there or not. */
  startS: number | null;
  timer: NodeJS.Timeout | null;
  inflight: { abort: AbortController; done: Promise<void> } | null;
  removed: boolean;
}

export class TelemetryScraper {
  readonly staleAfterMs: number;
  readonly #intervalMs: number;
  readonly #timeoutMs: number;
  readonly #now: () => number;
  readonly #onRestart:
    | ((backend: string, startS: { before: number | null; after: number | null }) => void)
    | null;
  readonly #onStart: ((backend: string, startS: number) => void) | null;
  readonly #agent = new Agent({ connections: 2, keepAliveTimeout: 10_000 });
  readonly #targets = new Map<string, TargetState>();
  #closed = false;

  constructor(opts: ScraperOptions, targets: readonly ScrapeTarget[] = []) {
    this.#intervalMs = opts.intervalMs;
    this.staleAfterMs = opts.staleAfterMs ?? 3 * opts.intervalMs;
    this.#timeoutMs = opts.timeoutMs ?? Math.max(100, 2 * opts.intervalMs);
    this.#now = opts.now ?? Date.now;
    this.#onRestart = opts.onRestart ?? null;
    this.#onStart = opts.onStart ?? null;
    this.setTargets(targets);
  }

  /** Starts scraping new targets at once, stops removed ones; a changed URL starts afresh. */
  setTargets(targets: readonly ScrapeTarget[]): void {
    if (this.#closed) return;
    const wanted = new Map(targets.map((t) => [t.name, metricsUrl(t.url)]));
    for (const [name, t] of this.#targets) {
      if (wanted.get(name) !== t.metricsUrl) this.#stop(t);
    }
    for (const [name, url] of wanted) {
      if (this.#targets.has(name)) continue;
      const t: TargetState = {
        name,
        metricsUrl: url,
        metrics: null,
        prefixHitRate: null,
        scrapedAt: null,
        scrapedMono: null,
        lastError: null,
        consecutiveFailures: 0,
        startS: null,
        timer: null,
        inflight: null,
        removed: false,
      };
      this.#targets.set(name, t);
      void this.#run(t);
    }
  }

  get(name: string): BackendTelemetry | undefined {
    const t = this.#targets.get(name);
    if (t === undefined) return undefined;
    const m = t.metrics;
    const ageMs = t.scrapedMono === null ? null : performance.now() - t.scrapedMono;
    return {
      running: m?.running ?? null,
      waiting: m?.waiting ?? null,
      kvCacheUsage: m?.kvCacheUsage ?? null,
      prefixQueries: m?.prefixQueries ?? null,
      prefixHits: m?.prefixHits ?? null,
      prefixHitRate: t.prefixHitRate,
      blockSize: m?.blockSize ?? null,
      numGpuBlocks: m?.numGpuBlocks ?? null,
      scrapedAt: t.scrapedAt,
      ageMs,
      saturated: ageMs === null || ageMs > this.staleAfterMs,
      lastError: t.lastError,
      consecutiveFailures: t.consecutiveFailures,
    };
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const pending = [...this.#targets.values()].map((t) => this.#stop(t));
    await Promise.all(pending);
    await this.#agent.destroy();
  }

  #stop(t: TargetState): Promise<void> {
    t.removed = true;
    if (this.#targets.get(t.name) === t) this.#targets.delete(t.name);
    if (t.timer !== null) clearTimeout(t.timer);
    t.timer = null;
    if (t.inflight === null) return Promise.resolve();
    t.inflight.abort.abort(new Error('scrape target removed'));
    return t.inflight.done;
  }

  async #run(t: TargetState): Promise<void> {
    t.timer = null;
    if (t.removed) return;
    const started = performance.now();
    const abort = new AbortController();
    const deadline = setTimeout(
      () => abort.abort(new Error(`scrape timed out after ${this.#timeoutMs} ms`)),
      this.#timeoutMs,
    );
    const done = this.#scrape(t, abort.signal).finally(() => clearTimeout(deadline));
    t.inflight = { abort, done };
    await done;
    t.inflight = null;
    if (t.removed || this.#closed) return;
    const wait = Math.max(0, this.#intervalMs - (performance.now() - started));
    t.timer = setTimeout(() => void this.#run(t), wait);
    t.timer.unref();
  }

  async #scrape(t: TargetState, signal: AbortSignal): Promise<void> {
    try {
      const res = await request(t.metricsUrl, { dispatcher: this.#agent, signal });
      if (res.statusCode !== 200) {
        await res.body.dump();
        throw new Error(`/metrics answered ${res.statusCode}`);
      }
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of res.body) {
        size += (chunk as Buffer).length;
        if (size > MAX_BODY_BYTES) {
          res.body.destroy();
          throw new Error(`/metrics body over ${MAX_BODY_BYTES} bytes`);
        }
        chunks.push(chunk as Buffer);
      }
      const metrics = parseVllmMetrics(Buffer.concat(chunks).toString('utf8'));
      if (t.removed) return;
      // A new process: what the old one counted says nothing about the new one's hit rate. Seen by
      // its start time on any page that has one, the scheduler's gauges there or not: a server run
      // with --disable-log-stats exports no vllm:* series, and its restarts still end what the
      // index held of the dead process.
      const gauges = metrics.running !== null || metrics.waiting !== null;
      const restart = restarted(t.startS, gauges ? t.metrics : null, metrics);
      if (restart) this.#onRestart?.(t.name, { before: t.startS, after: metrics.processStartS });
      if (metrics.processStartS !== null) {
        t.startS = metrics.processStartS;
        this.#onStart?.(t.name, metrics.processStartS);
      }
      if (!gauges) {
        // The dead process's figures go, and with them its counters as the baseline of the new
        // one's next page; its cache config stays (a restarted server almost always has the same,
        // and the prefix index is sized on it) until the new process's page gives its own. Never
        // scraped, the new process reads as saturated, as any backend not scraped yet does.
        if (restart) {
          t.metrics = t.metrics === null ? null : cacheConfigOf(t.metrics, metrics.processStartS);
          t.prefixHitRate = null;
          t.scrapedAt = null;
          t.scrapedMono = null;
        }
        throw new Error('/metrics has no vllm:num_requests_running or vllm:num_requests_waiting');
      }
      t.prefixHitRate = restart ? hitRate(null, metrics, null) : hitRate(t.metrics, metrics, t.prefixHitRate);
      t.metrics = metrics;
      t.scrapedAt = this.#now();
      t.scrapedMono = performance.now();
      t.lastError = null;
      t.consecutiveFailures = 0;
    } catch (e) {
      const reason = signal.aborted ? signal.reason : e;
      t.lastError = reason instanceof Error ? reason.message : String(reason);
      t.consecutiveFailures++;
    }
  }
}

function metricsUrl(base: string): string {
  return `${base.replace(/\/+$/, '')}/metrics`;
}

/** `m`'s cache config alone, every gauge and counter unknown. */
function cacheConfigOf(m: VllmMetrics, processStartS: number | null): VllmMetrics {
  return {
    running: null,
    waiting: null,
    kvCacheUsage: null,
    prefixQueries: null,
    prefixHits: null,
    prefixHitRateGauge: null,
    blockSize: m.blockSize,
    numGpuBlocks: m.numGpuBlocks,
    processStartS,
  };
}

/**
 * A new server process: it started later than the last start time seen on any page (`startS`;
 * process_start_time_seconds, when exported), or a prefix-cache counter went down from the last
 * good page's of the current process (`prev`: it counts from 0 again; none on a page without the
 * gauges). The start time also sees a process that died
 * before it counted anything, whose successor's counters have nothing to fall from. It takes the
 * start time for one constant per process, as vLLM's prometheus_client reports it (read once from
 * /proc); an exporter whose value drifts upward would read as restarting.
 */
function restarted(startS: number | null, prev: VllmMetrics | null, cur: VllmMetrics): boolean {
  const later = startS !== null && cur.processStartS !== null && cur.processStartS > startS;
  if (later) return true;
  if (prev === null) return false;
  const fell = (a: number | null, b: number | null) => a !== null && b !== null && b < a;
  return fell(prev.prefixQueries, cur.prefixQueries) || fell(prev.prefixHits, cur.prefixHits);
}

/** Hit rate over the last interval that saw lookups; else the previous one; else since start. */
function hitRate(prev: VllmMetrics | null, cur: VllmMetrics, prevRate: number | null): number | null {
  const q = cur.prefixQueries;
  const h = cur.prefixHits;
  // vLLM v0's gauge reads -1 where prefix caching is off: not a rate, and not measured.
  if (q === null || h === null) {
    const g = cur.prefixHitRateGauge;
    return g !== null && g >= 0 && g <= 1 ? g : null;
  }
  const pq = prev?.prefixQueries;
  const ph = prev?.prefixHits;
  // A counter that went down means the engine restarted: the old values say nothing any more.
  if (pq != null && ph != null && q >= pq && h >= ph) {
    if (q > pq) return (h - ph) / (q - pq);
    if (prevRate !== null) return prevRate;
  }
  return q > 0 ? h / q : null;
}
