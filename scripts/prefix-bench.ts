// The prefix-cache router against its baselines on the simulated fleet, shared prefix index across
// gateway instances, and what routing costs on the request path.
//
//   npx tsx scripts/prefix-bench.ts [--parts routing,product,shared,micro] [--rate 8] [--duration-s 240]
//                                   [--time-scale 1] [--policies LIST] [--out results/prefix-bench.json]
//                                   [--keep-logs DIR] [--fleet llama3-8b-a100:8] [--slow-start I:F:S]
//                                   [--seeds on|off] [--reprobe on|off] [--join I:S]
//                                   [--leave I:S] [--crash I:S:D[:E]] [--timeline]
//
// `--fleet NAME:N,...` runs every part on another fleet, mixed GPU kinds included (one simulated
// fleet per profile, backends r0… in the order given); with several groups the routing and product
// parts add, per GPU kind, its share of the requests served and their TTFT P90. The workload stays
// sized for the default fleet (8 × A100: 1.15M tokens of KV).
//
// `--keep-logs DIR` writes each routing or product run's admission log to
// DIR/<part>-<router>-<scheduler>.log, and each shared instance's to
// DIR/shared-<router>-<scheduler>-<i>.log
// (one JSON record a line, as the gateway wrote it), for `slagate logs` to explain; a routing or
// product run's gateway /metrics as its load ended goes beside its log, as <part>-<router>-<scheduler>.metrics.
//
// Workload: `prefix-shared` shaped like llm-d's published benchmark (150 tenants, each a 6k-token
// shared context and 5 users with 1.2k-token questions; KV demand 73% of the cluster's), scaled to
// 8 × llama3-8b-a100 replicas (144k tokens of KV each, 1.15M for the fleet): 135 tenants with
// 5,000-token system prompts and 5 users each, 600-token questions, 1–4 turns. The distinct prefix
// demand is the system prompts (675k tokens) plus the conversations in flight (~100k): about 67%
// of the fleet's KV, so the fleet can hold every prefix only if each replica holds its own part.
//
// Every router runs under the same scheduler: first come first served at a fixed cap of 512 per
// backend (`ROUTER/fcfs`), and a class whose TTFT target (60 s) refuses nothing, so the requests
// reach the replicas as they would without a gateway queue and the router is the only
// difference (llm-d's comparison is the same: routers in front of vLLM). After the routing table,
// the cold dispatches: served requests the gateway estimated under half cached where it sent them,
// by what the same tenant's previous request had done (a tenant's first request is cold for every
// router; one soon after a warm request on another backend is the router's own doing), with the
// TTFT of the cold requests and of the others.
//
// `product`: the whole product against the baselines as each would be deployed. `slagate/slagate`
// runs with the real interactive targets (TTFT 500 ms, TPOT 50 ms): its admission controller and
// scheduler may refuse or hold back what they predict would miss. Each baseline dispatches at once
// and refuses nothing (fcfs at a cap of 512, the 60 s target), as the router it copies would. For
// every run, goodput is the requests that met both real targets, per second of the run.
//
// `shared`: three gateway instances with `state: { store: redis }` (a redis-server started here
// on a free port) behind a round-robin spread of requests; the prefix hit rate is compared with
// the one-instance run of the same policy in the same invocation. `--shared-policy
// slagate/slagate` runs the three as the whole product (the real targets, the slagate scheduler,
// the product part's configuration) instead of `slagate/fcfs`.
//
// `micro`: the request-path cost of a prompt (canonical render + block hashes + token estimate,
// against BPE-tokenizing the same prompt), and of one routing decision over 8 backends (prefix
// match on each, their views, the slagate cost, the grant), each over many unique prompts.
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import type { RequestRecord } from '../src/bench/client.ts';
import {
  type CompareRun,
  fleetGroupOf,
  fleetWords,
  parseFleet,
  readPrefixCounters,
  runCompare,
} from '../src/bench/compare.ts';
import { backendName } from '../src/bench/compare-config.ts';
import { prefixHitRate } from '../src/bench/compare-report.ts';
import { meetsSlo, percentile } from '../src/bench/metrics.ts';
import { startChildFleets, startChildGateway, waitReady } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';
import { syntheticText } from '../src/bench/text.ts';
import { PREFIX_SHARED } from '../src/bench/workloads.ts';
import { applySchemaDefaults } from '../src/config/defaults.ts';
import { RouterSchema } from '../src/config/schema.ts';
import { promptBlocks, TokenEstimate } from '../src/prompt/canonical.ts';
import { slagate } from '../src/router/policies/slagate.ts';
import type { ScheduledRequest } from '../src/scheduler/types.ts';
import { Rng } from '../src/sim/rng.ts';
import { Tokenizer } from '../src/tokenizer/tokenizer.ts';
import { Cancel } from '../src/upstream/cancel.ts';
import { startRedisServer } from '../test/helpers/redis-server.ts';
import { schedulerFixture, schedulerSettings } from '../test/scheduler/fixtures.ts';

