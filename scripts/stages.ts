// Where the gateway's added TTFT goes, stage by stage: the gateway of this checkout, optionally
// the gateway of another (`--base DIR`), and the undici floor (scripts/lib/floor-proxy.ts), each in
// its own process in front of the fixed backend (first token after 20 ms, then one every 5 ms),
// with scripts/lib/stage-probe.mjs preloaded.
//
//   npx tsx scripts/stages.ts [--base DIR] [--streams 1] [--arrivals closed|poisson]
//                             [--requests 400] [--rounds 3] [--warmup 1500]
//                             [--prompts short|long] [--tokens 8] [--tail 99]
//
// Each path serves `--warmup` requests first (one stream; its request path compiled), then the
// paths take turns for `--rounds` rounds of `--requests` requests each, in an order that rotates.
// `--streams N` sends them as N closed loops, or with `--arrivals poisson` as Poisson arrivals at
// the rate that holds N in flight on average (N ÷ the floor's mean request time in its warm-up).
// Every figure is the median over the pooled requests of one interval between two marks taken in
// the proxy process (node:http's, undici's and the gateway's own diagnostics channels,
// src/telemetry/stages.ts), matched by the x-request-id the client (`slagate bench`'s, as in the
// other request-path scripts) sets; "client TTFT" is the client's own. A gateway that publishes no stages (a checkout from before them) shows only the
// intervals every proxy has. "next request arrives" is shown at one stream only (a connection's
// next request follows its last one only in a single closed loop).
//
// Two intervals cross processes: from the client's send to the proxy's first sight of the request
// (its socket waited for an event loop busy with other streams) and from the proxy's write of the
// first token to the client's read of it. Both sides read the system's monotonic clock
// (process.hrtime), which every process shares.
// A second table gives the same intervals for the tail: the requests whose client TTFT is at or
// above its `--tail` percentile (default 99) on that path.
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { stopChild } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';
import { startCheckoutGateway, undecidingGatewayYaml } from './lib/checkout-gateway.ts';
import { spawnFixedBackend, spawnFloor, stopOnExit } from './lib/spawn-fixed-backend.ts';
import { arrivals, percentile, poissonRate } from './lib/stats.ts';
import { uniqueWorkload } from './lib/unique-workload.ts';

const { values } = parseArgs({
  options: {
    base: { type: 'string' },
    requests: { type: 'string', default: '400' },
    rounds: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '1500' },
    prompts: { type: 'string', default: 'short' },
    tokens: { type: 'string', default: '8' },
    streams: { type: 'string', default: '1' },
    arrivals: { type: 'string', default: 'closed' },
    tail: { type: 'string', default: '99' },
  },
});
const requests = Number(values.requests);
const rounds = Number(values.rounds);
const warmup = Number(values.warmup);
const tokens = Number(values.tokens);
const streams = Number(values.streams);
const tail = Number(values.tail);
const poisson = values.arrivals === 'poisson';
if (!poisson && values.arrivals !== 'closed') throw new Error('--arrivals is closed or poisson');
const kind = values.prompts as 'short' | 'long';
if (kind !== 'short' && kind !== 'long') throw new Error('--prompts is short or long');
const PROBE = new URL('./lib/stage-probe.mjs', import.meta.url).pathname;

type Marks = Record<string, number | undefined>;
interface Path {
  name: string;
  url: string;
  pid: number;
  stop: () => Promise<void>;
  out: string;
  /** The measured requests by id, as the client saw them (monotonic ms): only their marks are read. */
  measured: Map<string, ClientSide>;
  /** Its GC pauses while the measured requests ran. */
  gcs: Gc[];
  /** Upstream connections it opened while the measured requests ran. */
  connects: number;
}

/** One GC pause in a proxy: start (monotonic ms), duration (ms), V8's kind (1: scavenge). */
interface Gc {
  start: number;
  ms: number;
  kind: number;
}

interface ClientSide {
  clientSent: number;
  clientFirstToken: number;
}

