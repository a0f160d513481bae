// What each proxy in front of one fixed backend adds, side by side in one run: a direct
// connection, a TCP pass-through, a minimal node:http proxy and the same with undici underneath
// (the floors, scripts/lib/floor-proxy.ts) and slagate (least_loaded), each in its own process.
//
//   npx tsx scripts/request-path.ts [--levels 1,32,256] [--prompts short,long] [--rounds 2]
//                                   [--poisson-levels 32] [--profile DIR] [--profile-interval-us 1000]
//                                   [--warmup 2000] [--profile-prompts short]
//
// The backend (scripts/lib/fixed-backend.ts) sends the first token after 20 ms and then one every
// 5 ms, with no batching, so a request's timing depends on nothing but the path in front of it.
// Prompts are unique per request (no two share a first block): `short` 512 characters, `long`
// about 8,000 tokens (32,000 characters). Outputs are 32 tokens at 1 and 32 streams and 64 at 256
// (the 4,000-request closed loop of the request-path issue). The paths take turns round by round
// in an order that rotates, so the machine's drift falls on all of them alike; samples are pooled.
// Before the first level every proxy serves `--warmup` short requests at 32 streams, so that its
// request path runs compiled, as after a first minute of traffic (a few hundred requests at one
// stream leave most of it interpreted, which charges a proxy for the size of its code).
// Each level runs as a closed loop (each stream sends its next request when the last one ends).
// A level also in `--poisson-levels` runs a second time with Poisson arrivals at the rate that
// holds that many requests in flight on average (streams ÷ the direct path's mean request time in
// the level's warm-up; the cap, 8 × streams, never binds). Its rows read "32 (Poisson)". A closed
// loop of equal-length requests keeps its streams in step: they end together and the next
// requests arrive together, so each waits behind the whole burst's intake, and undici sends a
// request on a reused connection only after the event loop's poll phase (docs/benchmarks.md,
// "Bursts at 32 streams").
// Per path: added TTFT p50 / p99 over direct, the total time of its requests (the sum of its
// rounds' wall times) and the proxy process's CPU per request (utime + stime from /proc), and of
// it, its main thread's (the event loop: JavaScript and its syscalls; the rest is V8's and libuv's
// helper threads, garbage collection and compilation).
//
// slagate runs with targets no load here reaches and concurrency limits above 256, so nothing is
// queued or refused: what is measured is the per-request work of every stage, not a decision.
// `--profile DIR` also runs slagate alone under --cpu-prof at the highest level of --levels (the
// prompts of `--profile-prompts`, short by default) and prints the top functions by self time and
// the CPU per request by the gateway's own module (scripts/lib/cpu-profile.ts);
// `--profile-interval-us` sets V8's sampling interval (a finer one attributes small per-request
// items better, at more overhead).
import { mkdirSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { startChildGateway } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';
import type { Workload } from '../src/bench/workloads.ts';
import { undecidingGatewayYaml } from './lib/checkout-gateway.ts';
import { summarizeByModule, summarizeProfile } from './lib/cpu-profile.ts';
import { type Spawned, spawnFixedBackend, spawnFloor, stopOnExit } from './lib/spawn-fixed-backend.ts';
import { arrivals, cpuSeconds, mainThreadCpuSeconds, percentile, poissonRate } from './lib/stats.ts';
import { uniqueWorkload } from './lib/unique-workload.ts';

const { values } = parseArgs({
  options: {
    levels: { type: 'string', default: '1,32,256' },
    prompts: { type: 'string', default: 'short,long' },
    rounds: { type: 'string', default: '2' },
    profile: { type: 'string' },
    'profile-interval-us': { type: 'string', default: '1000' },
    warmup: { type: 'string', default: '2000' },
    'poisson-levels': { type: 'string', default: '32' },
    'profile-prompts': { type: 'string', default: 'short' },
  },
});
const levels = values.levels!.split(',').map(Number);
const poissonLevels = new Set(values['poisson-levels']!.split(',').filter(Boolean).map(Number));
const kinds = values.prompts!.split(',') as ('short' | 'long')[];
const rounds = Number(values.rounds);
const TTFT_MS = 20;
const ITL_MS = 5;

/** Requests per path at one level and prompt kind. */
function requestsFor(streams: number, kind: 'short' | 'long'): number {
  if (streams === 1) return 60;
  if (streams <= 32) return 1024;
  return kind === 'short' ? 4000 : 1024;
}
const outputFor = (streams: number) => (streams >= 256 ? 64 : 32);

// The helpers have no IPC channel: whatever way this script ends, they go with it.
const helpers: Spawned[] = [];
stopOnExit(helpers);
const backend = await spawnFixedBackend(TTFT_MS, ITL_MS);
helpers.push(backend);
const tcp = await spawnFloor('tcp', backend.url);
helpers.push(tcp);
const httpFloor = await spawnFloor('http', backend.url);
helpers.push(httpFloor);
const undiciFloor = await spawnFloor('undici', backend.url);
helpers.push(undiciFloor);
const gw = await startChildGateway((dir) => undecidingGatewayYaml(backend.url, dir));
const paths = [
  { name: 'direct', url: backend.url, pid: null as number | null },
  { name: 'tcp pass-through', url: tcp.url, pid: tcp.child.pid! },
  { name: 'node:http proxy', url: httpFloor.url, pid: httpFloor.child.pid! },
  { name: 'undici proxy', url: undiciFloor.url, pid: undiciFloor.child.pid! },
  { name: 'slagate', url: gw.url, pid: gw.child.pid! },
];

/** A closed loop of `streams`, or with `rate` Poisson arrivals (capped at 8 × streams in flight). */
const bench = (url: string, streams: number, workload: Workload, n: number, seed: number, rate?: number) =>
  runBench({
    target: url,
    workload,
    ...arrivals(streams, rate),
    requests: n,
    seed,
    progress: false,
  });

const lines: string[] = [];
const out = (s: string) => {
  lines.push(s);
  process.stdout.write(`${s}\n`);
};
out(
  '| prompts | streams | requests per path | path | TTFT p50 / p99 ms | added p50 / p99 ms | TPOT p50 ms | total s | proxy CPU ms per request | of which its main thread | failed |',
);
out('|---|---|---|---|---|---|---|---|---|---|---|');
try {
  const warmup = Number(values.warmup);
  for (const p of paths)
    if (p.pid !== null && warmup > 0)
      await bench(p.url, 32, uniqueWorkload('short', warmup, 32, 5), warmup, 5);
  const cells = levels.flatMap((streams) =>
    poissonLevels.has(streams)
      ? [
          { streams, poisson: false },
          { streams, poisson: true },
        ]
      : [{ streams, poisson: false }],
  );
  for (const kind of kinds) {
    for (const { streams, poisson } of cells) {
      const total = requestsFor(streams, kind);
      const per = Math.ceil(total / rounds);
      const outputTokens = outputFor(streams);
      const stats = paths.map(() => ({
        ttft: [] as number[],
        tpot: [] as number[],
        wallS: 0,
        cpuS: 0,
        mainS: 0,
        failed: 0,
        n: 0,
      }));
      let rate: number | undefined;
      for (const p of paths) {
        const warm = await bench(
          p.url,
          streams,
          uniqueWorkload(kind, 2 * streams, outputTokens, 7),
          2 * streams,
          7,
        );
        if (poisson && p.pid === null) rate = poissonRate(warm.records, streams);
      }
      for (let r = 0; r < rounds; r++) {
        for (let i = 0; i < paths.length; i++) {
          const k = (i + r) % paths.length;
          const p = paths[k]!;
          const s = stats[k]!;
          const wl = uniqueWorkload(kind, per, outputTokens, 1000 * (r + 1) + k);
          const cpu0 = p.pid === null ? 0 : cpuSeconds(p.pid);
          const main0 = p.pid === null ? 0 : mainThreadCpuSeconds(p.pid);
          const t0 = performance.now();
          const res = await bench(p.url, streams, wl, per, r + 1, rate);
          s.wallS += (performance.now() - t0) / 1000;
          if (p.pid !== null) {
            s.cpuS += cpuSeconds(p.pid) - cpu0;
            s.mainS += mainThreadCpuSeconds(p.pid) - main0;
          }
          s.failed += res.metrics.failed;
          s.n += per;
          for (const rec of res.records) {
            if (!rec.success) continue;
            s.ttft.push(rec.ttft * 1000);
            if (rec.outputLen > 1) s.tpot.push(((rec.latency - rec.ttft) / (rec.outputLen - 1)) * 1000);
          }
        }
      }
      for (const s of stats) {
        s.ttft.sort((a, b) => a - b);
        s.tpot.sort((a, b) => a - b);
      }
      const d50 = percentile(stats[0]!.ttft, 50);
      const d99 = percentile(stats[0]!.ttft, 99);
      const f = (x: number) => x.toFixed(2);
      const sign = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(2)}`;
      paths.forEach((p, k) => {
        const s = stats[k]!;
        const p50 = percentile(s.ttft, 50);
        const p99 = percentile(s.ttft, 99);
        const added = k === 0 ? '—' : `${sign(p50 - d50)} / ${sign(p99 - d99)}`;
        const cpu = p.pid === null ? '—' : ((s.cpuS * 1000) / s.n).toFixed(2);
        const main = p.pid === null ? '—' : ((s.mainS * 1000) / s.n).toFixed(2);
        out(
          `| ${kind} | ${poisson ? `${streams} (Poisson)` : streams} | ${s.n} | ${p.name} | ${f(p50)} / ${f(p99)} | ${added} | ${f(percentile(s.tpot, 50))} | ${s.wallS.toFixed(2)} | ${cpu} | ${main} | ${s.failed} |`,
        );
      });
    }
  }
} finally {
  await gw.stop();
}

if (values.profile !== undefined) {
  const dir = resolve(values.profile);
  mkdirSync(dir, { recursive: true });
  const before = new Set(readdirSync(dir));
  const prof = await startChildGateway((d) => undecidingGatewayYaml(backend.url, d), {
    nodeArgs: ['--cpu-prof', '--cpu-prof-dir', dir, '--cpu-prof-interval', values['profile-interval-us']!],
  });
  const streams = Math.max(...levels);
  const profiled = values['profile-prompts'] as 'short' | 'long';
  const n = requestsFor(streams, profiled);
  // Warmed as the table's proxies are (--warmup short requests at 32 streams), then a level's worth
  // of its own prompts: the profile's figures count from the measured requests on (the profile's
  // clock is the machine's monotonic one, which process.hrtime reads here too).
  const warm = Math.max(Number(values.warmup), 2 * streams);
  let fromUs: number;
  let toUs: number;
  try {
    await bench(prof.url, 32, uniqueWorkload('short', warm, 32, 5), warm, 5);
    await bench(
      prof.url,
      streams,
      uniqueWorkload(profiled, 2 * streams, outputFor(streams), 3),
      2 * streams,
      3,
    );
    fromUs = Number(process.hrtime.bigint() / 1000n);
    await bench(prof.url, streams, uniqueWorkload(profiled, n, outputFor(streams), 4), n, 4);
    // To the last response: the gateway's stop (its drain, the logs' flush) is no request's.
    toUs = Number(process.hrtime.bigint() / 1000n);
  } finally {
    await prof.stop();
  }
  const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile') && !before.has(f));
  if (file === undefined) throw new Error(`no .cpuprofile written in ${dir}`);
  out('');
  out(
    `CPU profile of slagate at ${streams} streams, ${n} requests of ${profiled} prompts (after ${warm} short and ${2 * streams} of its own to warm it), ${outputFor(streams)}-token outputs: ${join(dir, file)}`,
  );
  for (const l of summarizeProfile(join(dir, file), 25, { fromUs, toUs })) out(l);
  out('');
  for (const l of summarizeByModule(join(dir, file), n, { fromUs, toUs })) out(l);
}
// The helpers' pipes keep this process alive: stop them, so that a finished run exits.
for (const h of helpers) h.stop();