const { values } = parseArgs({
  options: {
    parts: { type: 'string', default: 'routing,product,shared,micro' },
    policies: { type: 'string' },
    rate: { type: 'string', default: '8' },
    'duration-s': { type: 'string', default: '240' },
    'time-scale': { type: 'string', default: '1' },
    out: { type: 'string', default: 'results/prefix-bench.json' },
    'shared-policy': { type: 'string', default: 'slagate/fcfs' },
    'keep-logs': { type: 'string' },
    fleet: { type: 'string', default: 'llama3-8b-a100:8' },
    'slow-start': { type: 'string' },
    seeds: { type: 'string', default: 'on' },
    reprobe: { type: 'string', default: 'on' },
    join: { type: 'string' },
    leave: { type: 'string' },
    crash: { type: 'string' },
    timeline: { type: 'boolean', default: false },
  },
});
const PARTS = new Set(values.parts!.split(','));
const RATE = Number(values.rate);
const DURATION_S = Number(values['duration-s']);
const TS = Number(values['time-scale']);
const onOff = (name: 'seeds' | 'reprobe'): boolean => {
  const v = values[name];
  if (v !== 'on' && v !== 'off') throw new Error(`--${name}: on or off, not ${v}`);
  return v === 'on';
};
/**
 * `--seeds off` and `--reprobe off`: the product without one of its mechanisms, to weigh it. Each
 * key is written only when off, so that a checkout from before it runs with its defaults.
 */
const SEEDS = onOff('seeds') ? '' : ' seeds: false,';
const REPROBE = onOff('reprobe') ? '' : ', reprobe_after_ms: 0';
const FLEET = parseFleet(values.fleet!);
const REPLICAS = FLEET.reduce((n, g) => n + g.replicas, 0);
const groupOf = fleetGroupOf(FLEET);
const SEED = 1;

/**
 * `--flag I:...` as numbers: I a replica of the fleet, the rest as `ok` accepts them; otherwise
 * throws, naming the flag, its form and bounds (`usage`) and what was given.
 */
function replicaSpec(flag: string, text: string, usage: string, ok: (rest: number[]) => boolean) {
  const [i, ...rest] = text.split(':').map(Number);
  if (!(Number.isInteger(i) && i! >= 0 && i! < REPLICAS && ok(rest)))
    throw new Error(`--${flag}: ${usage}; got ${text}`);
  return { replica: i!, rest };
}

/**
 * `--slow-start I:F:S`: replica I's engine steps F times slower for the first S seconds of each
 * routing or product run (the simulator's `slow` fault, set once the gateway is ready): a replica
 * that starts slow (a warm-up, a throttled GPU) and then runs as fast as the rest.
 */
const SLOW_START = (() => {
  const text = values['slow-start'];
  if (text === undefined) return null;
  const { replica, rest } = replicaSpec(
    'slow-start',
    text,
    `INDEX:FACTOR:SECONDS with INDEX < ${REPLICAS}, FACTOR > 1`,
    (rest) => rest.length === 2 && rest[0]! > 1 && rest[1]! > 0,
  );
  return { replica, factor: rest[0]!, seconds: rest[1]! };
})();

/** The crashes of the run under way, once they have been set (null before, and without --crash). */
let crashed: Promise<unknown> | null = null;

/**
 * Called as the load's clock starts: sets the crashes for their times, on the clock the timeline
 * reads (they are checked, and waited for, once the run ended: see routing()).
 */
function onLoadStart(urls: readonly string[]): void {
  crashed = null;
  if (CRASH === null) return;
  const url = urls[CRASH.replica]!;
  crashed = Promise.all(
    CRASH.at.map((s) =>
      new Promise<void>((resolve) => setTimeout(resolve, s * 1000)).then(() =>
        fault(url, { mode: 'crash', duration_ms: CRASH.downSeconds * 1000 }, '--crash'),
      ),
    ),
  );
  // Read after the run; until then a failure is only held (no unhandled rejection meanwhile).
  crashed.catch(() => {});
}

async function fault(url: string, spec: Record<string, unknown>, flag: string): Promise<void> {
  const res = await fetch(`${url}/sim/fault`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(spec),
  });
  if (!res.ok) throw new Error(`${flag}: the replica answered ${res.status}: ${await res.text()}`);
}

async function slowStart(urls: readonly string[]): Promise<void> {
  if (SLOW_START === null) return;
  await fault(
    urls[SLOW_START.replica]!,
    { mode: 'slow', factor: SLOW_START.factor, duration_ms: SLOW_START.seconds * 1000 },
    '--slow-start',
  );
}

/**
 * `--join I:S`: scale-out. Replica I runs from the start but the gateway of each routing or product
 * run starts without it; S seconds into the load its config file is rewritten with every replica
 * (and a SIGHUP sent), as an operator adding a replica would.
 * `--leave I:S`: scale-in. The gateway starts with every replica, and S seconds into the load its
 * config is rewritten without replica I: what it serves then drains there, nothing new goes to it.
 * Either implies --timeline.
 *
 * `--timeline`: after each routing or product run, what every backend served per half-minute of
 * the load, what was refused, and the goodput of each half-minute.
 */
