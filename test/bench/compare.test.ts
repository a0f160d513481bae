// `bench compare`: the pure parts on hand-made data, then real runs (simulated fleets and
// gateways as child processes on 127.0.0.1, no mocks) through runCompare and through the CLI.
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RequestRecord } from '../../src/bench/client.ts';
import {
  type CompareResult,
  prefixHitAfter,
  readPrefixCounters,
  runCompare,
} from '../../src/bench/compare.ts';
import { gatewayConfig, parsePolicies, parsePolicyItem } from '../../src/bench/compare-config.ts';
import {
  formatCompareTable,
  goodputRate,
  prefixHitRate,
  runFigures,
  sumCounter,
} from '../../src/bench/compare-report.ts';
import { computeMetrics } from '../../src/bench/metrics.ts';
import { startChildFleets } from '../../src/bench/processes.ts';
import { ROUTER_POLICIES } from '../../src/config/schema.ts';
import { getProfile } from '../../src/sim/profiles.ts';
import { SimReplica } from '../../src/sim/replica.ts';
import { runSlagate, SMALL_SWEEP } from '../helpers/cli.ts';

const SLO = { ttft: 500, tpot: 50 };

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'slagate-compare-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('the table', () => {
  it("marks an interrupted run's partial figures as such, and a failed run's missing ones", () => {
    const figures = runFigures([], computeMetrics([], 1, { percentiles: [99], slo: SLO }), 2, SLO, null);
    const run = (error: string | null, withFigures: boolean) => ({
      policy: 'p',
      router: 'slagate',
      scheduler: 'slagate',
      rate: 1,
      error,
      figures: withFigures ? figures : null,
      benchJson: null,
    });
    const lines = formatCompareTable(
      [run(null, true), run('interrupted', true), run('no start', false)],
      {},
      false,
    )
      .split('\n')
      .slice(1);
    expect(lines[0]).toMatch(/ 0\/0 /);
    expect(lines[0]).not.toMatch(/interrupted/);
    expect(lines[1]).toMatch(/ 0\/0 interrupted /);
    expect(lines[2]).toMatch(/ error /);
  });
});

describe('policy items', () => {
  it('reads ROUTER[/SCHEDULER], the scheduler defaulting to slagate, the label as written', () => {
    expect(parsePolicyItem('round_robin')).toEqual({
      label: 'round_robin',
      router: 'round_robin',
      scheduler: 'slagate',
    });
    expect(parsePolicyItem(' least_loaded/fcfs ')).toEqual({
      label: 'least_loaded/fcfs',
      router: 'least_loaded',
      scheduler: 'fcfs',
    });
    expect(parsePolicyItem('oracle').router).toBe('oracle');
    // Every router.policy the YAML accepts is a valid item.
    for (const p of ROUTER_POLICIES) expect(parsePolicyItem(`${p}/fcfs`).router).toBe(p);
  });

  it('rejects unknown routers and schedulers, empty items, extra slashes and repeated labels', () => {
    expect(() => parsePolicyItem('bogus')).toThrow(/unknown router "bogus"/);
    expect(() => parsePolicyItem('round_robin/lifo')).toThrow(/unknown scheduler "lifo"/);
    expect(() => parsePolicyItem('')).toThrow(/bad policy/);
    expect(() => parsePolicyItem('a/b/c')).toThrow(/bad policy/);
    expect(() => parsePolicies('round_robin,,fcfs')).toThrow(/bad policy/);
    expect(() => parsePolicies('round_robin,round_robin')).toThrow(/listed twice/);
    expect(parsePolicies('round_robin,round_robin/fcfs').map((p) => p.label)).toEqual([
      'round_robin',
      'round_robin/fcfs',
    ]);
  });
});

describe('goodput rate', () => {
  it('is the highest rate with attainment ≥ 0.9, null when there is none', () => {
    expect(
      goodputRate([
        { rate: 1, attainment: 1 },
        { rate: 2, attainment: 0.95 },
        { rate: 4, attainment: 0.85 },
        { rate: 8, attainment: null },
      ]),
    ).toBe(2);
    expect(
      goodputRate([
        { rate: 4, attainment: 0.9 },
        { rate: 2, attainment: 0.99 },
      ]),
    ).toBe(4); // 0.9 itself meets it; order of the points does not matter
    expect(
      goodputRate([
        { rate: 1, attainment: 0.5 },
        { rate: 2, attainment: 0.899 },
      ]),
    ).toBeNull();
    expect(goodputRate([{ rate: 3, attainment: null }])).toBeNull();
    expect(goodputRate([])).toBeNull();
    expect(goodputRate([{ rate: Number.POSITIVE_INFINITY, attainment: 0.95 }])).toBe(
      Number.POSITIVE_INFINITY,
    );
  });
});

