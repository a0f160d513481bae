// What the gateway adds: the same workload, seed and concurrency sent straight to a simulated
// replica and through one gateway in front of it, in one run, at 1, 32 and 256 concurrent
// streams; then the most streamed requests per second one gateway process sustains. The
// simulator, the gateway and this client each run in their own process.
//
//   npx tsx scripts/overhead.ts [--requests-per-level 256] [--levels 1,32,256]

import { parseArgs } from 'node:util';
import { type BenchResult, runBench } from '../src/bench/run.ts';
import { startChildFleet } from './lib/child-fleet.ts';
import { startChildGateway } from './lib/child-gateway.ts';

const { values } = parseArgs({
  options: {
    levels: { type: 'string', default: '1,32,256' },
    requests: { type: 'string', default: '0' },
    'peak-seconds': { type: 'string', default: '20' },
  },
});
const levels = values.levels!.split(',').map(Number);

function gatewayYaml(urls: string[], extra = ''): string {
  return [
    'server: { host: 127.0.0.1, port: 0 }',
    'models: [meta-llama/Llama-3.1-8B-Instruct]',
    'backends:',
    ...urls.map((u, i) => `  - { name: r${i}, url: "${u}" }`),
    'router: { policy: least_loaded }',
    'scheduler: { concurrency: { max: 512 } }',
    'upstream: { max_connections_per_backend: 1024 }',
    'logging: { level: warn, admission_log: $DIR/admission.log }',
    extra,
  ].join('\n');
}

// Short chats (ShareGPT-like lengths, capped so one run stays short).
const SHORT = { sharegpt: { outputMedian: 64, outputSigma: 0.5 } };

async function bench(
  target: string,
  concurrency: number,
  requests: number,
  seed: number,
): Promise<BenchResult> {
  return runBench({
    target,
    workload: 'sharegpt',
    workloadParams: SHORT,
    concurrency,
    requests,
    seed,
    progress: false,
  });
}

const p = (r: BenchResult, name: 'ttft' | 'tpot', q: number) =>
  name === 'ttft' && q === 50
    ? r.metrics.ttft.median
    : name === 'tpot' && q === 50
      ? r.metrics.tpot.median
      : (r.metrics[name].percentiles.find(([k]) => k === q)?.[1] ?? Number.NaN);

const rows = [
  '| concurrent streams | requests | TTFT p50 direct / gateway (added) ms | TTFT p99 direct / gateway (added) ms | TPOT p50 direct / gateway (added) ms | failed |',
  '|---|---|---|---|---|---|',
];

// 1. Added latency, time scale 1 (real H100 timings).
{
  const fleet = await startChildFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 1 });
  const gw = await startChildGateway(gatewayYaml(fleet.urls));
  try {
    for (const c of levels) {
      const n = Number(values.requests) || Math.max(64, c * 4);
      // Warm both paths (connections, JIT) with a few requests that are not measured.
      await bench(fleet.urls[0]!, Math.min(c, 8), 8, 99);
      await bench(gw.url, Math.min(c, 8), 8, 99);
      const direct = await bench(fleet.urls[0]!, c, n, 1);
      const via = await bench(gw.url, c, n, 1);
      const add = (a: number, b: number) =>
        `${a.toFixed(2)} / ${b.toFixed(2)} (${(b - a >= 0 ? '+' : '') + (b - a).toFixed(2)})`;
      rows.push(
        `| ${c} | ${n} | ${add(p(direct, 'ttft', 50), p(via, 'ttft', 50))} | ${add(p(direct, 'ttft', 99), p(via, 'ttft', 99))} | ${add(p(direct, 'tpot', 50), p(via, 'tpot', 50))} | ${direct.metrics.failed} / ${via.metrics.failed} |`,
      );
      console.error(rows.at(-1));
    }
  } finally {
    await gw.stop();
    await fleet.stop();
  }
}

// 2. Peak: a fast backend (time scale 0.02) so the gateway, not the simulated GPU, is the limit.
{
  const fleet = await startChildFleet({ replicas: 4, profile: 'llama3-8b-h100', timeScale: 0.02 });
  const gw = await startChildGateway(gatewayYaml(fleet.urls));
  const seconds = Number(values['peak-seconds']);
  try {
    const peak = async (target: string) =>
      runBench({
        target,
        workload: 'sharegpt',
        workloadParams: {
          sharegpt: { outputMedian: 16, outputSigma: 0.3, inputMedian: 64, inputSigma: 0.3 },
        },
        concurrency: 256,
        durationS: seconds,
        seed: 2,
        progress: false,
      });
    await peak(gw.url).catch(() => undefined);
    const direct = await runBench({
      target: fleet.urls[0]!,
      workload: 'sharegpt',
      workloadParams: { sharegpt: { outputMedian: 16, outputSigma: 0.3, inputMedian: 64, inputSigma: 0.3 } },
      concurrency: 256,
      durationS: seconds,
      seed: 2,
      progress: false,
    });
    const cpu0 = await cpuSeconds(gw.child.pid!);
    const via = await peak(gw.url);
    const cpu1 = await cpuSeconds(gw.child.pid!);
    console.log(rows.join('\n'));
    console.log('');
    console.log(
      '| peak (256 streams, ~16-token outputs, 4 replicas at time scale 0.02) | req/s | output tok/s | failed | gateway CPU (cores) |',
    );
    console.log('|---|---|---|---|---|');
    console.log(
      `| direct to one replica | ${direct.metrics.requestThroughput.toFixed(0)} | ${direct.metrics.outputThroughput.toFixed(0)} | ${direct.metrics.failed} | – |`,
    );
    console.log(
      `| through one gateway (4 replicas) | ${via.metrics.requestThroughput.toFixed(0)} | ${via.metrics.outputThroughput.toFixed(0)} | ${via.metrics.failed} | ${((cpu1 - cpu0) / via.info.durationS).toFixed(2)} |`,
    );
  } finally {
    await gw.stop();
    await fleet.stop();
  }
}

async function cpuSeconds(pid: number): Promise<number> {
  const { readFileSync } = await import('node:fs');
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
}