const RECONFIGURE = (() => {
  if (values.join !== undefined && values.leave !== undefined) throw new Error('--join or --leave, not both');
  const flag = values.join !== undefined ? 'join' : values.leave !== undefined ? 'leave' : null;
  if (flag === null) return null;
  const text = values[flag]!;
  const { replica, rest } = replicaSpec(
    flag,
    text,
    `INDEX:SECONDS with INDEX < ${REPLICAS}, 0 < SECONDS < --duration-s`,
    (rest) => rest.length === 1 && rest[0]! > 0 && rest[0]! < DURATION_S,
  );
  const seconds = rest[0]!;
  const all = Array.from({ length: REPLICAS }, (_, j) => j);
  const others = all.filter((j) => j !== replica);
  return {
    flag,
    replica,
    seconds,
    change: {
      from: flag === 'join' ? others : all,
      to: flag === 'join' ? all : others,
      afterMs: seconds * 1000,
    },
  };
})();

/**
 * `--crash I:S:D[:E]`: failover. S seconds into the load of each routing or product run, replica I
 * crashes (the simulator's `crash` fault: its sockets destroyed, its cache and counters dropped,
 * its port closed) and D seconds later listens again, a new process with a cold cache. With E (a
 * crash loop), it crashes again every E seconds (E ≥ D + 1: each crash finds it back up), as long as it
 * is back before the load ends. It must be (S + D < --duration-s): the replicas' prefix counters are
 * read then. Those counters start from 0 in each new process, so the run's prefix hit rate is
 * unmeasured (shown as –; prefixHitRate sees the new start time). It implies --timeline.
 */
const CRASH = (() => {
  const text = values.crash;
  if (text === undefined) return null;
  const { replica, rest } = replicaSpec(
    'crash',
    text,
    `INDEX:SECONDS:DOWN_SECONDS[:EVERY_SECONDS] with INDEX < ${REPLICAS}, SECONDS + DOWN_SECONDS < --duration-s, EVERY_SECONDS ≥ DOWN_SECONDS + 1`,
    ([sec, down, every, ...more]) =>
      more.length === 0 &&
      sec! > 0 &&
      down! > 0 &&
      sec! + down! < DURATION_S &&
      (every === undefined || every >= down! + 1),
  );
  const [seconds, downSeconds, every] = rest as [number, number, number | undefined];
  const at = [seconds];
  while (every !== undefined && at.at(-1)! + every + downSeconds < DURATION_S) at.push(at.at(-1)! + every);
  return { replica, seconds, downSeconds, every: every ?? null, at };
})();
const SLO = { ttft: 500 * TS, tpot: 50 * TS };

export const WORKLOAD = {
  ...PREFIX_SHARED,
  tenants: 135,
  systemPromptTokens: 5000,
  usersPerTenant: 5,
  activeConversations: 64,
  minTurns: 1,
  maxTurns: 4,
  questionMedian: 600,
  questionSigma: 0.4,
  questionMin: 200,
  questionMax: 1200,
  outputMin: 100,
  outputMax: 300,
};

const gatewayYaml = (ttftTargetMs: number) =>
  [
    'sla:',
    '  default_class: interactive',
    '  classes:',
    `    interactive: { ttft_p99_ms: ${ttftTargetMs}, tpot_p99_ms: ${50 * TS}, priority: 0 }`,
    `scheduler: { max_queue: 8192,${SEEDS} concurrency: { initial: 512, max: 1024 } }`,
    `upstream: { max_connections_per_backend: 1024${REPROBE} }`,
  ].join('\n');
/** A target nothing here reaches: the gateway refuses nothing, and the router is the only difference. */
const GATEWAY_YAML = gatewayYaml(60_000);
/** The real interactive targets, for the whole product. */
const PRODUCT_YAML = gatewayYaml(SLO.ttft);

function yamlFile(text: string): string {
  const path = join(tmpdir(), `prefix-bench-${process.pid}-${Math.random().toString(36).slice(2)}.yaml`);
  writeFileSync(path, text);
  return path;
}

const out: Record<string, unknown> = {
  command: `npx tsx scripts/prefix-bench.ts ${process.argv.slice(2).join(' ')}`.trim(),
  date: new Date().toISOString(),
  fleet: { groups: FLEET, timeScale: TS },
  workload: WORKLOAD,
  rate: RATE,
  durationS: DURATION_S,
  slowStart: SLOW_START,
  reconfigure:
    RECONFIGURE === null ? null : { [RECONFIGURE.flag]: RECONFIGURE.replica, seconds: RECONFIGURE.seconds },
  crash: CRASH,
};
const save = () => {
  mkdirSync(dirname(values.out!), { recursive: true });
  writeFileSync(values.out!, `${JSON.stringify(out, null, 2)}\n`);
};

/** The bench tool's percentile (numpy's linear method), q in [0, 1]; null for no values. */
function quantile(xs: number[], q: number): number | null {
  if (xs.length === 0) return null;
  return percentile(
    [...xs].sort((a, b) => a - b),
    100 * q,
  );
}

interface Row {
  policy: string;
  ok: number;
  refused: number;
  failed: number;
  ttftP50Ms: number | null;
  ttftP90Ms: number | null;
  ttftP99Ms: number | null;
  tpotP99Ms: number | null;
  outputTokPerS: number;
  goodput: number | null;
  /** Requests that met both targets over requests sent. */
  attainment: number | null;
  prefixHitRate: number | null;
  maxBackendShare: number | null;
  /** Served requests the gateway estimated under half cached where it sent them (coldBreakdown). */
  cold: ColdBreakdown | null;
}