function rec(i: number, status: number | null, backend?: string, ttft = 0.1, outputLen = 11): RequestRecord {
  const success = status === 200;
  return {
    index: i,
    requestId: `r${i}`,
    startTime: i * 0.1,
    queueTime: 0,
    ttft: success ? ttft : 0,
    itl: success ? new Array(outputLen - 1).fill(0.01) : [],
    latency: success ? ttft + (outputLen - 1) * 0.01 : 0,
    promptLen: 10,
    outputLen: success ? outputLen : 0,
    success,
    error: success ? '' : `HTTP ${status}`,
    status,
    headers: backend === undefined ? {} : { 'x-slagate-backend': backend },
  };
}

describe('run figures', () => {
  it('splits ok / refused / failed and measures backend balance against an even split', () => {
    // 6 ok (4 on r0, 2 on r1; one of r0's misses the 500 ms TTFT), 2 refused (429), one 503,
    // one network error: 10 sent.
    const records = [
      rec(0, 200, 'r0'),
      rec(1, 200, 'r0'),
      rec(2, 200, 'r0'),
      rec(3, 200, 'r0', 0.8),
      rec(4, 200, 'r1'),
      rec(5, 200, 'r1'),
      rec(6, 429),
      rec(7, 429),
      rec(8, 503, 'r1'),
      rec(9, null),
    ];
    const metrics = computeMetrics(records, 2, { percentiles: [99], slo: SLO });
    const f = runFigures(records, metrics, 2, SLO, 0.25);
    expect([f.requests, f.ok, f.refused, f.failed]).toEqual([10, 6, 2, 2]);
    expect(f.refusedShare).toBeCloseTo(0.2, 12);
    expect(f.failedShare).toBeCloseTo(0.2, 12);
    expect(f.attainment).toBeCloseTo(5 / 10, 12); // misses include refused and failed
    expect(f.goodput).toBeCloseTo(5 / 2, 12);
    expect(f.backendRequests).toEqual({ r0: 4, r1: 2 }); // successful requests only
    expect(f.maxBackendShare).toBeCloseTo((4 / 6) * 2, 12);
    expect(f.prefixHitRate).toBe(0.25);
    expect(f.ttftP50Ms).toBeCloseTo(100, 9);
    expect(f.tpotP99Ms).toBeCloseTo(10, 9);
    // The same P99s when the run's own percentiles leave 99 out (`--percentiles 50,90`).
    const without = runFigures(
      records,
      computeMetrics(records, 2, { percentiles: [50, 90], slo: SLO }),
      2,
      SLO,
      0.25,
    );
    expect(without.ttftP99Ms).toBeCloseTo(f.ttftP99Ms!, 9);
    expect(without.tpotP99Ms).toBeCloseTo(f.tpotP99Ms!, 9);
  });

  it('counts a backend named like a method of every object (toString) as any other', () => {
    const records = [rec(0, 200, 'toString'), rec(1, 200, 'toString'), rec(2, 200, 'constructor')];
    const f = runFigures(records, computeMetrics(records, 1, { percentiles: [99] }), 2, undefined, null);
    expect({ ...f.backendRequests }).toEqual({ toString: 2, constructor: 1 });
    expect(f.maxBackendShare).toBeCloseTo((2 / 3) * 2, 12);
  });

  it('leaves what was not measured null, never 0', () => {
    const records = [rec(0, 429), rec(1, 500)];
    const f = runFigures(records, computeMetrics(records, 1, { percentiles: [99] }), 4, undefined, null);
    expect([f.ok, f.refused, f.failed]).toEqual([0, 1, 1]);
    for (const k of ['goodput', 'attainment', 'ttftP50Ms', 'ttftP99Ms', 'tpotP99Ms'] as const) {
      expect(f[k]).toBeNull();
    }
    expect(f.maxBackendShare).toBeNull();
    expect(f.prefixHitRate).toBeNull();
    // One-token outputs have no TPOT.
    const single = [rec(0, 200, 'r0', 0.1, 1)];
    expect(
      runFigures(single, computeMetrics(single, 1, { percentiles: [99] }), 1, SLO, 0).tpotP99Ms,
    ).toBeNull();
  });

  it('sums a counter over its series and takes the hit rate as a delta', () => {
    const text = [
      '# HELP vllm:prefix_cache_hits Prefix cache hits.',
      '# TYPE vllm:prefix_cache_hits counter',
      'vllm:prefix_cache_hits_total{model_name="m",engine="0"} 48.0',
      'vllm:prefix_cache_hits_created{model_name="m",engine="0"} 1.7e+09',
      'vllm:prefix_cache_hits_total{model_name="m",engine="1"} 16.0',
      'vllm:prefix_cache_queries_total{model_name="m",engine="0"} 256.0',
    ].join('\n');
    expect(sumCounter(text, 'vllm:prefix_cache_hits_total')).toBe(64);
    expect(sumCounter(text, 'vllm:prefix_cache_queries_total')).toBe(256);
    expect(sumCounter(text, 'vllm:absent_total')).toBe(0);
    expect(prefixHitRate({ hits: 10, queries: 100 }, { hits: 74, queries: 356 })).toBeCloseTo(64 / 256, 12);
    expect(prefixHitRate({ hits: 5, queries: 50 }, { hits: 5, queries: 50 })).toBeNull();
    // A replica restarted meanwhile: what it counted before is gone from the change.
    const starts = [1_700_000_000, 1_700_000_000];
    expect(
      prefixHitRate(
        { hits: 10, queries: 100, starts },
        { hits: 74, queries: 356, starts: [1_700_000_000, 1_700_000_090] },
      ),
    ).toBeNull();
    expect(prefixHitRate({ hits: 10, queries: 100, starts }, { hits: 74, queries: 356, starts })).toBeCloseTo(
      64 / 256,
      12,
    );
    expect(prefixHitRate({ hits: 500, queries: 900 }, { hits: 74, queries: 356 })).toBeNull();
  });

  it("reads each replica's start time with its counters: a replica crashed during the run makes the hit rate unmeasured", async () => {
    const replica = await SimReplica.start({ profile: getProfile('llama3-8b-h100'), timeScale: 0.05 });
    try {
      const before = await readPrefixCounters([replica.url]);
      expect(before.starts).toEqual([expect.any(Number)]);
      expect(prefixHitRate(before, await readPrefixCounters([replica.url]))).toBeNull(); // nothing queried
      // A crash is a new process: a later start time, the counters from 0.
      // The start time is the wall clock's, in ms: the crash comes in a later one.
      const t = Date.now();
      while (Date.now() <= t) await new Promise((r) => setImmediate(r));
      await replica.fault({ mode: 'crash' });
      await replica.reset();
      const after = await readPrefixCounters([replica.url]);
      expect(after.starts![0]).toBeGreaterThan(before.starts![0]!);
      expect(
        prefixHitRate(before, { ...after, hits: before.hits + 1, queries: before.queries + 2 }),
      ).toBeNull();
    } finally {
      await replica.close();
    }
  });

  it('a replica down when the run ends makes the hit rate unmeasured, not the run failed', async () => {
    const replica = await SimReplica.start({ profile: getProfile('llama3-8b-h100'), timeScale: 0.05 });
    try {
      const before = await readPrefixCounters([replica.url]);
      await replica.fault({ mode: 'refuse' });
      await expect(readPrefixCounters([replica.url])).rejects.toThrow();
      expect(await prefixHitAfter(before, [replica.url])).toBeNull();
    } finally {
      await replica.close();
    }
  });
});

