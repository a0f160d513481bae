// What the gateway adds, in one run, then the most streamed requests per second one gateway
// process sustains. Backends, the gateway and this client each run in their own process.
//
// Part 1, fixed backend: a backend whose every stream has TTFT 20 ms and a token every 10 ms,
// whatever the load (scripts/lib/fixed-backend.ts). With no batching there is no noise to average
// away: direct and through the gateway run one after the other and the difference is the
// gateway's, hop included. The gateway's own TTFT (admission log) splits that difference into the
// client↔gateway hop and the gateway's work up to its first token.
//
// Part 2, simulated H100 replicas (time scale 1). At each level two phases run, each with two
// paths at the same time:
//   A/A: C streams straight to replica 0 and C straight to replica 1: the noise floor (two
//        identical engines under the same machine load still differ run to run);
//   A/B: C streams straight to replica 0 and C through the gateway, whose only backend is replica 1.
// The gateway's cost is the A/B difference read against the A/A one. Paths never share a replica,
// so a request the gateway delays does not fall behind direct requests in the same engine queue;
// and the two paths run at once, so they see the same machine. (Back-to-back runs on one replica
// were no use: at 32 streams its median TTFT moves by ±7 ms between identical runs.)

import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { percentile } from '../src/bench/metrics.ts';
import { startChildFleet, startChildGateway } from '../src/bench/processes.ts';
import { type BenchResult, runBench } from '../src/bench/run.ts';
import { spawnFixedBackend } from './lib/spawn-fixed-backend.ts';
import { cpuSeconds } from './lib/stats.ts';

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

/** NaN when nothing was measured (printed as such). */
const p = (r: BenchResult, name: 'ttft' | 'tpot', q: number): number =>
  (q === 50 ? r.metrics[name].median : r.metrics[name].percentiles.find(([k]) => k === q)?.[1]) ?? Number.NaN;

// Part 1: fixed backend.
const fixedRows = [
  '| streams | requests per path | TTFT p50 direct / gateway (added) ms | TTFT p99 direct / gateway (added) ms | TPOT p50 direct / gateway (added) ms | gateway-measured TTFT p50 ms | failed |',
  '|---|---|---|---|---|---|---|',
];
{
  const backend = await spawnFixedBackend(20, 10);
  const url = backend.url;
  const gw = await startChildGateway(gatewayYaml([url]));
  const admissionLines = () => readFileSync(`${gw.dir}/admission.log`, 'utf8').split('\n').filter(Boolean);
  try {
    for (const c of levels) {
      const n = Number(values.requests) || (c === 1 ? 100 : Math.max(512, c * 4));
      const run = (target: string, k: number) =>
        runBench({
          target,
          workload: 'sharegpt',
          workloadParams: SHORT,
          concurrency: c,
          requests: k,
          seed: 1,
          progress: false,
        });
      await run(url, 2 * c);
      await run(gw.url, 2 * c);
      const direct = await run(url, n);
      const seen = admissionLines().length;
      const via = await run(gw.url, n);
      await new Promise((r) => setTimeout(r, 300)); // the admission log writes asynchronously
      const gwTtft = admissionLines()
        .slice(seen)
        .map((l) => (JSON.parse(l) as { ttft_ms: number | null }).ttft_ms)
        .filter((x): x is number => x !== null)
        .sort((x, y) => x - y);
      const cell = (f: 'ttft' | 'tpot', q: number) => {
        const a_ = p(direct, f, q);
        const b_ = p(via, f, q);
        return `${a_.toFixed(2)} / ${b_.toFixed(2)} (${b_ - a_ >= 0 ? '+' : ''}${(b_ - a_).toFixed(2)})`;
      };
      fixedRows.push(
        `| ${c} | ${n} | ${cell('ttft', 50)} | ${cell('ttft', 99)} | ${cell('tpot', 50)} | ${gwTtft.length === 0 ? '–' : percentile(gwTtft, 50).toFixed(2)} | ${direct.metrics.failed + via.metrics.failed} |`,
      );
      console.error(fixedRows.at(-1));
    }
  } finally {
    await gw.stop();
    backend.stop();
  }
}

const rows = [
  '| streams per path | requests per path | TTFT p50 A/A (diff) ms | TTFT p50 direct / gateway (added) ms | TTFT p99 A/A (diff) ms | TTFT p99 direct / gateway (added) ms | TPOT p50 A/A (diff) ms | TPOT p50 direct / gateway (added) ms | failed |',
  '|---|---|---|---|---|---|---|---|---|',
];
{
  const fleet = await startChildFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 1 });
  const [r0, r1] = fleet.urls as [string, string];
  const gw = await startChildGateway(gatewayYaml([r1]));
  try {
    for (const c of levels) {
      // P99 needs samples: 1,024 per path from 32 streams up (one stream runs 128, ~1 min a phase).
      const n = Number(values.requests) || (c === 1 ? 128 : Math.max(1024, c * 4));
      // Warm every path at this concurrency (connections, JIT); not measured.
      await Promise.all([bench(r0, c, Math.max(16, c), 99), bench(gw.url, c, Math.max(16, c), 98)]);
      // Different seeds per path: the same prompt twice would be a prefix-cache hit.
      const [aa0, aa1] = await Promise.all([bench(r0, c, n, 1), bench(r1, c, n, 2)]);
      const [ab0, ab1] = await Promise.all([bench(r0, c, n, 3), bench(gw.url, c, n, 4)]);
      const cell = (x: BenchResult, y: BenchResult, f: 'ttft' | 'tpot', q: number, labelled: boolean) => {
        const a_ = p(x, f, q);
        const b_ = p(y, f, q);
        const d = `${b_ - a_ >= 0 ? '+' : ''}${(b_ - a_).toFixed(2)}`;
        return labelled ? `${a_.toFixed(2)} / ${b_.toFixed(2)} (${d})` : `(${d})`;
      };
      const failed = [aa0, aa1, ab0, ab1].reduce((a_, r) => a_ + r.metrics.failed, 0);
      rows.push(
        `| ${c} | ${n} | ${cell(aa0, aa1, 'ttft', 50, false)} | ${cell(ab0, ab1, 'ttft', 50, true)} | ${cell(aa0, aa1, 'ttft', 99, false)} | ${cell(ab0, ab1, 'ttft', 99, true)} | ${cell(aa0, aa1, 'tpot', 50, false)} | ${cell(ab0, ab1, 'tpot', 50, true)} | ${failed} |`,
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
    const cpu0 = cpuSeconds(gw.child.pid!);
    const via = await peak(gw.url);
    const cpu1 = cpuSeconds(gw.child.pid!);
    console.log('Fixed backend (TTFT 20 ms, a token every 10 ms), direct then through the gateway:\n');
    console.log(fixedRows.join('\n'));
    console.log('\nSimulated H100 replicas, A/A and A/B at the same time:\n');
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