const backend = await spawnFixedBackend(20, 5);
stopOnExit([backend]);
const paths: Path[] = [];
let n = 0;
const probeEnv = () => {
  const out = join(tmpdir(), `slagate-stages-${process.pid}-${n++}.json`);
  return { out, env: { ...process.env, NODE_OPTIONS: `--import ${PROBE}`, STAGE_PROBE_OUT: out } };
};
try {
  {
    const { out, env } = probeEnv();
    const floor = await spawnFloor('undici', backend.url, env);
    paths.push(pathOf('undici floor', floor.url, floor.child.pid!, () => stopChild(floor.child), out));
  }
  const checkouts: [string, string][] = [];
  if (values.base !== undefined) checkouts.push(['slagate (base)', values.base]);
  const here = new URL('..', import.meta.url).pathname;
  checkouts.push([values.base === undefined ? 'slagate' : 'slagate (this checkout)', here]);
  for (const [name, dir] of checkouts) {
    const { out, env } = probeEnv();
    const gw = await startCheckoutGateway(dir, (d) => undecidingGatewayYaml(backend.url, d), env);
    paths.push(pathOf(name, gw.url, gw.child.pid!, () => stopChild(gw.child), out));
  }

  let seed = 1;
  const warmups = [];
  for (const p of paths) warmups.push(await bench(p, 1, warmup, seed++));
  const rate = poisson ? poissonRate(warmups[0]!.records, streams) : undefined;
  if (rate !== undefined) console.log(`Poisson arrivals at ${rate.toFixed(1)}/s`);
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < paths.length; i++) {
      const p = paths[(i + r) % paths.length]!;
      const { records, clockZeroMonotonicMs } = await bench(p, streams, requests, seed++, rate);
      for (const rec of records) {
        if (!rec.success) throw new Error(`${p.name}: request ${rec.requestId} failed`);
        const clientSent = clockZeroMonotonicMs + rec.startTime * 1000;
        p.measured.set(rec.requestId, { clientSent, clientFirstToken: clientSent + rec.ttft * 1000 });
      }
    }
  }
  print(await Promise.all(paths.map(collect)));
} finally {
  for (const p of paths) {
    await p.stop();
    rmSync(p.out, { force: true });
  }
  backend.stop();
}

function pathOf(name: string, url: string, pid: number, stop: () => Promise<void>, out: string): Path {
  return { name, url, pid, stop, out, measured: new Map(), gcs: [], connects: 0 };
}

/** `count` requests: `n` closed loops, or with `rate` Poisson arrivals (as request-path.ts sends them). */
function bench(p: Path, n: number, count: number, seed: number, rate?: number) {
  return runBench({
    target: p.url,
    workload: uniqueWorkload(kind, count, tokens, seed),
    ...arrivals(n, rate),
    requests: count,
    seed,
    progress: false,
  });
}

/** Milliseconds of GC pauses inside [from, to]. */
function overlap(gcs: readonly Gc[], from: number, to: number): number {
  let ms = 0;
  for (const g of gcs) ms += Math.max(0, Math.min(to, g.start + g.ms) - Math.max(from, g.start));
  return ms;
}

/**
 * The proxy's marks of the measured requests (it writes them on SIGUSR2), as monotonic ms, with
 * the client's send and first-token read.
 */
async function collect(p: Path): Promise<Marks[]> {
  rmSync(p.out, { force: true });
  process.kill(p.pid, 'SIGUSR2');
  for (let i = 0; i < 200; i++) {
    let written: {
      origin: number;
      rows: (Marks & { id?: string })[];
      gcs: [number, number, number][];
      connects: number[];
    };
    try {
      written = JSON.parse(readFileSync(p.out, 'utf8'));
    } catch {
      await new Promise((resolve) => setTimeout(resolve, 25));
      continue;
    }
    const gcs = written.gcs.map(([start, ms, kind]) => ({ start: written.origin + start, ms, kind }));
    const marks: Marks[] = [];
    for (const { id, ...row } of written.rows) {
      const client = id === undefined ? undefined : p.measured.get(id);
      if (client === undefined) continue;
      const m: Marks = { ...client };
      for (const [k, v] of Object.entries(row)) if (typeof v === 'number') m[k] = written.origin + v;
      m.gcInWait = m.arrival === undefined ? undefined : overlap(gcs, client.clientSent, m.arrival);
      marks.push(m);
    }
    // The window from the first measured send to the last measured first token.
    let from = Number.POSITIVE_INFINITY;
    let to = Number.NEGATIVE_INFINITY;
    for (const m of marks) {
      from = Math.min(from, m.clientSent as number);
      to = Math.max(to, m.clientFirstToken as number);
    }
    const within = (at: number) => at >= from && at <= to;
    p.gcs = gcs.filter((g) => within(g.start));
    p.connects = written.connects.filter((at) => within(written.origin + at)).length;
    return marks;
  }
  throw new Error(`${p.name}: no marks written`);
}

