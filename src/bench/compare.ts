// `bench compare`: the same workload and seed against each gateway policy, one run per
// (policy, rate), each on a fresh simulated fleet behind a fresh gateway, both child processes.
// Invariants: runs are strictly sequential and every process a run starts is stopped before the
// next one begins (try/finally, also on error), so no run shares the machine with another; every
// run sees the same workload, seed, arrivals, SLO and fleet settings, and only router.policy and
// scheduler.policy differ between the gateways of one rate.
import { renameSync, statSync, writeFileSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import { request } from 'undici';
import { stringify as stringifyYaml } from 'yaml';
import { getProfile } from '../sim/profiles.ts';
import {
  admissionLogPath,
  backendName,
  gatewayConfig,
  isMap,
  type PolicyItem,
  parsePolicyItem,
  readGatewayYaml,
} from './compare-config.ts';
import {
  type CompareSettings,
  compareJson,
  formatCompareTable,
  goodputRate,
  type PrefixCounters,
  prefixHitRate,
  type ReportedRun,
  runFigures,
  sumCounter,
} from './compare-report.ts';
import type { Slo } from './metrics.ts';
import {
  type ChildFleet,
  type ChildGateway,
  type FleetGroup,
  startChildFleets,
  startChildGateway,
  waitReady,
} from './processes.ts';
import { type BenchResult, checkOptions, runBench } from './run.ts';
import type { WorkloadName, WorkloadParams } from './workloads.ts';

export { type PolicyItem, parsePolicies, parsePolicyItem } from './compare-config.ts';
export type { FleetGroup } from './processes.ts';

export interface CompareOptions {
  /** Items as written (`round_robin`, `least_loaded/fcfs`) or parsed. */
  policies: readonly (string | PolicyItem)[];
  /** Default 'sharegpt'. */
  workload?: WorkloadName;
  workloadParams?: WorkloadParams;
  /** Arrival rates, req/s; several make a sweep. Default [Infinity]. */
  rates?: readonly number[];
  /** Per run; default runBench's (1000, or what the rate sends in durationS). */
  requests?: number;
  durationS?: number;
  /** Default 1. */
  burstiness?: number;
  /** Workload, arrivals and fleet seed. Default 0. */
  seed?: number;
  /** Needed for goodput, attainment and the goodput rate. */
  slo?: Slo;
  classHints?: boolean;
  /** Default 4. */
  replicas?: number;
  /** Default llama3-8b-h100. */
  profile?: string;
  /**
   * A mixed fleet: so many replicas of each profile, every profile serving one model. Instead of
   * `replicas` and `profile` (giving it with either is an error).
   */
  fleet?: readonly FleetGroup[];
  /** Default 1. */
  timeScale?: number;
  /** A gateway YAML merged into each generated config (see gatewayConfig). */
  gatewayYaml?: string;
  /** runBench's progress bar on stderr. Default false. */
  progress?: boolean;
  /** Called with one line as each run starts and ends. */
  onProgress?: (line: string) => void;
  /** Stops the current run (its partial figures are kept, marked interrupted) and skips the rest. */
  signal?: AbortSignal;
  /** Bound on waiting for the gateway's /readyz. Default 15 s. */
  readyTimeoutMs?: number;
  /** Called with the replicas' URLs once the gateway is ready, before the load starts (a fault to set). */
  beforeLoad?: (replicaUrls: readonly string[]) => Promise<void>;
  /**
   * The fleet changed under load, as an operator's reload changes it: the gateway starts with the
   * replicas `from` lists (indices into the fleet, which runs every replica from the start), and
   * `afterMs` into the load its config file is rewritten with those `to` lists and a SIGHUP sent.
   * One more is a scale-out, one fewer a scale-in (the run's `reconfigured` says whether the reload
   * was asked for before the load ended).
   */
  reconfigure?: { from: readonly number[]; to: readonly number[]; afterMs: number };
  /**
   * Called with the replicas' URLs as the load's clock starts (the time 0 of the records'
   * startTime): to time an event into the load (a fault).
   */
  onLoadStart?: (replicaUrls: readonly string[]) => void;
}

export interface CompareRun extends ReportedRun {
  bench: BenchResult | null;
  /** The gateway's admission log lines, parsed; null when the log did not go to a file. */
  admissionLog: Record<string, unknown>[] | null;
  /** The gateway's own /metrics as the load ended (text); null when it could not be read. */
  gatewayMetrics: string | null;
  /** With reconfigure: its reload was asked for before the load ended. */
  reconfigured: boolean;
}

export interface CompareResult extends CompareSettings {
  runs: CompareRun[];
  /** Per policy label: the highest rate with attainment ≥ 0.9, or null. */
  goodputRate: Record<string, number | null>;
  /** Every run completed. */
  ok: boolean;
  /** The aligned text table. */
  table: string;
  /** The object --save-result writes (no admission log lines). */
  json: Record<string, unknown>;
}

/** The replicas' own prefix-cache counters (vllm:prefix_cache_hits_total, …_queries_total), summed. */
export async function readPrefixCounters(urls: readonly string[]): Promise<PrefixCounters> {
  let hits = 0;
  let queries = 0;
  const starts: (number | null)[] = [];
  for (const url of urls) {
    const res = await request(`${url}/metrics`);
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new Error(`GET ${url}/metrics returned ${res.statusCode}`);
    hits += sumCounter(text, 'vllm:prefix_cache_hits_total');
    queries += sumCounter(text, 'vllm:prefix_cache_queries_total');
    starts.push(
      /^process_start_time_seconds \S+$/m.test(text) ? sumCounter(text, 'process_start_time_seconds') : null,
    );
  }
  return { hits, queries, starts };
}

/**
 * The replicas' hit rate over a run that began at `before`, read from them now; null (unmeasured)
 * when one of them cannot be read: a replica down at the end (a fault set by the caller) leaves
 * the run's other figures measured.
 */
export async function prefixHitAfter(
  before: PrefixCounters,
  urls: readonly string[],
): Promise<number | null> {
  const after = await readPrefixCounters(urls).catch(() => null);
  return after === null ? null : prefixHitRate(before, after);
}

/** The body of a GET of `url`, or null when it failed or did not answer 200 (a figure for the record only). */
async function readText(url: string): Promise<string | null> {
  try {
    const res = await request(url, { headersTimeout: 5_000, bodyTimeout: 5_000 });
    const text = await res.body.text();
    return res.statusCode === 200 ? text : null;
  } catch {
    return null;
  }
}

/** Its size now: a file named in --gateway-yaml may hold earlier runs' lines, which are not this run's. */
function sizeOf(path: string | null): number {
  if (path === null) return 0;
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}

/** The log's JSON lines from byte `from` on (the gateway flushes it on exit); null when it went to stdout. */
async function readAdmissionLog(
  path: string | null,
  from: number,
): Promise<Record<string, unknown>[] | null> {
  if (path === null) return null;
  let text: string;
  try {
    text = (await readFile(path)).subarray(from).toString('utf8');
  } catch {
    return []; // no request reached the log
  }
  const lines: Record<string, unknown>[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    try {
      const v: unknown = JSON.parse(line);
      if (isMap(v)) lines.push(v);
    } catch {
      // a torn last line (the gateway was killed) is not a record
    }
  }
  return lines;
}

const rateWords = (r: number) => (r === Number.POSITIVE_INFINITY ? 'rate inf' : `${r} req/s`);

function timestamp(d: Date): string {
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}

export async function runCompare(o: CompareOptions): Promise<CompareResult> {
  const items = o.policies.map((p) => (typeof p === 'string' ? parsePolicyItem(p) : p));
  if (items.length === 0) throw new Error('no policies to compare');
  const rates = [...(o.rates ?? [Number.POSITIVE_INFINITY])];
  const groups = fleetGroups(o);
  const replicas = groups.reduce((n, g) => n + g.replicas, 0);
  const timeScale = o.timeScale ?? 1;
  const seed = o.seed ?? 0;
  const burstiness = o.burstiness ?? 1;
  if (!(timeScale > 0 && Number.isFinite(timeScale))) throw new Error(`bad time scale ${timeScale}`);
  const model = fleetModel(groups);
  const benchBase = {
    workload: o.workload ?? 'sharegpt',
    ...(o.workloadParams ? { workloadParams: o.workloadParams } : {}),
    ...(o.requests !== undefined ? { requests: o.requests } : {}),
    ...(o.durationS !== undefined ? { durationS: o.durationS } : {}),
    ...(o.slo ? { slo: o.slo } : {}),
    burstiness,
    seed,
    model,
    classHints: o.classHints ?? false,
    progress: o.progress ?? false,
  };
  for (const rate of rates) checkOptions({ target: 'http://127.0.0.1', ...benchBase, rate });
  const user = o.gatewayYaml === undefined ? {} : await readGatewayYaml(o.gatewayYaml);
  const settings: CompareSettings = {
    date: timestamp(new Date()),
    workload: benchBase.workload,
    seed,
    requests: o.requests ?? null,
    durationS: o.durationS ?? null,
    rates,
    burstiness,
    slo: o.slo ?? null,
    fleet: {
      replicas,
      profile: groups.length === 1 ? groups[0]!.profile : null,
      groups: groups.map((g) => ({ ...g })),
      timeScale,
    },
  };

  const runs: CompareRun[] = [];
  const total = items.length * rates.length;
  for (const item of items) {
    for (const rate of rates) {
      if (o.signal?.aborted) break;
      const n = runs.length + 1;
      o.onProgress?.(
        `[${n}/${total}] ${item.label} at ${rateWords(rate)}: ${fleetWords(groups)} (time scale ${timeScale})`,
      );
      const run = await runOne(item, rate);
      runs.push(run);
      o.onProgress?.(
        run.error !== null && run.figures === null
          ? `[${n}/${total}] ${item.label} at ${rateWords(rate)}: ${run.error.split('\n')[0]}`
          : `[${n}/${total}] ${item.label} at ${rateWords(rate)}: ${run.figures?.ok}/${run.figures?.requests} ok${run.error ? ` (${run.error})` : ''}`,
      );
    }
  }

  async function runOne(item: PolicyItem, rate: number): Promise<CompareRun> {
    const base = { policy: item.label, router: item.router, scheduler: item.scheduler, rate };
    let fleet: ChildFleet | undefined;
    let gateway: ChildGateway | undefined;
    let logPath: string | null = null;
    let logFrom = 0;
    let stage = 'fleet did not start';
    try {
      fleet = await startChildFleets(groups, { timeScale, seed });
      const urls = fleet.urls;
      const before = await readPrefixCounters(urls);
      stage = 'gateway did not start';
      const change = o.reconfigure;
      let later = '';
      gateway = await startChildGateway((dir) => {
        const config = gatewayConfig(user, { dir, model, urls, item, only: change?.from });
        logPath = admissionLogPath(config);
        logFrom = sizeOf(logPath);
        if (change !== undefined)
          later = stringifyYaml(gatewayConfig(user, { dir, model, urls, item, only: change.to }));
        return stringifyYaml(config);
      });
      await waitReady(gateway.url, o.readyTimeoutMs);
      await o.beforeLoad?.(urls);
      stage = 'run failed';
      const started = gateway;
      let reconfigured = false;
      let reload: NodeJS.Timeout | null = null;
      const bench = await runBench({
        ...benchBase,
        target: gateway.url,
        rate,
        ...(o.signal ? { signal: o.signal } : {}),
        // Timed from the load's own clock, not from before the workload was built.
        onStart: () => {
          o.onLoadStart?.(urls);
          if (change === undefined) return;
          reload = setTimeout(() => {
            // Written whole, then renamed over: the watcher never reads half a file.
            const tmp = `${started.configPath}.next`;
            writeFileSync(tmp, later);
            renameSync(tmp, started.configPath);
            started.child.kill('SIGHUP');
            reconfigured = true;
          }, change.afterMs);
        },
      }).finally(() => {
        if (reload !== null) clearTimeout(reload);
      });
      // The replicas' counters are read while they still run; the log once the gateway flushed it.
      const prefix = await prefixHitAfter(before, urls);
      const gatewayMetrics = await readText(`${gateway.url}/metrics`);
      await gateway.stop();
      const admissionLog = await readAdmissionLog(logPath, logFrom);
      return {
        ...base,
        error: o.signal?.aborted ? 'interrupted' : null,
        figures: runFigures(bench.records, bench.metrics, replicas, o.slo, prefix),
        bench,
        benchJson: bench.json,
        admissionLog,
        gatewayMetrics,
        reconfigured,
      };
    } catch (err) {
      return {
        ...base,
        error: `${stage}: ${(err as Error).message}`,
        figures: null,
        bench: null,
        benchJson: null,
        admissionLog: null,
        gatewayMetrics: null,
        reconfigured: false,
      };
    } finally {
      await gateway?.stop();
      await fleet?.stop();
      if (gateway) await rm(gateway.dir, { recursive: true, force: true });
    }
  }

  const goodputRates: Record<string, number | null> = {};
  for (const item of items) {
    goodputRates[item.label] = goodputRate(
      runs
        .filter((r) => r.policy === item.label && r.error === null)
        .map((r) => ({ rate: r.rate, attainment: r.figures?.attainment ?? null })),
    );
  }
  return {
    ...settings,
    runs,
    goodputRate: goodputRates,
    ok: runs.length === total && runs.every((r) => r.error === null),
    table: formatCompareTable(runs, goodputRates, rates.length > 1),
    json: compareJson(settings, runs, goodputRates),
  };
}

/** The fleet a comparison runs on, checked: `fleet` as given, or `replicas` × `profile`. */
function fleetGroups(o: CompareOptions): FleetGroup[] {
  if (o.fleet !== undefined && (o.replicas !== undefined || o.profile !== undefined))
    throw new Error('give a fleet, or replicas and a profile, not both');
  const groups = o.fleet ?? [{ profile: o.profile ?? 'llama3-8b-h100', replicas: o.replicas ?? 4 }];
  fleetModel(groups);
  return groups.map((g) => ({ profile: g.profile, replicas: g.replicas }));
}

/**
 * The one model every group serves, once each group is checked (a whole number of replicas, a
 * known profile); throws otherwise. Invariant: a comparison's gateway is configured with one
 * model over every replica, so profiles of different models cannot share a fleet.
 */
export function fleetModel(groups: readonly FleetGroup[]): string {
  if (groups.length === 0) throw new Error('the fleet has no replicas');
  for (const g of groups) {
    if (!(Number.isInteger(g.replicas) && g.replicas >= 1))
      throw new Error(`replicas must be ≥ 1, got "${g.profile}:${g.replicas}"`);
    getProfile(g.profile); // throws on an unknown profile
  }
  const models = new Set(groups.map((g) => getProfile(g.profile).model));
  if (models.size > 1)
    throw new Error(`every profile must serve one model, got ${[...models].join(' and ')}`);
  return [...models][0]!;
}

/** `NAME:N,...` (the `--fleet` of bench compare and of the benchmark scripts), checked as fleetModel checks it. */
export function parseFleet(raw: string): FleetGroup[] {
  const groups = raw.split(',').map((part) => {
    const m = /^\s*([^:\s]+)\s*:\s*(\d+)\s*$/.exec(part);
    if (m === null) throw new Error(`each item is NAME:N, got "${part}"`);
    return { profile: m[1]!, replicas: Number(m[2]) };
  });
  fleetModel(groups);
  return groups;
}

/**
 * Which group of `groups` a backend of the generated config belongs to (its index), or -1 for a
 * name the config did not give: the groups' replicas are named in order (backendName).
 */
export function fleetGroupOf(groups: readonly FleetGroup[]): (backend: string) => number {
  const of = new Map<string, number>();
  let i = 0;
  for (const [g, group] of groups.entries())
    for (let k = 0; k < group.replicas; k++) of.set(backendName(i++), g);
  return (backend) => of.get(backend) ?? -1;
}

/** "4 × llama3-8b-h100", or "2 × llama3-8b-h100 + 2 × llama3-8b-a100". */
export function fleetWords(groups: readonly FleetGroup[]): string {
  return groups.map((g) => `${g.replicas} × ${g.profile}`).join(' + ');
}
