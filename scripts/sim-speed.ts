// The simulator must not be the bottleneck: one process simulating 8 replicas at 50 req/s of
// 2,000-token prompts keeps its own event-loop delay P99 under 10 ms. This runs the fleet in this
// process (time scale 1, real HTTP on 127.0.0.1), drives it from a separate load process, and
// prints the event-loop delay percentiles and CPU use of the fleet process.
//
//   npx tsx scripts/sim-speed.ts [--replicas 8] [--rate 50] [--seconds 20] [--tokens 2000]

import { spawn } from 'node:child_process';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { startFleet } from '../src/sim/fleet.ts';

const { values } = parseArgs({
  options: {
    replicas: { type: 'string', default: '8' },
    rate: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '20' },
    tokens: { type: 'string', default: '2000' },
    profile: { type: 'string', default: 'llama3-8b-h100' },
  },
});

const fleet = await startFleet({ replicas: Number(values.replicas), profile: values.profile!, timeScale: 1 });
const loop = monitorEventLoopDelay({ resolution: 1 });
const cpu0 = process.cpuUsage();
const t0 = performance.now();
loop.enable();
const child = spawn(
  process.execPath,
  [
    '--import',
    'tsx',
    new URL('./lib/open-loop-load.ts', import.meta.url).pathname,
    '--urls',
    fleet.urls.join(','),
    '--rate',
    values.rate!,
    '--seconds',
    values.seconds!,
    '--tokens',
    values.tokens!,
  ],
  { stdio: ['ignore', 'pipe', 'inherit'] },
);
let out = '';
child.stdout.on('data', (d) => {
  out += d;
});
await new Promise((resolve) => child.on('exit', resolve));
loop.disable();
const wallS = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
const ms = (ns: number) => (ns / 1e6).toFixed(2);
const load = JSON.parse(out.trim() || '{}') as { sent?: number; ok?: number; failed?: number };
const engineTotals = fleet.replicas.map((r) => r.engine.stats());
console.log(
  JSON.stringify(
    {
      replicas: Number(values.replicas),
      rate: Number(values.rate),
      prompt_tokens: Number(values.tokens),
      seconds: Number(values.seconds),
      load,
      prompt_tokens_served: engineTotals.reduce((a, s) => a + s.promptTokens, 0),
      event_loop_delay_ms: {
        p50: ms(loop.percentile(50)),
        p90: ms(loop.percentile(90)),
        p99: ms(loop.percentile(99)),
        max: ms(loop.max),
      },
      fleet_cpu_share_of_one_core: ((cpu.user + cpu.system) / 1e6 / wallS).toFixed(3),
    },
    null,
    2,
  ),
);
await fleet.close();