function print(rows: Marks[][]): void {
  const intervals: Interval[] = [
    ['client sent → arrival (waiting for the proxy to read it)', between('clientSent', 'arrival')],
    ['… of which the proxy was in a GC pause', (m) => m.gcInWait ?? Number.NaN],
    ['arrival → record begun (the front door)', between('arrival', 'received')],
    ['record begun → handler (body read and parsed)', between('received', 'parsed')],
    ['handler → admitted (intake, admission)', between('parsed', 'admitted')],
    ['admitted → slot granted (proxy, scheduler, router)', between('admitted', 'granted')],
    ['slot granted → dispatched (attempt, breaker)', between('granted', 'dispatched')],
    ['dispatched → upstream head sent (undici)', between('dispatched', 'upstreamSent')],
    ['**arrival → upstream head sent**', between('arrival', 'upstreamSent')],
    [
      'upstream head sent → upstream first chunk (the backend)',
      between('upstreamSent', 'upstreamFirstChunk'),
    ],
    [
      'upstream first chunk → committed (events read, head written)',
      between('upstreamFirstChunk', 'committed'),
    ],
    ['committed → client socket write', between('committed', 'clientFirstWrite')],
    ['**upstream first chunk → client socket write**', between('upstreamFirstChunk', 'clientFirstWrite')],
    ['client socket write → client reads the first token', between('clientFirstWrite', 'clientFirstToken')],
  ];
  if (streams === 1 && !poisson)
    intervals.push(['response finished → next request arrives', between('finish', 'nextArrival')]);
  console.log(
    `${requests * rounds} requests per path (${rounds} rounds), ${kind} prompts, ${tokens}-token outputs, ` +
      `${streams} stream(s), ${poisson ? 'Poisson arrivals' : 'closed loop'}\n`,
  );
  table('median', rows, intervals);
  // The tail: each path's requests at or above its client TTFT percentile `tail`.
  const slow = rows.map((marks) => {
    const ttft = marks.map(clientTtft).sort((a, b) => a - b);
    const cut = percentile(ttft, tail);
    return marks.filter((m) => clientTtft(m) >= cut);
  });
  console.log(
    `\nThe tail: the requests at or above the P${tail} of client TTFT on their path ` +
      `(${slow.map((s, i) => `${paths[i]!.name} ${s.length}`).join(', ')}), median of each interval\n`,
  );
  table(`median, P${tail}+ requests`, slow, intervals);
  console.log(
    '\nWhile the measured requests ran: GC pauses (ms: count: median / max; kind 1 is a scavenge), upstream connections opened\n',
  );
  console.log('| path | GC pauses | per 1,000 requests | scavenges | others | upstream connects |');
  console.log('|---|---|---|---|---|---|');
  paths.forEach((p, i) => {
    const n = rows[i]!.length;
    const stat = (gs: Gc[]) => {
      const ms = gs.map((g) => g.ms).sort((a, b) => a - b);
      return ms.length === 0
        ? '—'
        : `${ms.length}: ${percentile(ms, 50).toFixed(2)} / ${ms.at(-1)!.toFixed(2)}`;
    };
    const perK = ((1000 * p.gcs.length) / n).toFixed(1);
    console.log(
      `| ${p.name} | ${p.gcs.length} | ${perK} | ${stat(p.gcs.filter((g) => g.kind === 1))} | ${stat(p.gcs.filter((g) => g.kind !== 1))} | ${p.connects} |`,
    );
  });
}

/** A table row: its label and what it reads of one request's marks (NaN: not there). */
type Interval = [string, (m: Marks) => number];

/** The time between two marks of the same request. */
function between(from: string, to: string): (m: Marks) => number {
  return (m) => (m[to] ?? Number.NaN) - (m[from] ?? Number.NaN);
}

function clientTtft(m: Marks): number {
  return between('clientSent', 'clientFirstToken')(m);
}

function table(what: string, rows: Marks[][], intervals: Interval[]): void {
  console.log(`| interval (ms, ${what}) | ${paths.map((p) => p.name).join(' | ')} |`);
  console.log(`|---|${paths.map(() => '---|').join('')}`);
  for (const [label, read] of intervals) {
    const cells = rows.map((marks) => {
      const v = marks
        .map(read)
        .filter(Number.isFinite)
        .sort((a, b) => a - b);
      return v.length < marks.length / 2 ? '—' : percentile(v, 50).toFixed(3);
    });
    console.log(`| ${label} | ${cells.join(' | ')} |`);
  }
  const ttft = rows.map((marks) =>
    percentile(
      marks.map(clientTtft).sort((a, b) => a - b),
      50,
    ).toFixed(3),
  );
  console.log(`| client TTFT | ${ttft.join(' | ')} |`);
}
