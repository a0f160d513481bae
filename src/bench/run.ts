// The open-loop run: requests leave on a schedule fixed in advance by the seed (never "when the
// previous one finished"), optionally capped at C in flight like vLLM's --max-concurrency, and
// the run lasts until the last response ends. Scripts call runBench directly; the CLI wraps it.
import { setMaxListeners } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request } from 'undici';
import { Rng } from '../sim/rng.ts';
import { arrivalOffsets } from './arrivals.ts';
import { type ClientContext, type EndpointKind, type RequestRecord, sendRequest } from './client.ts';
import { type BenchMetrics, computeMetrics, type MetricName, type Slo } from './metrics.ts';
import { createProgress } from './progress.ts';
import { formatTable, type RunInfo, resultJson } from './report.ts';
import {
  createWorkload,
  takeRequests,
  type Workload,
  type WorkloadName,
  type WorkloadParams,
  type WorkloadRequest,
} from './workloads.ts';

export interface BenchOptions {
  /** Base URL of the server or gateway, without /v1 (e.g. http://127.0.0.1:8000). */
  target: string;
  /**
   * More instances of the same gateway: requests rotate over `target` and these, one each in
   * turn, as a round-robin load balancer in front of them would send them.
   */
  moreTargets?: readonly string[];
  /** Default 'chat' (/v1/chat/completions). */
  endpoint?: EndpointKind;
  /** Default: the first id of GET /v1/models. */
  model?: string;
  /** Default 'sharegpt'. A Workload object is used as given (its first N requests). */
  workload?: WorkloadName | Workload;
  workloadParams?: WorkloadParams;
  /** Default 1000, or unbounded when durationS is given. */
  requests?: number;
  /** Stop sending new requests after this many seconds; in-flight ones finish. */
  durationS?: number;
  /** Requests per second; default Infinity (all at t = 0). */
  rate?: number;
  /** Gamma shape of the gaps; 1 = Poisson (default). */
  burstiness?: number;
  /** At most this many requests in flight (vLLM's --max-concurrency). */
  concurrency?: number;
  /** Default 0. */
  seed?: number;
  slo?: Slo;
  /** Default [99]; the median is always reported. */
  percentiles?: number[];
  /** Default ttft, tpot, itl, e2el. */
  metrics?: MetricName[];
  /** Sent with every request (e.g. authorization, x-slagate-class). */
  headers?: Record<string, string>;
  /** Send each request's class hint as x-slagate-class. Default false. */
  classHints?: boolean;
  /** Send conversation ids as x-session-id. Default true. */
  sessionIds?: boolean;
  label?: string;
  /** Keep vLLM's per-request arrays (and statuses, headers) in the JSON. Default false. */
  detailed?: boolean;
  /** Per-request limit on waiting for headers and between body chunks. Default 6 h (vLLM's). */
  timeoutMs?: number;
  /** Progress bar on stderr; default: when stderr is a terminal. */
  progress?: boolean;
  /** Aborting stops new sends and cancels requests in flight; the result covers what ran. */
  signal?: AbortSignal;
  /**
   * Called once as the run's clock starts (the time 0 of every record's startTime), after the
   * workload was built and just before the first send: to time an event into the load.
   */
  onStart?: () => void;
}

export interface BenchResult {
  metrics: BenchMetrics;
  records: RequestRecord[];
  info: RunInfo;
  /** The object --save-result writes. */
  json: Record<string, unknown>;
  /** vLLM's printed table. */
  table: string;
  /**
   * The run's clock zero on the system's monotonic clock (process.hrtime, in ms): a record's
   * startTime is seconds after it. Every process on the machine reads the same monotonic clock (the
   * wall clock may be slewed between two readings), so another process's marks, taken as
   * process.hrtime, can be set against the records.
   */
  clockZeroMonotonicMs: number;
}

const DEFAULT_REQUESTS = 1000;
const DEFAULT_TIMEOUT_MS = 6 * 60 * 60 * 1000;
export const DEFAULT_METRICS: readonly MetricName[] = ['ttft', 'tpot', 'itl', 'e2el'];

/** Slots for at most `limit` requests in flight, granted in arrival order. */
class Slots {
  private free: number;
  private readonly waiters: (() => void)[] = [];
  constructor(limit: number) {
    this.free = limit;
  }
  /** Resolves true when it had to wait for a slot, false when one was free. */
  acquire(): Promise<boolean> {
    if (this.free > 0) {
      this.free--;
      return Promise.resolve(false);
    }
    return new Promise((resolve) => this.waiters.push(() => resolve(true)));
  }
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.free++;
  }
  /** Wakes every waiter (used on abort, after which nothing is sent). */
  drain(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}

export function baseUrl(target: string): string {
  return target.replace(/\/+$/, '');
}