describe('gateway config', () => {
  it('merges the user YAML under the run-owned keys', () => {
    const user = {
      server: { port: 9999, host: '0.0.0.0' },
      models: ['other'],
      backends: [{ name: 'x', url: 'http://10.0.0.1:8000' }],
      simulate: { replicas: 8 },
      router: { policy: 'cache_aware', explore_ratio: 0 },
      scheduler: { policy: 'fcfs', max_queue: 7 },
      logging: { level: 'debug', admission_log: 'stdout' },
      upstream: { retries: 0 },
      state: { store: 'redis', redis_url: 'redis://redis:6379', key_prefix: 'prod' },
      tenants: [{ name: 't', api_key_sha256: 'a'.repeat(64) }],
    };
    const item = { label: 'round_robin', router: 'round_robin', scheduler: 'slagate' };
    const c = gatewayConfig(user, { dir: '/tmp/d', model: 'm', urls: ['http://a', 'http://b'], item });
    expect(c.server).toEqual({ host: '127.0.0.1', port: 0 });
    expect(c.models).toEqual(['m']);
    expect(c.backends).toEqual([
      { name: 'r0', url: 'http://a' },
      { name: 'r1', url: 'http://b' },
    ]);
    expect(c.simulate).toBeUndefined();
    expect(c.router).toEqual({ policy: 'round_robin', explore_ratio: 0 });
    expect(c.scheduler).toEqual({ policy: 'slagate', max_queue: 7 });
    expect(c.logging).toEqual({ level: 'debug', admission_log: '/tmp/d/admission.log' });
    expect(c.upstream).toEqual({ retries: 0 });
    // A production file's shared store and API keys are not the run's.
    expect(c.state).toEqual({ store: 'memory' });
    expect(c.tenants).toBeUndefined();
  });
});