/**
 * Served requests whose `x-slagate-prefix-hit` (the gateway's estimate at dispatch; the
 * replicas' own count under `oracle`) was under 0.5, by what the same tenant's previous served
 * request had done: none yet, less than 20 s earlier on another backend or on the same one, or
 * 20 s or more earlier. null when no request carried the header.
 */
interface ColdBreakdown {
  cold: number;
  tenantFirst: number;
  soonOther: number;
  soonSame: number;
  afterGap: number;
  /** TTFT of the cold requests, ms: P10 and P50 (how fast a cold prefill gets at best). */
  coldTtftP10Ms: number | null;
  coldTtftP50Ms: number | null;
  /** TTFT of the others (estimated half cached or more), ms: P50, P90 and P98. */
  warmTtftP50Ms: number | null;
  warmTtftP90Ms: number | null;
  warmTtftP98Ms: number | null;
}

/** Seconds after which a tenant's return counts as after a gap (its prefix may have aged out). */
const COLD_GAP_S = 20;

function coldBreakdown(records: readonly RequestRecord[]): ColdBreakdown | null {
  const served = records.filter((r) => r.success).sort((a, b) => a.startTime - b.startTime);
  if (!served.some((r) => r.headers['x-slagate-prefix-hit'] !== undefined)) return null;
  let tenantFirst = 0;
  let soonOther = 0;
  let soonSame = 0;
  let afterGap = 0;
  const coldTtft: number[] = [];
  const warmTtft: number[] = [];
  const last = new Map<string, { at: number; backend: string | undefined }>();
  for (const r of served) {
    const hit = r.headers['x-slagate-prefix-hit'];
    const tenant = r.tenant ?? '';
    const backend = r.headers['x-slagate-backend'];
    const prev = last.get(tenant);
    last.set(tenant, { at: r.startTime, backend });
    if (hit === undefined) continue;
    if (!(Number(hit) < 0.5)) {
      warmTtft.push(r.ttft * 1000);
      continue;
    }
    coldTtft.push(r.ttft * 1000);
    if (prev === undefined) tenantFirst++;
    else if (r.startTime - prev.at >= COLD_GAP_S) afterGap++;
    else if (prev.backend === backend) soonSame++;
    else soonOther++;
  }
  return {
    cold: coldTtft.length,
    tenantFirst,
    soonOther,
    soonSame,
    afterGap,
    coldTtftP10Ms: quantile(coldTtft, 0.1),
    coldTtftP50Ms: quantile(coldTtft, 0.5),
    warmTtftP50Ms: quantile(warmTtft, 0.5),
    warmTtftP90Ms: quantile(warmTtft, 0.9),
    warmTtftP98Ms: quantile(warmTtft, 0.98),
  };
}

/** Seconds in one row of the timeline. */
const BIN_S = 30;

/**
 * A markdown table, one row per half-minute of the load (by when each request was sent): the
 * requests every backend served (x-slagate-backend), those refused (429), those that failed
 * otherwise, and the goodput in req/s.
 */
function timeline(records: readonly RequestRecord[]): string {
  const bins = Math.ceil(DURATION_S / BIN_S);
  const names = Array.from({ length: REPLICAS }, (_, i) => backendName(i));
  const served = Array.from({ length: bins }, () => new Map<string, number>());
  const refused = new Array<number>(bins).fill(0);
  const failed = new Array<number>(bins).fill(0);
  const good = new Array<number>(bins).fill(0);
  for (const r of records) {
    const bin = Math.min(bins - 1, Math.floor(r.startTime / BIN_S));
    const backend = r.headers['x-slagate-backend'];
    if (r.success && backend !== undefined) served[bin]!.set(backend, (served[bin]!.get(backend) ?? 0) + 1);
    if (r.status === 429) refused[bin]!++;
    else if (!r.success) failed[bin]!++;
    if (meetsSlo(r, SLO)) good[bin]!++;
  }
  const line = (cells: readonly string[]) => `| ${cells.join(' | ')} |`;
  const header = ['s', ...names, 'refused', 'failed', 'goodput req/s'];
  return [
    line(header),
    line(header.map(() => '---')),
    ...served.map((m, b) =>
      line([
        `${b * BIN_S}–${Math.min(DURATION_S, (b + 1) * BIN_S)}`,
        ...names.map((n) => `${m.get(n) ?? 0}`),
        `${refused[b]}`,
        `${failed[b]}`,
        (good[b]! / (Math.min(DURATION_S, (b + 1) * BIN_S) - b * BIN_S)).toFixed(2),
      ]),
    ),
  ].join('\n');
}

/** Per GPU kind: its share of the requests served and their TTFT P90 (from x-slagate-backend). */
function byGroupWords(records: readonly RequestRecord[]): string {
  const ok = records.filter((r) => r.success);
  return FLEET.map((g, i) => {
    const mine = ok.filter((r) => groupOf(r.headers['x-slagate-backend'] ?? '') === i);
    const share = ok.length === 0 ? '–' : `${((100 * mine.length) / ok.length).toFixed(1)}%`;
    const p90 = quantile(
      mine.map((r) => r.ttft * 1000),
      0.9,
    );
    return `${g.profile} served ${share}, TTFT p90 ${p90 === null ? '–' : Math.round(p90)} ms`;
  }).join('; ');
}