export async function fetchFirstModel(
  target: string,
  headers: Record<string, string>,
  dispatcher?: Agent,
): Promise<string> {
  const url = `${baseUrl(target)}/v1/models`;
  let res: Awaited<ReturnType<typeof request>>;
  try {
    res = await request(url, { headers, ...(dispatcher ? { dispatcher } : {}) });
  } catch (err) {
    throw new Error(`cannot reach ${url}: ${(err as Error).message}`);
  }
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`GET ${url} returned ${res.statusCode}: ${text.slice(0, 200)}`);
  const id = (JSON.parse(text) as { data?: { id?: unknown }[] }).data?.[0]?.id;
  if (typeof id !== 'string') throw new Error(`GET ${url} lists no models; pass --model`);
  return id;
}

function timestamp(d: Date): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}

/** Throws on options that cannot describe a run (the CLI reports these as usage errors). */
export function checkOptions(o: BenchOptions): void {
  const rate = o.rate ?? Number.POSITIVE_INFINITY;
  const burstiness = o.burstiness ?? 1;
  const positive = (name: string, v: number | undefined, integer: boolean) => {
    if (v === undefined) return;
    if (!(v > 0) || (integer && !Number.isInteger(v))) {
      throw new Error(`${name} must be a positive ${integer ? 'whole number' : 'number'}, got ${v}`);
    }
  };
  positive('rate', rate, false);
  positive('burstiness', burstiness, false);
  positive('requests', o.requests, true);
  positive('concurrency', o.concurrency, true);
  positive('duration', o.durationS, false);
  positive('timeout', o.timeoutMs, false);
  // Infinity passes "positive": a duration without end schedules without end (a send loop that
  // never yields), and undici refuses a timer without end.
  if (o.durationS !== undefined && !Number.isFinite(o.durationS)) {
    throw new Error('duration must be a finite number of seconds (leave it out for no limit)');
  }
  if (o.timeoutMs !== undefined && !Number.isFinite(o.timeoutMs)) {
    throw new Error('timeout must be a finite number of seconds');
  }
  if (o.requests === undefined && o.durationS !== undefined && rate === Number.POSITIVE_INFINITY) {
    if (o.concurrency === undefined) {
      throw new Error('a duration with an unlimited rate needs a concurrency or a request count');
    }
  }
  for (const p of o.percentiles ?? []) {
    if (!(p >= 0 && p <= 100)) throw new Error(`percentiles must be within 0..100, got ${p}`);
  }
}