/** Requests meeting both targets, recomputed from the records alone. */
function good(records: readonly RequestRecord[]): number {
  return records.filter((r) => {
    if (!r.success || r.ttft * 1000 > SLO.ttft) return false;
    const tpot = r.outputLen > 1 ? (r.latency - r.ttft) / (r.outputLen - 1) : 0;
    return tpot * 1000 <= SLO.tpot;
  }).length;
}

describe('runCompare on real processes', () => {
  let result: CompareResult;
  let dir = '';
  const progress: string[] = [];
  afterAll(async () => {
    if (dir !== '') await rm(dir, { recursive: true, force: true });
  });
  beforeAll(async () => {
    // A patient class: this is about the tool's accounting. With the 500 ms default, a loaded
    // machine's event-loop delay (admission takes it out of every budget) refused requests.
    dir = await mkdtemp(join(tmpdir(), 'slagate-compare-'));
    const gatewayYaml = join(dir, 'gateway.yaml');
    await writeFile(
      gatewayYaml,
      'sla:\n  default_class: interactive\n  classes:\n    interactive: { ttft_p99_ms: 60000, tpot_p99_ms: 1000, priority: 0 }\n',
    );
    result = await runCompare({
      policies: ['round_robin', 'least_loaded/fcfs'],
      replicas: 2,
      timeScale: 0.05,
      requests: 24,
      rates: [40],
      seed: 3,
      slo: SLO,
      gatewayYaml,
      onProgress: (line) => progress.push(line),
    });
  }, 120_000); // four child processes start in turn; under a full parallel suite that is slow

  it('runs each policy once, labelled as written, and accounts for every request', () => {
    expect(result.ok).toBe(true);
    expect(result.runs.map((r) => [r.policy, r.router, r.scheduler, r.rate])).toEqual([
      ['round_robin', 'round_robin', 'slagate', 40],
      ['least_loaded/fcfs', 'least_loaded', 'fcfs', 40],
    ]);
    expect(progress.filter((l) => l.startsWith('[1/2]'))).toHaveLength(2);
    for (const run of result.runs) {
      const f = run.figures!;
      expect(run.error).toBeNull();
      expect(run.bench!.records).toHaveLength(24);
      expect(f.requests).toBe(24);
      expect(f.ok + f.refused + f.failed).toBe(f.requests);
      expect(f.ok).toBe(run.bench!.records.filter((r) => r.success).length);
    }
  });

  it('reports attainment, prefix hit rate and backend balance consistent with the records', () => {
    for (const run of result.runs) {
      const f = run.figures!;
      expect(f.attainment).toBeGreaterThanOrEqual(0);
      expect(f.attainment).toBeLessThanOrEqual(1);
      expect(f.attainment).toBeCloseTo(good(run.bench!.records) / 24, 12);
      expect(f.goodput).toBeCloseTo(good(run.bench!.records) / run.bench!.info.durationS, 9);
      // The replicas' prefix-cache counters were read: every request queried the cache.
      expect(f.prefixHitRate).not.toBeNull();
      // sharegpt prompts are distinct: little or nothing is shared.
      expect(f.prefixHitRate).toBeGreaterThanOrEqual(0);
      expect(f.prefixHitRate).toBeLessThan(0.5);
      expect(f.maxBackendShare).toBeGreaterThanOrEqual(1);
      expect(Object.keys(f.backendRequests).sort()).toEqual(['r0', 'r1']);
      expect(f.ttftP50Ms).toBeGreaterThan(0);
      expect(f.ttftP99Ms).toBeGreaterThanOrEqual(f.ttftP50Ms!);
    }
    // The split is the records' own: each successful request counted where its response says it
    // was served. (Not 12/12 for round robin: under the slagate scheduler it skips a backend that
    // has no prefill room at that moment, which a loaded machine makes a matter of timing.)
    for (const run of result.runs) {
      const f = run.figures!;
      const served: Record<string, number> = {};
      for (const r of run.bench!.records) {
        const b = r.headers['x-slagate-backend'];
        if (r.success && b !== undefined) served[b] = (served[b] ?? 0) + 1;
      }
      expect(f.backendRequests).toEqual(served);
      expect(f.maxBackendShare).toBeCloseTo(Math.max(...Object.values(served)) / (f.ok / 2), 12);
    }
    const rr = result.runs[0]!.figures!;
    // On a failure, what the requests that did not succeed were told.
    const failures = result.runs[0]!.bench!.records.filter((x) => !x.success).map((x) => [x.status, x.error]);
    expect(rr.ok, JSON.stringify(failures)).toBe(24);
    expect(Math.min(rr.backendRequests.r0!, rr.backendRequests.r1!)).toBeGreaterThanOrEqual(6);
  });

  it("keeps each run's admission log, one line per request, agreeing with the response headers", () => {
    for (const run of result.runs) {
      const log = run.admissionLog!;
      expect(log).toHaveLength(24);
      const ids = new Set(run.bench!.records.map((r) => r.requestId));
      expect(log.every((l) => ids.has(l.req_id as string))).toBe(true);
      const byBackend: Record<string, number> = {};
      for (const l of log) {
        if (l.outcome === 'ok') byBackend[l.backend as string] = (byBackend[l.backend as string] ?? 0) + 1;
      }
      expect(byBackend).toEqual(run.figures!.backendRequests);
    }
    expect(JSON.stringify(result.json)).not.toContain('admissionLog');
  });

  /**
   * Round robin over 2 replicas for a 3 s load, the reload asked for 0.6 s in: the run, and how
   * many requests sent in [from, to) seconds each backend served.
   */
  async function reloaded(reconfigure: { from: number[]; to: number[] }, seed: number) {
    const r = await runCompare({
      policies: ['round_robin/fcfs'],
      replicas: 2,
      timeScale: 0.05,
      requests: 60,
      rates: [20],
      seed,
      slo: SLO,
      reconfigure: { ...reconfigure, afterMs: 600 },
    });
    const run = r.runs[0]!;
    expect(run.error).toBeNull();
    expect(run.reconfigured).toBe(true);
    const served = run.bench!.records.filter((x) => x.success);
    // Nothing failed, across the reload.
    expect(served).toHaveLength(60);
    return (b: string, from: number, to: number) =>
      served.filter((x) => x.headers['x-slagate-backend'] === b && x.startTime >= from && x.startTime < to)
        .length;
  }

  it('starts the gateway without a late replica and adds it by a config reload during the load', async () => {
    const on = await reloaded({ from: [0], to: [0, 1] }, 4);
    // What was sent before the reload can only have gone to r0 (r1 is not in the config).
    expect(on('r1', 0, 0.6)).toBe(0);
    expect(on('r0', 0, 0.6)).toBeGreaterThan(0);
    // A second after it was asked for, it has long been applied: r1 serves its turns.
    expect(on('r1', 1.6, 10)).toBeGreaterThan(0);
  }, 120_000);

  it('takes a replica out by a config reload during the load: nothing new goes to it, nothing fails', async () => {
    const on = await reloaded({ from: [0, 1], to: [0] }, 5);
    expect(on('r1', 0, 0.6)).toBeGreaterThan(0);
    expect(on('r1', 1.6, 10)).toBe(0);
    expect(on('r0', 1.6, 10)).toBeGreaterThan(0);
  }, 120_000);

  it('reports a gateway that would not start as that run’s error, with no figures', async () => {
    const yamlPath = join(dir, 'bad.yaml');
    await writeFile(yamlPath, 'upstream: { retries: -1 }\n');
    const r = await runCompare({
      policies: ['round_robin'],
      replicas: 1,
      timeScale: 0.05,
      requests: 4,
      rates: [10],
      gatewayYaml: yamlPath,
    });
    expect(r.ok).toBe(false);
    expect(r.runs).toHaveLength(1);
    expect(r.runs[0]!.error).toMatch(/gateway did not start: .*retries/s);
    expect(r.runs[0]!.figures).toBeNull();
    const run = (r.json.runs as Record<string, unknown>[])[0]!;
    expect(run.ok).toBeNull();
    expect(run.attainment).toBeNull();
    expect(r.table).toMatch(/round_robin\s+10\s+error\s+–/);
  }, 120_000);
});