function rowOf(
  policy: string,
  records: readonly RequestRecord[],
  figures: CompareRun['figures'],
  outputTokPerS: number,
): Row {
  const ok = records.filter((r) => r.success);
  const ttft = ok.map((r) => r.ttft * 1000);
  const tpot = ok
    .filter((r) => r.outputLen > 1)
    .map((r) => ((r.latency - r.ttft) / (r.outputLen - 1)) * 1000);
  return {
    policy,
    ok: ok.length,
    refused: records.filter((r) => r.status === 429).length,
    failed: records.length - ok.length - records.filter((r) => r.status === 429).length,
    ttftP50Ms: quantile(ttft, 0.5),
    ttftP90Ms: quantile(ttft, 0.9),
    ttftP99Ms: quantile(ttft, 0.99),
    tpotP99Ms: quantile(tpot, 0.99),
    outputTokPerS,
    goodput: figures?.goodput ?? null,
    attainment: figures?.attainment ?? null,
    prefixHitRate: figures?.prefixHitRate ?? null,
    maxBackendShare: figures?.maxBackendShare ?? null,
    cold: coldBreakdown(records),
  };
}

const f = (x: number | null | undefined, d = 0) => (x === null || x === undefined ? '–' : x.toFixed(d));
const pct = (x: number | null | undefined) =>
  x === null || x === undefined ? '–' : `${(100 * x).toFixed(1)}%`;

/** One column of a table: its header and how a row fills it. */
type Column = readonly [header: string, cell: (r: Row) => string];

/** A markdown table of `columns`, one line per row. */
function markdown(columns: readonly Column[], rows: readonly Row[]): string {
  const line = (cells: readonly string[]) => `| ${cells.join(' | ')} |`;
  const header = columns.map(([h]) => h);
  return [
    line(header),
    line(header.map(() => '---')),
    ...rows.map((r) => line(columns.map(([, cell]) => cell(r)))),
  ].join('\n');
}

const ttfts = (r: Row) => `${f(r.ttftP50Ms)} / ${f(r.ttftP90Ms)} / ${f(r.ttftP99Ms)}`;

const ROUTING_COLUMNS: readonly Column[] = [
  ['policy', (r) => r.policy],
  ['ok', (r) => `${r.ok}`],
  ['refused', (r) => `${r.refused}`],
  ['failed', (r) => `${r.failed}`],
  ['TTFT p50 / p90 / p99 ms', ttfts],
  ['TPOT p99 ms', (r) => f(r.tpotP99Ms)],
  ['output tok/s', (r) => f(r.outputTokPerS)],
  ['prefix hit', (r) => pct(r.prefixHitRate)],
  ['max backend share', (r) => f(r.maxBackendShare, 2)],
];

/** The product part: the whole product with its real targets, the baselines as deployed. */
const PRODUCT_COLUMNS: readonly Column[] = [
  ['policy', (r) => r.policy],
  ['ok', (r) => `${r.ok}`],
  ['refused', (r) => `${r.refused}`],
  ['TTFT p50 / p90 / p99 ms (served)', ttfts],
  ['TPOT p99 ms', (r) => f(r.tpotP99Ms)],
  ['goodput req/s', (r) => f(r.goodput, 2)],
  ['attainment', (r) => pct(r.attainment)],
  ['output tok/s', (r) => f(r.outputTokPerS)],
  ['prefix hit', (r) => pct(r.prefixHitRate)],
];

/** Where the cold dispatches came from (coldBreakdown). */
const COLD_COLUMNS: readonly Column[] = [
  ['policy', (r) => r.policy],
  ['cold (est. < 50% cached)', (r) => f(r.cold?.cold)],
  ["a tenant's first", (r) => f(r.cold?.tenantFirst)],
  [`previous < ${COLD_GAP_S} s earlier, another backend`, (r) => f(r.cold?.soonOther)],
  [`previous < ${COLD_GAP_S} s earlier, same backend`, (r) => f(r.cold?.soonSame)],
  [`previous ≥ ${COLD_GAP_S} s earlier`, (r) => f(r.cold?.afterGap)],
  ['cold TTFT p10 / p50 ms', (r) => `${f(r.cold?.coldTtftP10Ms)} / ${f(r.cold?.coldTtftP50Ms)}`],
  [
    'other TTFT p50 / p90 / p98 ms',
    (r) => `${f(r.cold?.warmTtftP50Ms)} / ${f(r.cold?.warmTtftP90Ms)} / ${f(r.cold?.warmTtftP98Ms)}`,
  ],
];

const table = (rows: readonly Row[]) => markdown(ROUTING_COLUMNS, rows);
const productTable = (rows: readonly Row[]) => markdown(PRODUCT_COLUMNS, rows);

// ---- routing: one instance, every policy ----

const ALL_POLICIES = [
  'round_robin/fcfs',
  'least_loaded/fcfs',
  'prefix_only/fcfs',
  'cache_aware/fcfs',
  'slagate/fcfs',
  'oracle/fcfs',
];
const POLICIES = values.policies === undefined ? ALL_POLICIES : values.policies.split(',');
const PRODUCT_POLICIES =
  values.policies === undefined
    ? ['slagate/slagate', 'cache_aware/fcfs', 'prefix_only/fcfs', 'least_loaded/fcfs']
    : values.policies.split(',');