export async function runBench(o: BenchOptions): Promise<BenchResult> {
  const rate = o.rate ?? Number.POSITIVE_INFINITY;
  const burstiness = o.burstiness ?? 1;
  checkOptions(o);
  const seed = o.seed ?? 0;
  const endpoint = o.endpoint ?? 'chat';
  const headers = { ...(o.headers ?? {}) };
  const selected = o.metrics ?? [...DEFAULT_METRICS];
  const percentiles = o.percentiles ?? [99];
  const durationS = o.durationS ?? Number.POSITIVE_INFINITY;

  // Request count: given, else what the rate sends in the duration, else unbounded (closed by
  // the duration under a concurrency cap), else vLLM's default of 1000.
  const count =
    o.requests ??
    (o.durationS === undefined
      ? DEFAULT_REQUESTS
      : rate === Number.POSITIVE_INFINITY
        ? Number.POSITIVE_INFINITY
        : // Less a rounding: 0.07 × 100 is 7.000000000000001 in floating point, and 7 requests.
          Math.ceil(rate * o.durationS - 1e-9));

  const workload =
    typeof o.workload === 'object'
      ? o.workload
      : createWorkload(o.workload ?? 'sharegpt', seed, o.workloadParams ?? {});
  // A bounded run is generated before the clock starts, so prompt building never delays a send.
  const pregenerated = Number.isFinite(count) ? takeRequests(workload, count) : null;
  const nextRequest = (i: number): WorkloadRequest =>
    pregenerated ? (pregenerated[i] as WorkloadRequest) : workload.next();
  // A count from the duration ends its schedule at the duration (ceil(rate × S) / rate may be past
  // it, and what is scheduled past it would not be sent: a count that varied with the seed).
  const endAt =
    o.requests === undefined && o.durationS !== undefined && Number.isFinite(count)
      ? Math.min(count / rate, o.durationS)
      : count / rate;
  const offsets = Number.isFinite(count)
    ? arrivalOffsets(count, rate, burstiness, new Rng(seed).fork('arrivals'), endAt)
    : null;

  const dispatcher = new Agent({ connections: o.concurrency ?? null, pipelining: 1 });
  const showProgress = o.progress ?? process.stderr.isTTY === true;
  const progress = showProgress ? createProgress(pregenerated?.length ?? null) : null;
  const slots = o.concurrency !== undefined ? new Slots(o.concurrency) : null;
  // One internal signal follows the caller's: every request in flight listens to it, so it
  // may have thousands of listeners, which would trip Node's leak warning on the caller's.
  const stop = new AbortController();
  setMaxListeners(0, stop.signal);
  const onAbort = () => {
    stop.abort();
    slots?.drain();
  };
  o.signal?.addEventListener('abort', onAbort, { once: true });
  if (o.signal?.aborted) onAbort();
  try {
    const model = o.model ?? (await fetchFirstModel(o.target, headers, dispatcher));
    const path = `/v1/${endpoint === 'chat' ? 'chat/completions' : 'completions'}`;
    const url = `${baseUrl(o.target)}${path}`;
    const date = timestamp(new Date());
    const t0 = performance.now();
    const clock = () => (performance.now() - t0) / 1000;
    o.onStart?.();
    const ctx: ClientContext = {
      dispatcher,
      url,
      endpoint,
      model,
      ignoreEos: workload.ignoreEos,
      headers,
      sendClassHint: o.classHints ?? false,
      sendSessionId: o.sessionIds ?? true,
      clock,
      timeoutMs: o.timeoutMs ?? DEFAULT_TIMEOUT_MS,
      signal: stop.signal,
    };

    const contexts = [ctx, ...(o.moreTargets ?? []).map((t) => ({ ...ctx, url: `${baseUrl(t)}${path}` }))];
    const inflight: Promise<RequestRecord>[] = [];
    // Scheduled requests the concurrency cap held until past the duration: never sent, and said so.
    let notSent = 0;
    // When the loop last got a slot it had waited for.
    let slotWaitEndedAt = Number.NEGATIVE_INFINITY;
    for (let i = 0; i < count; i++) {
      const arrival = offsets?.[i] ?? 0;
      // The schedule's last arrival is at the duration itself (arrivals.ts), give or take a
      // rounding: it is sent, in every run alike.
      if (stop.signal.aborted || arrival > durationS + 1e-6) break;
      const wait = arrival - clock();
      if (wait > 0) {
        try {
          await sleep(wait * 1000, undefined, { signal: stop.signal });
        } catch {
          break; // aborted while waiting
        }
      }
      const waitedForSlot = slots !== null && (await slots.acquire());
      // Queued: since its arrival, when it or a request ahead of it had to wait for a slot after
      // it arrived (the loop sends in order); else 0 (a timer firing late is not a queue).
      if (waitedForSlot) slotWaitEndedAt = clock();
      const queueTime = slotWaitEndedAt > arrival ? Math.max(0, clock() - arrival) : 0;
      // Only a wait for a free slot can carry a send past the duration (a timer firing late by a
      // millisecond must not drop the last scheduled request in one run and not in another).
      // A run with no schedule (no rate) ends at the duration whatever it waited for.
      if (stop.signal.aborted || ((waitedForSlot || offsets === null) && clock() > durationS)) {
        slots?.release();
        // This one and every later one of the schedule were due by the duration (arrivals.ts).
        if (!stop.signal.aborted && offsets !== null) {
          for (let j = i; j < count; j++) if ((offsets[j] ?? 0) <= durationS + 1e-6) notSent++;
        }
        break;
      }
      inflight.push(
        sendRequest(contexts[i % contexts.length] as ClientContext, nextRequest(i), queueTime).then(
          (record) => {
            slots?.release();
            progress?.tick(record.success);
            return record;
          },
        ),
      );
    }
    const records = await Promise.all(inflight);
    const duration = clock();
    progress?.done();
    const metrics = computeMetrics(records, duration, { percentiles, ...(o.slo ? { slo: o.slo } : {}) });
    const info: RunInfo = {
      date,
      backend: endpoint === 'chat' ? 'openai-chat' : 'openai',
      label: o.label ?? null,
      modelId: model,
      tokenizerId: 'cl100k_base',
      numPrompts: records.length,
      notSent: offsets === null ? null : notSent,
      requestRate: rate,
      burstiness,
      maxConcurrency: o.concurrency ?? null,
      durationS: duration,
      workload: workload.name,
      seed,
      slo: o.slo ?? null,
      selectedMetrics: selected,
    };
    return {
      metrics,
      records,
      info,
      json: resultJson(metrics, info, records, o.detailed ?? false),
      table: formatTable(metrics, info),
      clockZeroMonotonicMs: monotonicMs() - (performance.now() - t0),
    };
  } finally {
    progress?.done();
    o.signal?.removeEventListener('abort', onAbort);
    await dispatcher.close();
  }
}

/** The system's monotonic clock in ms (the clock performance.now() counts on from its own origin). */
export function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}