const cli = (args: string[]) => runSlagate(['bench', 'compare', ...args]);

describe('slagate bench compare', () => {
  it('refuses an output it could not write before it starts anything', async () => {
    const file = join(dir, 'plain-file');
    await writeFile(file, '');
    const r = await cli(['--policies', 'round_robin', ...SMALL_SWEEP, '--report', join(file, 'r.html')]);
    expect(r.code).toBe(2);
    expect(r.err).toContain(`--report ${join(file, 'r.html')}: cannot be written (ENOTDIR)`);
    expect(r.err).not.toContain('[1/2]');
  });

  it('prints only the table on stdout and saves the JSON of a sweep', async () => {
    const file = join(dir, 'compare.json');
    const r = await cli(['--policies', 'round_robin', ...SMALL_SWEEP, '--save-result', file]);
    expect(r.code, r.err).toBe(0);
    // Piped, it stays quiet: no progress lines on stderr (a terminal gets one as each run starts and ends).
    expect(r.err).not.toContain('[1/2]');
    expect(r.err).not.toContain('round_robin at 20 req/s');
    const lines = r.out.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^policy\s+rate\s+ok\/sent\s+goodput\/s\s+attain\s+P50 TTFT ms/);
    expect(lines[1]).toMatch(/^round_robin\s+20\s+\d+\/12\s/);
    expect(lines[2]).toMatch(/^round_robin\s+40\s+\d+\/12\s/);
    expect(lines.slice(3).join('\n')).toMatch(/goodput rate/);
    const json = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    expect(Object.keys(json)).toEqual([
      'date',
      'workload',
      'seed',
      'requests',
      'durationS',
      'rates',
      'burstiness',
      'slo',
      'fleet',
      'runs',
      'goodputRate',
    ]);
    expect(json).toMatchObject({
      workload: 'sharegpt',
      seed: 0,
      requests: 12,
      durationS: null,
      rates: [20, 40],
      burstiness: 1,
      slo: { ttft: 500, tpot: 50 },
      fleet: {
        replicas: 2,
        profile: 'llama3-8b-h100',
        groups: [{ profile: 'llama3-8b-h100', replicas: 2 }],
        timeScale: 0.05,
      },
    });
    const runs = json.runs as Record<string, unknown>[];
    expect(runs).toHaveLength(2);
    for (const run of runs) {
      for (const k of [
        'policy',
        'router',
        'scheduler',
        'rate',
        'requests',
        'ok',
        'goodput',
        'attainment',
        'ttftP50Ms',
        'ttftP99Ms',
        'tpotP99Ms',
        'refusedShare',
        'failedShare',
        'prefixHitRate',
        'maxBackendShare',
        'bench',
      ]) {
        expect(run, k).toHaveProperty(k);
      }
      expect((run.bench as Record<string, unknown>).num_prompts).toBe(12);
    }
    // The goodput rate follows from the runs' attainment.
    const passing = runs.filter((x) => (x.attainment as number) >= 0.9).map((x) => x.rate as number);
    expect((json.goodputRate as Record<string, unknown>).round_robin).toBe(
      passing.length > 0 ? Math.max(...passing) : null,
    );
  }, 120_000);

  it('runs on a mixed fleet: each group its own profile, the backends named in the order given', async () => {
    const file = join(dir, 'mixed.json');
    const r = await cli([
      '--policies',
      'round_robin',
      '--fleet',
      'llama3-8b-h100:1,llama3-8b-a100:2',
      '--time-scale',
      '0.05',
      '--requests',
      '9',
      '--rate',
      '30',
      '--save-result',
      file,
    ]);
    expect(r.code, r.err).toBe(0);
    const json = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    expect(json.fleet).toEqual({
      replicas: 3,
      profile: null,
      groups: [
        { profile: 'llama3-8b-h100', replicas: 1 },
        { profile: 'llama3-8b-a100', replicas: 2 },
      ],
      timeScale: 0.05,
    });
    // Every replica of both groups is behind the gateway.
    const run = (json.runs as Record<string, unknown>[])[0]!;
    expect(Object.keys(run.backendRequests as object).sort()).toEqual(['r0', 'r1', 'r2']);
  }, 120_000);

  it('refuses a fleet beside --replicas, a malformed group, and profiles of two models', async () => {
    const both = await cli(['--policies', 'round_robin', '--fleet', 'llama3-8b-h100:2', '--replicas', '2']);
    expect(both.code).toBe(2);
    expect(both.err).toContain('give --fleet, or --replicas and --profile, not both');
    const bad = await cli(['--policies', 'round_robin', '--fleet', 'llama3-8b-h100:0']);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain('--fleet: replicas must be ≥ 1, got "llama3-8b-h100:0"');
    const models = await cli([
      '--policies',
      'round_robin',
      '--fleet',
      'llama3-8b-h100:1,llama3-70b-h100-tp4:1',
    ]);
    expect(models.code).toBe(2);
    expect(models.err).toContain('--fleet: every profile must serve one model');
    await expect(
      runCompare({
        policies: ['round_robin'],
        fleet: [{ profile: 'llama3-8b-h100', replicas: 1 }],
        replicas: 1,
      }),
    ).rejects.toThrow('give a fleet, or replicas and a profile, not both');
  });

  it('exits 2 with a one-line error and a pointer to --help on a bad policy item', async () => {
    const r = await cli(['--policies', 'round_robin,bogus/fcfs', '--requests', '4']);
    expect(r.code).toBe(2);
    expect(r.out).toBe('');
    expect(r.err.trimEnd().split('\n')).toEqual([
      expect.stringMatching(/^slagate bench compare: --policies: unknown router "bogus"/),
      'see: slagate bench compare --help',
    ]);
  });
});

