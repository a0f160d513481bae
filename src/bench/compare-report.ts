// The figures of one `bench compare` run and how a comparison is printed and saved. Pure
// functions of the bench records, the replicas' counters and the runs, so each can be checked
// on hand-made data. A figure that was not measured is null (printed `–`), never 0.
import type { RequestRecord } from './client.ts';
import { type BenchMetrics, percentile, type Slo } from './metrics.ts';

/** DistServe's goodput rate: the highest arrival rate at which at least this share meets the SLO. */
export const GOODPUT_ATTAINMENT = 0.9;

export interface RunFigures {
  /** Requests sent. */
  requests: number;
  /** Successful (HTTP 200 and a complete stream). */
  ok: number;
  /** Answered with HTTP 429. */
  refused: number;
  /** Every other non-success (other statuses, network errors, broken streams); ok + refused + failed = requests. */
  failed: number;
  /** vLLM's request_goodput, req/s; null without an SLO. */
  goodput: number | null;
  /** Requests meeting every target / requests sent (refused and failed are misses); null without an SLO. */
  attainment: number | null;
  /** Over successful requests; null when none succeeded. */
  ttftP50Ms: number | null;
  ttftP99Ms: number | null;
  /** Over successful requests with more than one output token; null when there are none. */
  tpotP99Ms: number | null;
  refusedShare: number | null;
  failedShare: number | null;
  /** Σ prefix-cache hits / Σ queries (tokens) over the replicas during the run; null with no queries. */
  prefixHitRate: number | null;
  /** Successful requests per backend, from each response's x-slagate-backend header. */
  backendRequests: Record<string, number>;
  /** The busiest backend's share of successful requests ÷ (1/replicas): 1 is perfectly even. */
  maxBackendShare: number | null;
}

export interface PrefixCounters {
  hits: number;
  queries: number;
  /**
   * Each replica's process_start_time_seconds, in order (null where it exports none): a replica
   * that restarted during a run counts from 0 again, and what it counted before is lost.
   */
  starts?: readonly (number | null)[];
}

/** Sum over every series of a Prometheus counter (`name` exactly, any labels) in exposition text. */
export function sumCounter(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = /^([^\s{]+)(?:\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m?.[1] !== name) continue;
    const v = Number(m[2]);
    if (Number.isFinite(v)) sum += v;
  }
  return sum;
}

/**
 * The replicas' hit rate over a run, from their counters before and after it; null when nothing
 * was queried, or when a replica restarted meanwhile (a later start time, or counters that fell):
 * the difference would drop what it counted before its crash, so it is not the run's figure.
 */
export function prefixHitRate(before: PrefixCounters, after: PrefixCounters): number | null {
  const queries = after.queries - before.queries;
  const hits = after.hits - before.hits;
  if (queries < 0 || hits < 0) return null;
  const b = before.starts;
  const a = after.starts;
  if (b !== undefined && a !== undefined && b.some((s, i) => s !== (a[i] ?? null))) return null;
  return queries > 0 ? hits / queries : null;
}

const share = (n: number, of: number): number | null => (of > 0 ? n / of : null);

export function runFigures(
  records: readonly RequestRecord[],
  metrics: BenchMetrics,
  replicas: number,
  slo: Slo | undefined,
  prefix: number | null,
): RunFigures {
  const requests = records.length;
  const ok = records.filter((r) => r.success);
  const refused = records.filter((r) => !r.success && r.status === 429).length;
  // No prototype: a backend may be named like a method of every object (`toString`).
  const backendRequests: Record<string, number> = Object.create(null);
  for (const r of ok) {
    const b = r.headers['x-slagate-backend'];
    if (b !== undefined) backendRequests[b] = (backendRequests[b] ?? 0) + 1;
  }
  const busiest = Math.max(0, ...Object.values(backendRequests));
  const hasSlo = slo !== undefined && Object.values(slo).some((v) => v !== undefined);
  const withTpot = ok.some((r) => r.outputLen > 1);
  // From the records: the run's own --percentiles need not hold 99 (numpy's linear method, as metrics.ts).
  const p99Ms = (values: number[]): number | null => {
    if (values.length === 0) return null;
    values.sort((a, b) => a - b);
    return 1000 * percentile(values, 99);
  };
  return {
    requests,
    ok: ok.length,
    refused,
    failed: requests - ok.length - refused,
    goodput: hasSlo ? metrics.requestGoodput : null,
    attainment: hasSlo ? share(metrics.goodCompleted, requests) : null,
    ttftP50Ms: ok.length > 0 ? metrics.ttft.median : null,
    ttftP99Ms: p99Ms(ok.map((r) => r.ttft)),
    tpotP99Ms: withTpot
      ? p99Ms(ok.filter((r) => r.outputLen > 1).map((r) => (r.latency - r.ttft) / (r.outputLen - 1)))
      : null,
    refusedShare: share(refused, requests),
    failedShare: share(requests - ok.length - refused, requests),
    prefixHitRate: prefix,
    backendRequests,
    maxBackendShare: busiest > 0 ? (busiest / ok.length) * replicas : null,
  };
}

/**
 * The highest rate whose attainment is at least 0.9, or null when none is (or none was
 * measured). Taken literally over the rates run: a passing rate above a failing one still counts.
 */
