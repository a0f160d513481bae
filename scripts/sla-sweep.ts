// The scheduler and admission controller against the simulated fleet: what they do to goodput and
// tail latency from half to twice the fleet's capacity, how they order a mixed workload, and how
// well the TTFT predictor predicts. Every run: a fresh fleet of 4 × llama3-8b-h100 (or the
// `--fleet` given, a mixed one included) and a fresh gateway, each in its own process (`slagate
// bench compare` underneath), one after another.
//
//   npx tsx scripts/sla-sweep.ts [--time-scale 2] [--arrival-s 120] [--warmup-s 40] [--parts all]
//                                [--loads 0.5,1,1.5,2] [--variants slagate,fcfs@256]
//                                [--capacity sharegpt=49,mixed=22]
//                                [--fleet llama3-8b-h100:2,llama3-8b-a100:2]
//
// Variants: `slagate` (least_loaded router, slagate scheduler), `fcfs@16` and `fcfs@256`
// (least_loaded, first come first served at a fixed cap of 16 or 256 per backend), `product`
// (the slagate router and scheduler), `round_robin@256` (round robin, fcfs at 256: a plain
// load balancer). With a fleet of several groups the sweep adds, per group, its share of the
// requests served and their TTFT P99.
//
// Time scale. The machine has 2 cores for the client, the gateway and the fleet; at time scale 1
// twice the fleet's capacity is ~20k streamed events a second through each of them. At time scale
// 2 every simulated duration is twice as long (a GPU half as fast) and the SLA targets are scaled
// with it (interactive: TTFT 1000 ms, TPOT 100 ms), so the experiment is the same with half the
// events per second. Latencies in the tables are at that scale: halve them for H100 figures.
//
// Capacity (1×). Measured, not assumed: the simulator's engine alone on a virtual clock, every
// request admitted at once (no gateway, no cap), 900 simulated seconds per rate, attainment over
// the requests arriving after 300 s; the capacity is 4 × the highest rate per replica at which at
// least 90% meet both targets (DistServe's goodput rate); for a mixed fleet, each profile's rate
// per replica times its replicas, summed. Short real-time runs cannot find it: near capacity the
// batch keeps growing for minutes.
//
// Figures over the steady part of each run: requests that arrived between warmup-s and arrival-s.
import { mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import type { RequestRecord } from '../src/bench/client.ts';
import { type CompareRun, fleetGroupOf, fleetWords, parseFleet, runCompare } from '../src/bench/compare.ts';
import { percentile } from '../src/bench/metrics.ts';
import { createWorkload, type WorkloadName } from '../src/bench/workloads.ts';
import { VirtualClock } from '../src/sim/engine/clock.ts';
import { createEngine } from '../src/sim/engine/engine.ts';
import { getProfile } from '../src/sim/profiles.ts';
import { Rng } from '../src/sim/rng.ts';

const { values } = parseArgs({
  options: {
    'time-scale': { type: 'string', default: '2' },
    'arrival-s': { type: 'string', default: '120' },
    'warmup-s': { type: 'string', default: '40' },
    parts: { type: 'string', default: 'capacity,sweep,mixed,predictor' },
    loads: { type: 'string', default: '0.5,0.75,1,1.25,1.5,2' },
    variants: { type: 'string', default: 'slagate,fcfs@16,fcfs@256' },
    // Known capacities (req/s for the fleet), to skip the bisection: sharegpt=49,mixed=22
    capacity: { type: 'string' },
    out: { type: 'string', default: 'results/sla-sweep.json' },
    fleet: { type: 'string', default: 'llama3-8b-h100:4' },
  },
});
const TS = Number(values['time-scale']);
const ARRIVAL_S = Number(values['arrival-s']);
const WARMUP_S = Number(values['warmup-s']);
const PARTS = new Set(values.parts!.split(','));
const LOADS = values.loads!.split(',').map(Number);
const VARIANT_LIST = values.variants!.split(',');
const KNOWN_CAPACITY = new Map(
  (values.capacity ?? '')
    .split(',')
    .filter((x) => x.includes('='))
    .map((x) => [x.split('=')[0]!, Number(x.split('=')[1])] as const),
);
const FLEET = parseFleet(values.fleet!);
const groupOf = fleetGroupOf(FLEET);
const SEED = 1;
// The shipped classes (config/gateway.yaml), every target × the time scale.
const T = { interactive: { ttft: 500 * TS, tpot: 50 * TS }, batch: { ttft: 30_000 * TS, tpot: 200 * TS } };

function gatewayYaml(extra: string): string {
  const path = join(tmpdir(), `sla-sweep-${process.pid}-${Math.random().toString(36).slice(2)}.yaml`);
  writeFileSync(
    path,
    [
      'sla:',
      '  default_class: interactive',
      '  classes:',
      `    interactive: { ttft_p99_ms: ${T.interactive.ttft}, tpot_p99_ms: ${T.interactive.tpot}, priority: 0 }`,
      `    completion: { ttft_p99_ms: ${200 * TS}, tpot_p99_ms: ${30 * TS}, priority: 0 }`,
      `    batch: { ttft_p99_ms: ${T.batch.ttft}, tpot_p99_ms: ${T.batch.tpot}, priority: 2, sheddable: true }`,
      'upstream: { max_connections_per_backend: 1024 }',
      extra,
    ].join('\n'),
  );
  return path;
}

/** The policies compared: the scheduler's closed loop, and first-come order at fixed caps. */
const VARIANTS = {
  slagate: { item: 'least_loaded/slagate', yaml: 'scheduler: { concurrency: { max: 1024 } }' },
  'fcfs@16': { item: 'least_loaded/fcfs', yaml: 'scheduler: { concurrency: { max: 1024 } }' },
  'fcfs@256': { item: 'least_loaded/fcfs', yaml: 'scheduler: { concurrency: { max: 1024, initial: 256 } }' },
  product: { item: 'slagate/slagate', yaml: 'scheduler: { concurrency: { max: 1024 } }' },
  'round_robin@256': {
    item: 'round_robin/fcfs',
    yaml: 'scheduler: { concurrency: { max: 1024, initial: 256 } }',
  },
} as const;
type Variant = keyof typeof VARIANTS;

const f = (x: number | null, d = 0) => (x === null ? '–' : x.toFixed(d));
const p = (x: number | null) => (x === null ? '–' : `${(100 * x).toFixed(1)}%`);

// ---- capacity: the engine alone, virtual time ----

function engineAttainment(profile: string, workload: WorkloadName, ratePerReplica: number): number {
  const clock = new VirtualClock();
  const engine = createEngine(getProfile(profile), { timeScale: TS, clock });
  const w = createWorkload(workload, SEED);
  // Exponential gaps from the simulator's generator (an LCG written in doubles lost its low bits
  // past 2^53 and cycled after some 16,000 draws, fewer than a long run's arrivals).
  const rng = new Rng(12345);
  const DURATION = 900_000;
  const WARM = 300_000;
  let n = 0;
  let good = 0;
  let t = 0;
  let id = 0;
  while (t < DURATION) {
    t += (-Math.log(1 - rng.next()) / ratePerReplica) * 1000;
    clock.run(t);
    const r = w.next();
    const cls = r.classHint === 'batch' ? T.batch : T.interactive;
    const tokens = Array.from({ length: r.promptTokens + 20 }, (_, i) => (id * 7919 + i * 13) % 100_000);
    const arrived = clock.now();
    const counted = arrived > WARM;
    let first = -1;
    let k = 0;
    engine.add(
      {
        id: `r${id++}`,
        promptTokens: tokens,
        maxTokens: r.outputTokens,
        naturalLength: r.outputTokens,
        ignoreEos: true,
        seed: id,
      },
      {
        onToken: (_t, _i, finish) => {
          k++;
          if (first < 0) first = clock.now();
          if (finish === null || !counted) return;
          n++;
          const tpot = k > 1 ? (clock.now() - first) / (k - 1) : 0;
          if (first - arrived <= cls.ttft && tpot <= cls.tpot) good++;
        },
      },
    );
  }
  clock.run(DURATION + 1_200_000);
  return n === 0 ? 0 : good / n;
}

interface Capacity {
  /** The rate per replica of each group's profile, in the fleet's order. */
  perReplica: number[];
  fleet: number;
  tried: [number, number][][];
}

/**
 * Bisection to 0.25 req/s per replica on "at least 90% attain both targets" (monotone in the rate),
 * once per group's profile; the fleet's capacity is their sum over its replicas.
 */
function capacity(workload: WorkloadName): Capacity {
  const perReplica: number[] = [];
  const tried: [number, number][][] = [];
  for (const g of FLEET) {
    const t: [number, number][] = [];
    let lo = 0.5;
    let hi = 40;
    while (hi - lo > 0.25) {
      const mid = Math.round(((lo + hi) / 2) * 4) / 4;
      const a = engineAttainment(g.profile, workload, mid);
      t.push([mid, a]);
      if (a >= 0.9) lo = mid;
      else hi = mid;
    }
    perReplica.push(lo);
    tried.push(t);
  }
  return { perReplica, fleet: FLEET.reduce((c, g, i) => c + g.replicas * perReplica[i]!, 0), tried };
}

// ---- real-time runs ----

/**
 * The TTFT the gateway recorded (arrival at the gateway to the first token it forwarded) for the
 * steady requests it served: its P99, and the P99 of what the client measured on top of it for the
 * same request (the client↔gateway hop both ways, which on this machine includes the load
 * generator's own event-loop delay under load).
 */
function gatewayTtft(r: CompareRun): { p99: number | null; gapP99: number | null } {
  const byId = new Map<string, number>();
  for (const a of (r.admissionLog ?? []) as { req_id: string; outcome: string; ttft_ms: number | null }[])
    if (a.outcome === 'ok' && a.ttft_ms !== null) byId.set(a.req_id, a.ttft_ms);
  const xs: number[] = [];
  const gaps: number[] = [];
  for (const x of r.bench!.records) {
    if (!x.success || x.startTime < WARMUP_S || x.startTime > ARRIVAL_S) continue;
    const id = x.headers['x-request-id'];
    const v = id === undefined ? undefined : byId.get(id);
    if (v === undefined) continue;
    xs.push(v);
    gaps.push(x.ttft * 1000 - v);
  }
  return { p99: pct(xs, 0.99), gapP99: pct(gaps, 0.99) };
}

/**
 * Per group of the fleet, over the steady window's requests served: the share of them its
 * replicas served (from each response's x-slagate-backend) and their TTFT P99.
 */
function byGroup(
  records: readonly RequestRecord[],
): { servedShare: number | null; ttftP99: number | null }[] {
  const ok = records.filter((r) => r.success && r.startTime >= WARMUP_S && r.startTime <= ARRIVAL_S);
  return FLEET.map((_, i) => {
    const mine = ok.filter((r) => groupOf(r.headers['x-slagate-backend'] ?? '') === i);
    return {
      servedShare: ok.length === 0 ? null : mine.length / ok.length,
      ttftP99: pct(
        mine.map((r) => r.ttft * 1000),
        0.99,
      ),
    };
  });
}

interface Steady {
  sent: number;
  offeredPerS: number;
  goodPerS: number;
  /** Null when no request fell in the steady window (nothing to divide). */
  attainment: number | null;
  refusedShare: number | null;
  failedShare: number | null;
  ttftP50: number | null;
  ttftP99: number | null;
  tpotP99: number | null;
}

const tpotOf = (r: RequestRecord) =>
  r.outputLen > 1 ? ((r.latency - r.ttft) / (r.outputLen - 1)) * 1000 : null;

/** numpy's linear percentile, as every other figure here (src/bench/metrics.ts); null with no sample. */
function pct(xs: number[], q: number): number | null {
  if (xs.length === 0) return null;
  return percentile(
    [...xs].sort((a, b) => a - b),
    q * 100,
  );
}

function steadyOf(
  records: readonly RequestRecord[],
  filter: (r: RequestRecord) => boolean = () => true,
): Steady {
  const steady = records.filter((r) => r.startTime >= WARMUP_S && r.startTime <= ARRIVAL_S && filter(r));
  const window = ARRIVAL_S - WARMUP_S;
  const target = (r: RequestRecord) => (r.classHint === 'batch' ? T.batch : T.interactive);
  const ok = steady.filter((r) => r.success);
  const good = ok.filter((r) => {
    const tp = tpotOf(r);
    return r.ttft * 1000 <= target(r).ttft && (tp === null || tp <= target(r).tpot);
  });
  return {
    sent: steady.length,
    offeredPerS: steady.length / window,
    goodPerS: good.length / window,
    attainment: steady.length === 0 ? null : good.length / steady.length,
    refusedShare: steady.length === 0 ? null : steady.filter((r) => r.status === 429).length / steady.length,
    failedShare:
      steady.length === 0
        ? null
        : steady.filter((r) => !r.success && r.status !== 429).length / steady.length,
    ttftP50: pct(
      ok.map((r) => r.ttft * 1000),
      0.5,
    ),
    ttftP99: pct(
      ok.map((r) => r.ttft * 1000),
      0.99,
    ),
    tpotP99: pct(
      ok.map(tpotOf).filter((x): x is number => x !== null),
      0.99,
    ),
  };
}

async function run(
  variant: Variant,
  workload: WorkloadName,
  rate: number,
  classHints: boolean,
): Promise<CompareRun & { clientLoopDelayP99Ms: number }> {
  const v = VARIANTS[variant];
  const yaml = gatewayYaml(v.yaml);
  // The load generator's own event-loop delay over the run: every streamed event it reads late
  // adds to the TTFT and TPOT it measures, and none of that is the gateway's.
  const loop = monitorEventLoopDelay({ resolution: 10 });
  loop.enable();
  const result = await runCompare({
    policies: [v.item],
    workload,
    rates: [rate],
    requests: Math.round(rate * ARRIVAL_S),
    seed: SEED,
    fleet: FLEET,
    timeScale: TS,
    slo: { ttft: T.interactive.ttft, tpot: T.interactive.tpot },
    classHints,
    gatewayYaml: yaml,
    readyTimeoutMs: 30_000,
    onProgress: (line) => console.error(`  ${variant} ${workload} ${rate}: ${line}`),
  });
  loop.disable();
  const r = result.runs[0]!;
  if (r.error !== null || r.bench === null) throw new Error(`${variant} at ${rate}: ${r.error}`);
  return { ...r, clientLoopDelayP99Ms: loop.percentile(99) / 1e6 };
}

const out: Record<string, unknown> = { timeScale: TS, arrivalS: ARRIVAL_S, warmupS: WARMUP_S, targets: T };
const lines: string[] = [];
const say = (s = '') => {
  lines.push(s);
  console.log(s);
};

let sharegptC: number | null = null;
let mixedC: number | null = null;
if (PARTS.has('capacity') || PARTS.has('sweep') || PARTS.has('mixed') || PARTS.has('predictor')) {
  const known = (w: WorkloadName) => {
    const c = KNOWN_CAPACITY.get(w);
    return c === undefined ? capacity(w) : { perReplica: [], fleet: c, tried: [] };
  };
  const cs = known('sharegpt');
  const cm = known('mixed');
  sharegptC = cs.fleet;
  mixedC = cm.fleet;
  out.capacity = { sharegpt: cs, mixed: cm };
  say(`## Capacity (engine alone, virtual clock, time scale ${TS})`);
  const tried = (c: Capacity) =>
    c.tried.length === 0
      ? 'given with --capacity'
      : FLEET.map(
          (g, i) =>
            `${g.profile}: ${c.perReplica[i]} req/s per replica, tried ${c.tried[i]!.map(([r, a]) => `${r}: ${p(a)}`).join(', ')}`,
        ).join('; ');
  say(`fleet: ${fleetWords(FLEET)}`);
  say(`sharegpt: C = ${cs.fleet} req/s for the fleet (${tried(cs)})`);
  say(`mixed (docs as batch): C = ${cm.fleet} req/s (${tried(cm)})`);
  say();
}

if (PARTS.has('sweep') && sharegptC !== null) {
  say(`## sharegpt, 0.5× to 2× of C = ${sharegptC} req/s`);
  const groupHead =
    FLEET.length > 1 ? ` ${FLEET.map((g) => `${g.profile}: served / TTFT p99 ms`).join(' | ')} |` : '';
  say(
    `| load | policy | offered/s | goodput/s | attainment | refused | failed | TTFT p50 / p99 ms | gateway-measured TTFT p99 ms | client − gateway TTFT p99 ms | client loop delay p99 ms | TPOT p99 ms |${groupHead}`,
  );
  say(
    `|---|---|---|---|---|---|---|---|---|---|---|---|${FLEET.length > 1 ? FLEET.map(() => '---|').join('') : ''}`,
  );
  const sweep: Record<string, unknown>[] = [];
  const goodAt = new Map<string, number>();
  for (const load of LOADS) {
    for (const variant of VARIANT_LIST as Variant[]) {
      if (variant === 'fcfs@16' && ![0.5, 1, 2].includes(load)) continue;
      const rate = Math.round(load * sharegptC * 10) / 10;
      const r = await run(variant, 'sharegpt', rate, false);
      const s = steadyOf(r.bench!.records);
      const gw = gatewayTtft(r);
      const groups = FLEET.length > 1 ? byGroup(r.bench!.records) : [];
      goodAt.set(`${variant}@${load}`, s.goodPerS);
      sweep.push({
        load,
        rate,
        variant,
        ...s,
        gatewayTtftP99: gw.p99,
        hopP99: gw.gapP99,
        clientLoopDelayP99Ms: r.clientLoopDelayP99Ms,
        ...(groups.length > 0 ? { groups } : {}),
      });
      const groupCells = groups.map((g) => ` ${p(g.servedShare)} / ${f(g.ttftP99)} |`).join('');
      say(
        `| ${load}× | ${variant} | ${f(s.offeredPerS, 1)} | ${f(s.goodPerS, 1)} | ${p(s.attainment)} | ${p(s.refusedShare)} | ${p(s.failedShare)} | ${f(s.ttftP50)} / ${f(s.ttftP99)} | ${f(gw.p99)} | ${f(gw.gapP99)} | ${f(r.clientLoopDelayP99Ms)} | ${f(s.tpotP99)} |${groupCells}`,
      );
    }
  }
  out.sweep = sweep;
  for (const variant of VARIANT_LIST) {
    const one = goodAt.get(`${variant}@1`);
    const two = goodAt.get(`${variant}@2`);
    if (one !== undefined && two !== undefined) {
      say(`${variant}: goodput at 2× / goodput at 1× = ${f(two, 1)} / ${f(one, 1)} = ${p(two / one)}`);
    }
  }
  say();
}

if (PARTS.has('mixed') && mixedC !== null) {
  const rate = Math.round(0.9 * mixedC * 10) / 10;
  say(`## mixed at 0.9× of its C = ${mixedC} req/s (${rate} req/s; documents as batch, class hints sent)`);
  say(
    '| policy | short prompts: n / TTFT p50 / p99 ms | documents: n / TTFT p50 / p99 ms | longest document wait ms | refused |',
  );
  say('|---|---|---|---|---|');
  const mixed: Record<string, unknown>[] = [];
  const shortP99 = new Map<string, number | null>();
  for (const variant of VARIANT_LIST.filter((v) => v !== 'fcfs@16') as Variant[]) {
    const r = await run(variant, 'mixed', rate, true);
    const isDoc = (x: RequestRecord) => x.classHint === 'batch';
    const short = steadyOf(r.bench!.records, (x) => !isDoc(x));
    const docs = steadyOf(r.bench!.records, isDoc);
    const adm = (r.admissionLog ?? []) as {
      class: string | null;
      queue_ms: number | null;
      outcome: string;
    }[];
    const waits = adm
      .filter((a) => a.class === 'batch' && a.queue_ms !== null)
      .map((a) => a.queue_ms as number);
    const longest = waits.length === 0 ? null : Math.max(...waits);
    shortP99.set(variant, short.ttftP99);
    mixed.push({ variant, rate, short, docs, longestDocumentWaitMs: longest });
    say(
      `| ${variant} | ${short.sent} / ${f(short.ttftP50)} / ${f(short.ttftP99)} | ${docs.sent} / ${f(docs.ttftP50)} / ${f(docs.ttftP99)} | ${f(longest)} | ${p(short.refusedShare)} / ${p(docs.refusedShare)} |`,
    );
  }
  out.mixed = mixed;
  const a = shortP99.get('slagate');
  const b = shortP99.get('fcfs@256');
  if (a && b) say(`short prompts' P99 TTFT, fcfs@256 / slagate = ${f(b)} / ${f(a)} = ${(b / a).toFixed(2)}×`);
  say(
    `bound on a document's wait (the queue guard): batch TTFT target ${T.batch.ttft} ms minus its predicted time to first token`,
  );
  say();
}

if (PARTS.has('predictor') && sharegptC !== null) {
  const rate = Math.round(0.8 * sharegptC * 10) / 10;
  const r = await run('slagate', 'sharegpt', rate, false);
  const adm = (r.admissionLog ?? []) as {
    outcome: string;
    predicted_ttft_ms: number | null;
    ttft_ms: number | null;
  }[];
  const ape = adm
    .filter((a) => a.outcome === 'ok' && a.predicted_ttft_ms !== null && a.ttft_ms !== null && a.ttft_ms > 0)
    .map((a) => Math.abs((a.predicted_ttft_ms as number) - (a.ttft_ms as number)) / (a.ttft_ms as number));
  const signed = adm
    .filter((a) => a.outcome === 'ok' && a.predicted_ttft_ms !== null && a.ttft_ms !== null && a.ttft_ms > 0)
    .map((a) => ((a.predicted_ttft_ms as number) - (a.ttft_ms as number)) / (a.ttft_ms as number));
  const bias = signed.reduce((x, y) => x + y, 0) / Math.max(1, signed.length);
  out.predictor = { rate, n: ape.length, mdape: pct(ape, 0.5), p90: pct(ape, 0.9), bias };
  say(`## TTFT predictor at 0.8× (${rate} req/s sharegpt)`);
  say(
    `requests with a prediction: ${ape.length} of ${adm.length}; median absolute percentage error ${f(100 * (pct(ape, 0.5) ?? Number.NaN), 1)}%, P90 ${f(100 * (pct(ape, 0.9) ?? Number.NaN), 1)}%, bias ${f(100 * bias, 1)}%`,
  );
  say();
}

mkdirSync(dirname(values.out!), { recursive: true });
writeFileSync(values.out!, `${JSON.stringify(out, null, 2)}\n`);
writeFileSync(values.out!.replace(/\.json$/, '.md'), `${lines.join('\n')}\n`);