describe('startChildFleets', () => {
  it("starts one fleet per group, each replica on its group's profile, and stops them all", async () => {
    const fleet = await startChildFleets(
      [
        { profile: 'llama3-8b-h100', replicas: 1 },
        { profile: 'llama3-8b-a100', replicas: 1 },
      ],
      { timeScale: 0.05 },
    );
    try {
      expect(fleet.urls).toHaveLength(2);
      // The replica's KV size is its profile's (docs/simulator.md): H100 80 GB, A100 40 GB.
      const blocks: string[] = [];
      for (const url of fleet.urls) {
        const res = await request(`${url}/metrics`);
        const text = await res.body.text();
        blocks.push(/num_gpu_blocks="(\d+)"/.exec(text)?.[1] ?? 'none');
      }
      expect(blocks).toEqual(['27000', '9000']);
    } finally {
      await fleet.stop();
    }
    // Stopped: nothing answers on either port.
    for (const url of fleet.urls) await expect(request(`${url}/health`)).rejects.toThrow();
  }, 60_000);

  it('stops the groups already started when a later one fails', async () => {
    await expect(
      startChildFleets([
        { profile: 'llama3-8b-h100', replicas: 1 },
        { profile: 'no-such-gpu', replicas: 1 },
      ]),
    ).rejects.toThrow(/no-such-gpu/);
    // The first group's `slagate sim` is no longer among this process's children.
    const children = execFileSync('ps', ['-o', 'args=', '--ppid', String(process.pid)], { encoding: 'utf8' });
    expect(children).not.toMatch(/slagate\.js sim/);
  }, 60_000);
});
