// What a change to the request path costs in gateway CPU, measured on fresh processes: the gateway
// of another checkout (`--base DIR`) and this one's take turns, each run in a gateway process of
// its own that serves a warm-up and then a fixed load, and the script reports each side's median
// CPU per request over its runs.
//
//   git worktree add /tmp/slagate-base <commit> && (cd /tmp/slagate-base && npm ci)
//   npx tsx scripts/cpu-ab.ts --base /tmp/slagate-base [--streams 256] [--tokens 64] [--itl-ms 5]
//                             [--requests 4000] [--runs 6] [--prompts short|long]
//
// Why not overhead-ab.ts for CPU: it keeps one process per side for the whole run, and a process
// keeps whatever its start gave it (JIT decisions, heap layout). Run against itself at 256
// streams, it put the second gateway 3–5% above the first with the same code, in two runs of two
// layouts: the size of the effects it was asked to tell. A new process per run spreads that
// over the runs of both sides; the order alternates run by run.
//
// The backend is scripts/lib/fixed-backend.ts (first token after 20 ms, then one every --itl-ms,
// no batching); prompts are unique 512-character ones, or with `--prompts long` unique 8,000-token
// ones (scripts/lib/unique-workload.ts; the warm-up is always short prompts); the
// gateway is configured as in scripts/request-path.ts (undecidingGatewayYaml), so that nothing
// queues or is refused.
// CPU is the gateway process's utime + stime (/proc, 10 ms ticks) over the measured load only.

import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { stopChild } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';
import { startCheckoutGateway, undecidingGatewayYaml } from './lib/checkout-gateway.ts';
import { spawnFixedBackend, stopOnExit } from './lib/spawn-fixed-backend.ts';
import { cpuSeconds } from './lib/stats.ts';
import { uniqueWorkload } from './lib/unique-workload.ts';

const { values } = parseArgs({
  options: {
    base: { type: 'string' },
    streams: { type: 'string', default: '256' },
    tokens: { type: 'string', default: '64' },
    'itl-ms': { type: 'string', default: '5' },
    requests: { type: 'string', default: '4000' },
    runs: { type: 'string', default: '6' },
    warmup: { type: 'string', default: '2000' },
    prompts: { type: 'string', default: 'short' },
  },
});
if (values.base === undefined) throw new Error('--base DIR is required (a checkout with node_modules)');
const STREAMS = Number(values.streams);
const TOKENS = Number(values.tokens);
const REQUESTS = Number(values.requests);
const RUNS = Number(values.runs);
const WARMUP = Number(values.warmup);
if (values.prompts !== 'short' && values.prompts !== 'long') throw new Error('--prompts is short or long');
const PROMPTS = values.prompts;
const SIDES = { base: values.base, head: join(import.meta.dirname, '..') };

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

const backend = await spawnFixedBackend(20, Number(values['itl-ms']));
stopOnExit([backend]);
const cpu: Record<keyof typeof SIDES, number[]> = { base: [], head: [] };
let failed = 0;
try {
  for (let r = 0; r < RUNS; r++) {
    const order: (keyof typeof SIDES)[] = r % 2 === 0 ? ['base', 'head'] : ['head', 'base'];
    for (const side of order) {
      const g = await startCheckoutGateway(SIDES[side], (dir) => undecidingGatewayYaml(backend.url, dir));
      try {
        const warm = uniqueWorkload('short', WARMUP, TOKENS, 7);
        await runBench({
          target: g.url,
          workload: warm,
          concurrency: 32,
          requests: WARMUP,
          seed: 7,
          progress: false,
        });
        const before = cpuSeconds(g.child.pid!);
        const load = uniqueWorkload(PROMPTS, REQUESTS, TOKENS, 100 + r);
        const res = await runBench({
          target: g.url,
          workload: load,
          concurrency: STREAMS,
          requests: REQUESTS,
          seed: 100 + r,
          progress: false,
        });
        const ms = ((cpuSeconds(g.child.pid!) - before) * 1000) / REQUESTS;
        cpu[side].push(ms);
        failed += res.metrics.failed;
        console.error(
          `  run ${r + 1} ${side}: ${ms.toFixed(3)} ms per request, ${res.metrics.failed} failed`,
        );
      } finally {
        await stopChild(g.child);
        rmSync(g.dir, { recursive: true, force: true });
      }
    }
  }
} finally {
  backend.stop();
}
const b = median(cpu.base);
const h = median(cpu.head);
const runs = (xs: number[]) => xs.map((x) => x.toFixed(2)).join(', ');
console.log(
  `| prompts | streams | tokens | runs | gateway CPU ms per request, median base / HEAD (HEAD ÷ base) | base runs | HEAD runs | failed |\n` +
    `|---|---|---|---|---|---|---|---|\n` +
    `| ${PROMPTS} | ${STREAMS} | ${TOKENS} every ${values['itl-ms']} ms | ${RUNS} | ${b.toFixed(3)} / ${h.toFixed(3)} (${(h / b).toFixed(3)}) | ${runs(cpu.base)} | ${runs(cpu.head)} | ${failed} |`,
);
