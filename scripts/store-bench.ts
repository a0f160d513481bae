// Memory store vs Redis store, in one run. Four gateways (memory and Redis store, each in front
// of replica 0 and of replica 1 of one simulated fleet at time scale 1) and a real redis-server on
// a free port. Phase 1 loads memory→r0 and redis→r1 at the same time; phase 2 swaps the replicas
// (memory→r1, redis→r0). Pooling the two phases cancels any difference between the replicas, and
// running the two stores at once gives both the same machine. Prints TTFT per store, the Redis
// minus memory difference, and what Redis did per request (INFO commandstats before and after).
//
//   npx tsx scripts/store-bench.ts [--concurrency 32] [--requests 1024] [--rounds 1]

import { parseArgs } from 'node:util';
import { startChildFleet, startChildGateway } from '../src/bench/processes.ts';
import { type BenchResult, runBench } from '../src/bench/run.ts';
import { startRedisServer } from '../test/helpers/redis-server.ts';

const { values } = parseArgs({
  options: {
    concurrency: { type: 'string', default: '32' },
    requests: { type: 'string', default: '1024' },
    rounds: { type: 'string', default: '1' },
  },
});
const concurrency = Number(values.concurrency);
const requests = Number(values.requests);
const rounds = Number(values.rounds);

function yaml(urls: string[], state: string): string {
  return [
    'server: { host: 127.0.0.1, port: 0 }',
    'models: [meta-llama/Llama-3.1-8B-Instruct]',
    'backends:',
    ...urls.map((u, i) => `  - { name: r${i}, url: "${u}" }`),
    'router: { policy: least_loaded }',
    `state: ${state}`,
    'logging: { level: warn, admission_log: $DIR/admission.log }',
  ].join('\n');
}

async function commandStats(cli: (...a: string[]) => Promise<string>): Promise<Map<string, number>> {
  const out = await cli('INFO', 'commandstats');
  const m = new Map<string, number>();
  for (const line of out.split('\n')) {
    const r = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim());
    if (r) m.set(r[1]!, Number(r[2]));
  }
  return m;
}

const redis = await startRedisServer();
const fleet = await startChildFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 1 });
const redisState = `{ store: redis, redis_url: "${redis.url}", refresh_interval_ms: 500, command_timeout_ms: 100 }`;
const gateways = {
  memory: await Promise.all(fleet.urls.map((u) => startChildGateway(yaml([u], '{ store: memory }')))),
  redis: await Promise.all(fleet.urls.map((u) => startChildGateway(yaml([u], redisState)))),
};
const run = (target: string, seed: number, n = requests): Promise<BenchResult> =>
  runBench({
    target,
    workload: 'sharegpt',
    workloadParams: { sharegpt: { outputMedian: 64, outputSigma: 0.5 } },
    concurrency,
    requests: n,
    seed,
    progress: false,
  });

const pct = (xs: number[], q: number) => {
  const s_ = [...xs].sort((a, b) => a - b);
  const rank = (q / 100) * (s_.length - 1);
  const lo = Math.floor(rank);
  return s_[lo]! + (s_[Math.ceil(rank)]! - s_[lo]!) * (rank - lo);
};

try {
  // Warm-up: connections and JIT on every path.
  await Promise.all([...gateways.memory, ...gateways.redis].map((g, i) => run(g.url, 90 + i, concurrency)));
  const ttft = { memory: [] as number[], redis: [] as number[] };
  const failed = { memory: 0, redis: 0 };
  let redisRequests = 0;
  let redisSeconds = 0;
  const perCommand = new Map<string, number>();
  for (let round = 0; round < rounds; round++) {
    for (const swap of [0, 1]) {
      const before = await commandStats(redis.cli);
      const t0 = performance.now();
      // Different seeds: the same prompt on both would be compared with itself, not the store.
      const [m, r] = await Promise.all([
        run(gateways.memory[swap]!.url, 1 + 4 * round + 2 * swap),
        run(gateways.redis[1 - swap]!.url, 2 + 4 * round + 2 * swap),
      ]);
      redisSeconds += (performance.now() - t0) / 1000;
      const after = await commandStats(redis.cli);
      for (const [cmd, calls] of after) {
        const delta = calls - (before.get(cmd) ?? 0) - (cmd === 'info' ? 1 : 0);
        if (delta > 0) perCommand.set(cmd, (perCommand.get(cmd) ?? 0) + delta);
      }
      redisRequests += r.metrics.completed;
      for (const [k, res] of [
        ['memory', m],
        ['redis', r],
      ] as const) {
        ttft[k].push(...res.records.filter((x) => x.success).map((x) => x.ttft * 1000));
        failed[k] += res.metrics.failed;
      }
    }
  }
  console.log(
    `${rounds} round(s) × 2 phases × ${requests} requests per store, ${concurrency} streams per store, ` +
      'two replicas of llama3-8b-h100 at time scale 1\n',
  );
  console.log('| store | requests | failed | TTFT p50 ms | TTFT p99 ms |');
  console.log('|---|---|---|---|---|');
  for (const k of ['memory', 'redis'] as const) {
    console.log(
      `| ${k} | ${ttft[k].length} | ${failed[k]} | ${pct(ttft[k], 50).toFixed(2)} | ${pct(ttft[k], 99).toFixed(2)} |`,
    );
  }
  const d50 = pct(ttft.redis, 50) - pct(ttft.memory, 50);
  const d99 = pct(ttft.redis, 99) - pct(ttft.memory, 99);
  console.log(
    `| redis − memory | | | ${d50 >= 0 ? '+' : ''}${d50.toFixed(2)} | ${d99 >= 0 ? '+' : ''}${d99.toFixed(2)} |`,
  );
  console.log('');
  // Only EVAL/EVALSHA come from the client (one round trip each); the rest run inside the script.
  const roundTrips = (perCommand.get('evalsha') ?? 0) + (perCommand.get('eval') ?? 0);
  const allCommands = [...perCommand.values()].reduce((a, b) => a + b, 0);
  console.log(
    `Redis while the stores were loaded (${redisRequests} requests through the Redis-store gateways, ${redisSeconds.toFixed(1)} s, ` +
      `two Redis-store gateways syncing): ${roundTrips} round trips = ${(roundTrips / redisRequests).toFixed(3)} per request ` +
      `(${(roundTrips / redisSeconds).toFixed(2)} per second, whatever the request rate); ` +
      `${allCommands} commands executed by Redis in all, inside the sync script included ` +
      `(${[...perCommand].map(([c, n]) => `${c} ${n}`).join(', ')}).`,
  );
} finally {
  await Promise.all([...gateways.memory, ...gateways.redis].map((g) => g.stop()));
  await fleet.stop();
  await redis.stop();
}