async function routing(
  part: 'routing' | 'product',
  policies = POLICIES,
  yamlOf = (_policy: string) => GATEWAY_YAML,
): Promise<Row[]> {
  const rows: Row[] = [];
  for (const policy of policies) {
    const yaml = yamlFile(yamlOf(policy));
    const result = await runCompare({
      policies: [policy],
      workload: 'prefix-shared',
      workloadParams: { 'prefix-shared': WORKLOAD },
      rates: [RATE],
      durationS: DURATION_S,
      seed: SEED,
      slo: SLO,
      fleet: FLEET,
      timeScale: TS,
      gatewayYaml: yaml,
      onProgress: (line) => console.error(`  ${line}`),
      beforeLoad: slowStart,
      onLoadStart,
      ...(RECONFIGURE === null ? {} : { reconfigure: RECONFIGURE.change }),
    });
    const run = result.runs[0]!;
    if (run.error !== null || run.bench === null) throw new Error(`${policy}: ${run.error}`);
    if (RECONFIGURE !== null && !run.reconfigured)
      throw new Error(`${policy}: the load ended before the --${RECONFIGURE.flag} reload`);
    // The crash was timed within the load (--crash checks SECONDS < --duration-s), so it has been
    // set by now, or failed.
    if (crashed !== null) await crashed;
    if (RECONFIGURE !== null || CRASH !== null || values.timeline)
      console.log(`${policy}:\n${timeline(run.bench.records)}`);
    if (values['keep-logs'] !== undefined && run.admissionLog !== null) {
      const file = join(values['keep-logs'], `${part}-${policy.replace('/', '-')}.log`);
      mkdirSync(values['keep-logs'], { recursive: true });
      writeFileSync(file, run.admissionLog.map((r) => `${JSON.stringify(r)}\n`).join(''));
      // The gateway's own counters as the load ended (slagate_backend_reprobes_total among them).
      if (run.gatewayMetrics !== null) writeFileSync(file.replace(/\.log$/, '.metrics'), run.gatewayMetrics);
    }
    rows.push(rowOf(policy, run.bench.records, run.figures, run.bench.metrics.outputThroughput));
    console.error(table(rows.slice(-1)).split('\n')[2]);
    if (FLEET.length > 1) console.log(`${policy}: ${byGroupWords(run.bench.records)}`);
  }
  return rows;
}

// ---- shared: three instances through Redis ----

async function shared(policy: string): Promise<Row> {
  if (policy !== 'slagate/fcfs' && policy !== 'slagate/slagate')
    throw new Error(`--shared-policy: slagate/fcfs or slagate/slagate, not ${policy}`);
  const product = policy === 'slagate/slagate';
  const redis = await startRedisServer();
  let fleet: Awaited<ReturnType<typeof startChildFleets>>;
  try {
    fleet = await startChildFleets(FLEET, { timeScale: TS, seed: SEED });
  } catch (err) {
    await redis.stop();
    throw err;
  }
  const gateways: Awaited<ReturnType<typeof startChildGateway>>[] = [];
  try {
    const yaml = (i: number) =>
      [
        'server: { host: 127.0.0.1, port: 0 }',
        'models: [meta-llama/Llama-3.1-8B-Instruct]',
        'backends:',
        ...fleet.urls.map((u, j) => `  - { name: ${backendName(j)}, url: "${u}" }`),
        'router: { policy: slagate }',
        `state: { store: redis, redis_url: "${redis.url}", key_prefix: prefixbench }`,
        ...(product
          ? [PRODUCT_YAML]
          : [
              'scheduler: { policy: fcfs, max_queue: 8192, concurrency: { initial: 512, max: 1024 } }',
              GATEWAY_YAML.split('\n')
                .filter((l) => !l.startsWith('scheduler:'))
                .join('\n'),
            ]),
        `logging: { level: warn, admission_log: $DIR/admission-${i}.log }`,
      ].join('\n');
    for (let i = 0; i < 3; i++) gateways.push(await startChildGateway(yaml(i)));
    for (const g of gateways) await waitReady(g.url);
    const before = await readPrefixCounters(fleet.urls);
    const r = await runBench({
      target: gateways[0]!.url,
      moreTargets: gateways.slice(1).map((g) => g.url),
      workload: 'prefix-shared',
      workloadParams: { 'prefix-shared': WORKLOAD },
      rate: RATE,
      durationS: DURATION_S,
      seed: SEED,
      slo: SLO,
      progress: false,
    });
    const hit = prefixHitRate(before, await readPrefixCounters(fleet.urls));
    const byBackend: Record<string, number> = {};
    for (const rec of r.records) {
      const b = rec.headers['x-slagate-backend'];
      if (rec.success && b !== undefined) byBackend[b] = (byBackend[b] ?? 0) + 1;
    }
    const ok = r.records.filter((x) => x.success).length;
    const counts = Object.values(byBackend);
    const share = ok > 0 && counts.length > 0 ? Math.max(...counts) / (ok / REPLICAS) : null;
    return rowOf(
      `${policy} × 3 instances (Redis)`,
      r.records,
      {
        goodput: r.metrics.requestGoodput,
        attainment: r.records.length > 0 ? r.metrics.goodCompleted / r.records.length : null,
        prefixHitRate: hit,
        maxBackendShare: share,
      } as CompareRun['figures'],
      r.metrics.outputThroughput,
    );
  } finally {
    for (const g of gateways) await g.stop();
    await fleet.stop();
    await redis.stop();
    // After the stops: a gateway flushes its admission log as it shuts down.
    const keep = values['keep-logs'];
    if (keep !== undefined) {
      mkdirSync(keep, { recursive: true });
      for (const [i, g] of gateways.entries()) {
        const to = join(keep, `shared-${policy.replace('/', '-')}-${i}.log`);
        // A gateway that failed before it wrote a record has no log: the error that ended the run
        // is the one to see, not this copy's.
        if (existsSync(join(g.dir, `admission-${i}.log`)))
          copyFileSync(join(g.dir, `admission-${i}.log`), to);
      }
    }
  }
}

