// What a change to the request path costs: the gateway at HEAD against the gateway of another
// checkout (`--base DIR`, with its node_modules installed), in one run, in front of one fixed
// backend (TTFT 20 ms, a token every `--itl-ms` (10) ms, no batching: scripts/lib/fixed-backend.ts), against a
// direct connection to that backend.
//
//   git worktree add /tmp/slagate-base <commit> && (cd /tmp/slagate-base && npm ci)
//   npx tsx scripts/overhead-ab.ts --base /tmp/slagate-base [--levels 1,32] [--rounds 6]
//                                  [--workload sharegpt|unique|unique-long] [--tokens 32] [--itl-ms 10] [--warmup 2000]
//                                  [--arrivals closed|poisson]
//
// The three paths take turns: each level runs `rounds` rounds, and in every round each path sends
// requests/rounds requests, in an order that rotates from round to round, so that slow drift of the
// machine (two cores shared by the client, the backend and the gateways) falls on every path alike.
// Before the first level each gateway serves `--warmup` requests at 32 streams, so that both run
// their request path compiled, as a gateway does after its first minute of traffic: at one stream
// a few hundred requests leave most of it interpreted, and the path with more code then pays for
// its size in the interpreter rather than in what it does.
// Samples are pooled per path, and each gateway process's CPU time (utime + stime) over its own
// rounds is divided by its requests. Every gateway runs in its own process with the same YAML
// (scripts/lib/checkout-gateway.ts: keys both versions know, targets no load here reaches and
// limits above 256 streams, so nothing queues or is refused: the per-request work is measured, not
// a decision), the client (`slagate bench`, ShareGPT-like prompts, ~64-token outputs, closed loop
// at fixed concurrency; or with `--workload unique` unique 512-character prompts and `--tokens`
// (32) outputs, the request-path benchmark's short requests; `unique-long`: its unique prompts of
// about 8,000 tokens) in this one.
//
// `--arrivals poisson` sends each level's requests as Poisson arrivals at the rate that holds that
// many requests in flight on average (streams ÷ the direct path's mean request time, measured in
// the level's warm-up), with no cap that binds. A closed loop of equal-length requests keeps its
// streams in step: they end together and their next requests arrive together, so every request
// waits behind the whole burst's intake (docs/benchmarks.md, "Bursts at 32 streams").
import { parseArgs } from 'node:util';
import { startChildGateway, stopChild } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';
import { startCheckoutGateway, undecidingGatewayYaml } from './lib/checkout-gateway.ts';
import { spawnFixedBackend, stopOnExit } from './lib/spawn-fixed-backend.ts';
import { arrivals, cpuSeconds, percentile, poissonRate } from './lib/stats.ts';
import { uniqueWorkload } from './lib/unique-workload.ts';

const { values } = parseArgs({
  options: {
    base: { type: 'string' },
    levels: { type: 'string', default: '1,32' },
    rounds: { type: 'string', default: '6' },
    requests: { type: 'string', default: '0' },
    workload: { type: 'string', default: 'sharegpt' },
    warmup: { type: 'string', default: '2000' },
    'itl-ms': { type: 'string', default: '10' },
    arrivals: { type: 'string', default: 'closed' },
    tokens: { type: 'string', default: '32' },
  },
});
if (values.base === undefined) throw new Error('--base DIR is required (a checkout with node_modules)');
const levels = values.levels!.split(',').map(Number);
const rounds = Number(values.rounds);
const SHORT = { sharegpt: { outputMedian: 64, outputSigma: 0.5 } };
if (values.workload !== 'sharegpt' && values.workload !== 'unique' && values.workload !== 'unique-long')
  throw new Error('--workload is sharegpt, unique or unique-long');
/** `unique` and `unique-long`: prompts no two requests share (scripts/lib/unique-workload.ts), 512 characters or about 8,000 tokens. */
const UNIQUE = values.workload !== 'sharegpt';
const PROMPTS = values.workload === 'unique-long' ? 'long' : 'short';
if (values.arrivals !== 'closed' && values.arrivals !== 'poisson')
  throw new Error('--arrivals is closed or poisson');
const POISSON = values.arrivals === 'poisson';