export function goodputRate(points: readonly { rate: number; attainment: number | null }[]): number | null {
  let best: number | null = null;
  for (const p of points) {
    if (p.attainment !== null && p.attainment >= GOODPUT_ATTAINMENT && (best === null || p.rate > best)) {
      best = p.rate;
    }
  }
  return best;
}

/** A rate as JSON can hold it: Infinity is "inf", as vLLM writes request_rate. */
export function jsonRate(rate: number): number | 'inf' {
  return rate === Number.POSITIVE_INFINITY ? 'inf' : rate;
}

/** What the table and the JSON need of a run. */
export interface ReportedRun {
  policy: string;
  router: string;
  scheduler: string;
  rate: number;
  /** Why the run has no figures (it could not start, or it was interrupted); null when it completed. */
  error: string | null;
  figures: RunFigures | null;
  benchJson: Record<string, unknown> | null;
}

const DASH = '–';
const fixed = (v: number | null | undefined, digits: number) => (v == null ? DASH : v.toFixed(digits));
const pct = (v: number | null | undefined) => (v == null ? DASH : `${(v * 100).toFixed(1)}%`);
export const rateText = (r: number) => (r === Number.POSITIVE_INFINITY ? 'inf' : String(r));

const COLUMNS = [
  'policy',
  'rate',
  'ok/sent',
  'goodput/s',
  'attain',
  'P50 TTFT ms',
  'P99 TTFT ms',
  'P99 TPOT ms',
  'prefix hit',
  'refused',
  'failed',
  'max backend',
] as const;

function align(rows: string[][]): string {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
  // The first column (labels) is left-aligned, numbers are right-aligned.
  return rows
    .map((r) =>
      r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  '),
    )
    .map((line) => line.trimEnd())
    .join('\n');
}

/** One row per policy × rate; with several rates, then each policy's goodput rate. */
export function formatCompareTable(
  runs: readonly ReportedRun[],
  goodputRates: Readonly<Record<string, number | null>>,
  sweep: boolean,
): string {
  const rows: string[][] = [[...COLUMNS]];
  for (const run of runs) {
    const f = run.figures;
    rows.push([
      run.policy,
      rateText(run.rate),
      // An interrupted run's partial figures say so: the requests it cut count among its failed.
      f === null
        ? run.error === null
          ? DASH
          : 'error'
        : `${f.ok}/${f.requests}${run.error === 'interrupted' ? ' interrupted' : ''}`,
      fixed(f?.goodput, 2),
      pct(f?.attainment),
      fixed(f?.ttftP50Ms, 1),
      fixed(f?.ttftP99Ms, 1),
      fixed(f?.tpotP99Ms, 2),
      pct(f?.prefixHitRate),
      pct(f?.refusedShare),
      pct(f?.failedShare),
      fixed(f?.maxBackendShare, 2),
    ]);
  }
  let out = `${align(rows)}\n`;
  if (sweep) {
    const gr: string[][] = [['policy', `goodput rate (attainment ≥ ${GOODPUT_ATTAINMENT * 100}%)`]];
    for (const [policy, rate] of Object.entries(goodputRates)) {
      gr.push([policy, rate === null ? DASH : rateText(rate)]);
    }
    out += `\n${align(gr)}\n`;
  }
  return out;
}

export interface CompareSettings {
  date: string;
  workload: string;
  seed: number;
  requests: number | null;
  durationS: number | null;
  rates: readonly number[];
  burstiness: number;
  slo: Slo | null;
  /** `profile` names the one profile of every replica, null for a mixed fleet (see `groups`). */
  fleet: {
    replicas: number;
    profile: string | null;
    groups: readonly { profile: string; replicas: number }[];
    timeScale: number;
  };
}

/** The object --save-result writes: settings, one entry per run (its bench JSON inside), goodput rates. */
export function compareJson(
  settings: CompareSettings,
  runs: readonly ReportedRun[],
  goodputRates: Readonly<Record<string, number | null>>,
): Record<string, unknown> {
  return {
    date: settings.date,
    workload: settings.workload,
    seed: settings.seed,
    requests: settings.requests,
    durationS: settings.durationS,
    rates: settings.rates.map(jsonRate),
    burstiness: jsonRate(settings.burstiness),
    slo: settings.slo,
    fleet: settings.fleet,
    runs: runs.map((run) => ({
      policy: run.policy,
      router: run.router,
      scheduler: run.scheduler,
      rate: jsonRate(run.rate),
      error: run.error,
      ...figuresJson(run.figures),
      bench: run.benchJson,
    })),
    goodputRate: Object.fromEntries(
      Object.entries(goodputRates).map(([p, r]) => [p, r === null ? null : jsonRate(r)]),
    ),
  };
}

/** Every figure key, null throughout when the run has no figures. */
function figuresJson(f: RunFigures | null): Record<string, unknown> {
  return {
    requests: f?.requests ?? null,
    ok: f?.ok ?? null,
    refused: f?.refused ?? null,
    failed: f?.failed ?? null,
    goodput: f?.goodput ?? null,
    attainment: f?.attainment ?? null,
    ttftP50Ms: f?.ttftP50Ms ?? null,
    ttftP99Ms: f?.ttftP99Ms ?? null,
    tpotP99Ms: f?.tpotP99Ms ?? null,
    refusedShare: f?.refusedShare ?? null,
    failedShare: f?.failedShare ?? null,
    prefixHitRate: f?.prefixHitRate ?? null,
    backendRequests: f?.backendRequests ?? null,
    maxBackendShare: f?.maxBackendShare ?? null,
  };
}