// ---- micro: the request-path cost of a prompt and of one routing decision ----

/** The gateway's default `router.block_size_tokens`: the blocks a prompt is hashed into. */
const BLOCK_TOKENS = (applySchemaDefaults(RouterSchema, {}) as { block_size_tokens: number })
  .block_size_tokens;

function timings(n: number, fn: (i: number) => void): { p50: number; p99: number; max: number } {
  const d: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    fn(i);
    d.push(performance.now() - t);
  }
  d.sort((a, b) => a - b);
  // numpy's linear percentiles, as everywhere else in this file.
  return { p50: percentile(d, 50), p99: percentile(d, 99), max: d[n - 1] as number };
}

async function micro(): Promise<Record<string, unknown>> {
  const rng = new Rng(77);
  const prompt = (tokens: number) => [
    { role: 'system', content: syntheticText(rng, Math.floor(tokens * 0.8)) },
    { role: 'user', content: syntheticText(rng, Math.ceil(tokens * 0.2)) },
  ];
  const result: Record<string, unknown> = {};
  for (const tokens of [8000, 32000]) {
    const n = tokens === 8000 ? 200 : 50;
    // Through JSON, as the gateway gets them from a request body: flat strings, not the ropes
    // string concatenation builds (the first read of a rope flattens it, a cost no request pays).
    const prompts = Array.from(
      { length: n },
      () => JSON.parse(JSON.stringify(prompt(tokens))) as ReturnType<typeof prompt>,
    );
    const est = new TokenEstimate();
    // Warm up the JIT on other prompts of the same size (a running gateway is warm), then time
    // unique ones.
    for (let i = 0; i < 50; i++) {
      const warm = JSON.parse(JSON.stringify(prompt(tokens))) as ReturnType<typeof prompt>;
      est.tokens(promptBlocks({ kind: 'chat', messages: warm }, BLOCK_TOKENS));
      if (i < 5) new Tokenizer().countChat(warm);
    }
    const hashing = timings(n, (i) => {
      est.tokens(promptBlocks({ kind: 'chat', messages: prompts[i]! }, BLOCK_TOKENS));
    });
    const bpe = timings(n, (i) => {
      new Tokenizer().countChat(prompts[i]!);
    });
    result[`prompt_${tokens}`] = { canonicalHashEstimateMs: hashing, bpeMs: bpe, prompts: n };
  }
  result.decision = await decision();
  return result;
}