const backend = await spawnFixedBackend(20, Number(values['itl-ms']));
// Whatever way this script ends (a gateway that fails to start included), it goes with it.
stopOnExit([backend]);
const direct = backend.url;
const head = await startChildGateway((dir) => undecidingGatewayYaml(direct, dir));
const base = await startCheckoutGateway(values.base, (dir) => undecidingGatewayYaml(direct, dir));
const paths: [string, string][] = [
  ['direct', direct],
  ['base', base.url],
  ['head', head.url],
];
/** The gateway processes, whose CPU time over their own rounds is counted per request. */
const pids = new Map<string, number>([
  ['base', base.child.pid!],
  ['head', head.child.pid!],
]);
const rows = [
  '| streams | requests per path | TTFT p50 direct / base / HEAD ms | added p50 base / HEAD (HEAD − base) ms | TTFT p99 direct / base / HEAD ms | added p99 base / HEAD ms | TPOT p50 direct / base / HEAD ms | gateway CPU ms per request base / HEAD | failed direct / base / HEAD |',
  '|---|---|---|---|---|---|---|---|---|',
];
try {
  const warmup = Number(values.warmup);
  for (const [name, url] of paths) {
    if (name === 'direct' || warmup <= 0) continue;
    await runBench({
      target: url,
      workload: uniqueWorkload('short', warmup, 32, 98),
      concurrency: 32,
      requests: warmup,
      seed: 98,
      progress: false,
    });
  }
  for (const c of levels) {
    const total = Number(values.requests) || (c === 1 ? 240 : Math.max(1536, c * 48));
    const per = Math.ceil(total / rounds);
    const ttft = new Map<string, number[]>(paths.map(([name]) => [name, []]));
    const tpot = new Map<string, number[]>(paths.map(([name]) => [name, []]));
    const cpu = new Map<string, number>([
      ['base', 0],
      ['head', 0],
    ]);
    const failed = new Map<string, number>(paths.map(([name]) => [name, 0]));
    // Poisson: set from the direct path's warm-up below; the cap is there only to bound a stall.
    let rate: number | undefined;
    const bench = (target: string, k: number, seed: number) =>
      runBench({
        target,
        ...(UNIQUE
          ? { workload: uniqueWorkload(PROMPTS, k, Number(values.tokens), seed) }
          : { workload: 'sharegpt' as const, workloadParams: SHORT }),
        ...arrivals(c, rate),
        requests: k,
        seed,
        progress: false,
      });
    for (const [name, url] of paths) {
      const warm = await bench(url, 4 * c, 99); // warm: connections, JIT, the limits' ramp
      if (name === 'direct' && POISSON) rate = poissonRate(warm.records, c);
    }
    for (let r = 0; r < rounds; r++) {
      for (let i = 0; i < paths.length; i++) {
        const [name, url] = paths[(i + r) % paths.length]!;
        const pid = pids.get(name);
        const cpuBefore = pid === undefined ? 0 : cpuSeconds(pid);
        const res = await bench(url, per, r + 1);
        if (pid !== undefined) cpu.set(name, cpu.get(name)! + cpuSeconds(pid) - cpuBefore);
        for (const rec of res.records) {
          if (!rec.success) {
            const n = failed.get(name)! + 1;
            failed.set(name, n);
            if (n <= 3) console.error(`  ${name} failed: ${rec.status ?? 'no response'} ${rec.error}`);
            continue;
          }
          ttft.get(name)!.push(rec.ttft * 1000);
          if (rec.outputLen > 1)
            tpot.get(name)!.push(((rec.latency - rec.ttft) / (rec.outputLen - 1)) * 1000);
        }
      }
    }
    const q = (m: Map<string, number[]>, name: string, p: number) =>
      percentile(
        [...m.get(name)!].sort((a, b) => a - b),
        p,
      );
    const f = (x: number) => x.toFixed(2);
    const sign = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(2)}`;
    const [d50, b50, h50] = ['direct', 'base', 'head'].map((n) => q(ttft, n, 50)) as [number, number, number];
    const [d99, b99, h99] = ['direct', 'base', 'head'].map((n) => q(ttft, n, 99)) as [number, number, number];
    const tp = ['direct', 'base', 'head'].map((n) => f(q(tpot, n, 50))).join(' / ');
    const cpuMs = ['base', 'head'].map((n) => f((cpu.get(n)! * 1000) / (per * rounds))).join(' / ');
    const level = rate === undefined ? String(c) : `${c} (Poisson, ${rate.toFixed(1)}/s)`;
    rows.push(
      `| ${level} | ${per * rounds} | ${f(d50)} / ${f(b50)} / ${f(h50)} | ${sign(b50 - d50)} / ${sign(h50 - d50)} (${sign(h50 - b50)}) | ${f(d99)} / ${f(b99)} / ${f(h99)} | ${sign(b99 - d99)} / ${sign(h99 - d99)} | ${tp} | ${cpuMs} | ${['direct', 'base', 'head'].map((n) => failed.get(n)).join(' / ')} |`,
    );
    console.error(rows.at(-1));
  }
} finally {
  await head.stop();
  await stopChild(base.child);
  backend.stop();
}
console.log(rows.join('\n'));