/** One grant over 8 backends for an 8,000-token prompt: views (prefix match, predictions), slagate, lease. */
async function decision(): Promise<{ p50: number; p99: number; max: number; refused: number }> {
  const names = Array.from({ length: 8 }, (_, i) => `b${i}`);
  const settings = schedulerSettings({
    policy: 'fcfs',
    concurrency: {
      ...schedulerSettings().concurrency,
      min: 1,
      max: 1_000_000,
      initial: 1_000_000,
      outerPeriods: 20,
    },
  });
  const policy = slagate({ exploreRatio: 0.01, tolerance: () => 0.1 });
  // The scheduler's unit-test fixture: a real memory live state and backend set, nothing on the wire.
  const fixture = schedulerFixture(names, settings, policy);
  const { live, scheduler } = fixture;
  for (const b of names) {
    for (let i = 0; i < 40; i++) {
      fixture.tick(10);
      const uncached = 100 + 200 * (i % 5);
      live.recordFirstToken({
        backend: b,
        backendTtftMs: 20 + 0.08 * uncached,
        uncachedPromptTokens: uncached,
        prefillAheadTokens: 0,
        loadAtDispatch: i % 9,
      });
      live.record({
        backend: b,
        class: 'interactive',
        queueMs: 0,
        ttftMs: 20 + 0.08 * uncached,
        tpotMs: 20 + (i % 7),
        promptTokens: 1000,
        completionTokens: 100,
        loadAtDispatch: i % 9,
      });
    }
  }
  // Each backend's index full (16,384 blocks) of other prompts; the timed prompts (8,000 tokens in
  // blocks of BLOCK_TOKENS) share a 6,000-token prefix held on two of them.
  for (const b of names)
    for (let k = 0; k < 16; k++)
      live.prefixInsert(
        b,
        Array.from({ length: 1024 }, (_, i) => 1e9 + k * 1e6 + names.indexOf(b) * 1e5 + i),
      );
  const shared = Array.from({ length: Math.floor(6000 / BLOCK_TOKENS) }, (_, i) => 5e8 + i);
  const unique = Math.floor(8000 / BLOCK_TOKENS) - shared.length;
  live.prefixInsert('b2', shared);
  live.prefixInsert('b5', shared);
  // Inserts are applied at the next read (src/state/prefix-index.ts): read once here, so that the
  // first timed decision does not apply the whole setup.
  for (const b of names) live.prefixSize(b);
  const N = 5000;
  const slots: { release(): void }[] = [];
  // The decision is synchronous inside acquire(); the slot is awaited outside the timed part and
  // released once 8 are held (one in flight per backend on average), so the state stays steady.
  const d: number[] = [];
  let refused = 0;
  for (let i = 0; i < N; i++) {
    const blocks = [...shared, ...Array.from({ length: unique }, (_, j) => 7e8 + i * 1000 + j)];
    const route = {
      reqId: `r${i}`,
      promptTokens: 8000,
      blocks,
      blockSizeTokens: BLOCK_TOKENS,
      tokensPerBlock: BLOCK_TOKENS,
      outputTokensPerSequence: 200,
      tpotTargetMs: 50,
    };
    const req: ScheduledRequest = {
      reqId: `r${i}`,
      className: 'interactive',
      priority: 0,
      sheddable: false,
      model: 'bench',
      tenant: 'anonymous',
      arrivedAt: performance.now(),
      ttftTargetMs: 60_000,
      ttftBudgetMs: 60_000,
      loopDelayMs: 0,
      tpotTargetMs: 50,
      deadlineAt: performance.now() + 60_000,
      uncachedTokens: 2000,
      promptTokens: 8000,
      expectedOutputTokens: 200,
      noQueue: false,
      route,
      predictions: new Map(),
      prefillMs: null,
      bestBackendMs: null,
    };
    const started = performance.now();
    const pending = scheduler.ticket(req).acquire({ attempt: 0, excluded: new Set(), signal: new Cancel() });
    d.push(performance.now() - started);
    const slot = await pending.catch(() => null);
    if (slot === null) refused++;
    else slots.push(slot);
    if (slots.length > 8) slots.shift()?.release();
  }
  d.sort((x, y) => x - y);
  const t = { p50: percentile(d, 50), p99: percentile(d, 99), max: d[N - 1] as number, refused };
  await fixture.close();
  return t;
}

// ---- main ----

if (PARTS.has('micro')) {
  out.micro = await micro();
  save();
  console.log('## request path (ms, event-loop time)');
  console.log(JSON.stringify(out.micro, null, 2));
}
let one: Row[] = [];
if (PARTS.has('routing')) {
  one = await routing('routing');
  out.routing = one;
  save();
  console.log(`\n## prefix-shared at ${RATE} req/s, ${fleetWords(FLEET)} (time scale ${TS})`);
  console.log(table(one));
  console.log("\ncold dispatches, by what the same tenant's previous request had done:");
  console.log(markdown(COLD_COLUMNS, one));
  const by = (p: string) => one.find((r) => r.policy === p);
  const s = by('slagate/fcfs');
  const ratio = (a: number | null | undefined, b: number | null | undefined) =>
    a === null || a === undefined || b === null || b === undefined || b === 0 ? null : a / b;
  out.ratios = {
    p90TtftRoundRobinOverSlagate: ratio(by('round_robin/fcfs')?.ttftP90Ms, s?.ttftP90Ms),
    p90TtftPrefixOnlyOverSlagate: ratio(by('prefix_only/fcfs')?.ttftP90Ms, s?.ttftP90Ms),
    p90TtftCacheAwareOverSlagate: ratio(by('cache_aware/fcfs')?.ttftP90Ms, s?.ttftP90Ms),
    outputSlagateOverRoundRobin: ratio(s?.outputTokPerS, by('round_robin/fcfs')?.outputTokPerS),
    hitSlagateOverOracle: ratio(s?.prefixHitRate, by('oracle/fcfs')?.prefixHitRate),
  };
  save();
  console.log(JSON.stringify(out.ratios, null, 2));
}
if (PARTS.has('product')) {
  const rows = await routing('product', PRODUCT_POLICIES, (p) =>
    p.endsWith('/slagate') ? PRODUCT_YAML : GATEWAY_YAML,
  );
  out.product = rows;
  save();
  console.log(
    `\n## the whole product (real targets) and the baselines as deployed, prefix-shared at ${RATE} req/s`,
  );
  console.log(productTable(rows));
}
if (PARTS.has('shared')) {
  const sharedPolicy = values['shared-policy']!;
  const row = await shared(sharedPolicy);
  out.shared = row;
  const single = one.find((r) => r.policy === sharedPolicy);
  out.sharedHitOverSingle =
    single?.prefixHitRate && row.prefixHitRate !== null ? row.prefixHitRate / single.prefixHitRate : null;
  save();
  console.log('\n## three gateway instances sharing Redis');
  const rows = single ? [single, row] : [row];
  console.log(sharedPolicy === 'slagate/slagate' ? productTable(rows) : table(rows));
  console.log(`hit rate, 3 instances ÷ 1 instance: ${f(out.sharedHitOverSingle as number | null, 3)}`);
}
