// runBench and the CLI end to end against a scripted local server.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { createProgress } from '../../src/bench/progress.ts';
import { monotonicMs, runBench } from '../../src/bench/run.ts';
import { benchCommand, parseBenchArgs } from '../../src/cli/bench.ts';
import { answer, type FakeServer, type Seen, startServer } from './fake-server.ts';

let server: FakeServer;
let failing: FakeServer;
let dir: string;

beforeAll(async () => {
  server = await startServer(async (seen, res) => {
    if (seen.method === 'GET' && seen.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"object":"list","data":[{"id":"sim-model","object":"model","root":"sim-model"}]}');
      return;
    }
    const body = seen.body as { max_completion_tokens?: number; max_tokens?: number };
    const asked = body.max_completion_tokens ?? body.max_tokens ?? 1;
    await answer(seen, res, Math.min(asked, 4), 8);
  });
  failing = await startServer(async (_seen, res) => {
    res.writeHead(500, { 'content-type': 'application/json' });
    res.end('{"error":{"message":"nope","type":"internal_error","param":null,"code":500}}');
  });
  dir = await mkdtemp(join(tmpdir(), 'slagate-bench-'));
});

afterAll(async () => {
  await server.close();
  await failing.close();
  await rm(dir, { recursive: true, force: true });
});

afterEach(() => {
  vi.restoreAllMocks();
});

const posts = (from: number) => server.seen.slice(from).filter((s: Seen) => s.method === 'POST');

describe('runBench', () => {
  it('caps requests in flight, asks /v1/models for the model, reports every request', async () => {
    const from = server.seen.length;
    const r = await runBench({ target: server.url, requests: 12, concurrency: 3, seed: 1, progress: false });
    const sent = posts(from);
    expect(sent).toHaveLength(12);
    expect(sent.every((s) => s.body?.model === 'sim-model')).toBe(true);
    expect(Math.max(...sent.map((s) => s.inflight))).toBeLessThanOrEqual(3);
    expect(r.metrics.completed).toBe(12);
    expect(r.metrics.maxConcurrentRequests).toBeLessThanOrEqual(3);
    expect(r.metrics.maxConcurrentRequests).toBeGreaterThanOrEqual(2);
    // Requests beyond the first three waited for a slot.
    expect(r.records.filter((x) => x.queueTime > 0).length).toBeGreaterThan(0);
    expect(r.records.every((x) => x.headers['x-slagate-backend'] === 'sim-0')).toBe(true);
    expect(r.json.model_id).toBe('sim-model');
    expect(r.json.max_concurrency).toBe(3);
    expect(r.json.num_prompts).toBe(12);
    expect(r.table).toContain('Maximum request concurrency:             3         ');
  });

  it('sends on the seeded schedule: the last request leaves at N / rate', async () => {
    const r = await runBench({
      target: server.url,
      model: 'm',
      requests: 8,
      rate: 40,
      seed: 2,
      progress: false,
    });
    const starts = r.records.map((x) => x.startTime);
    expect(Math.max(...starts)).toBeGreaterThanOrEqual(8 / 40 - 0.002);
    expect(Math.max(...starts)).toBeLessThan(8 / 40 + 1);
    expect(r.json.request_rate).toBe(40);
  });

  it("gives its clock's zero on the monotonic clock: each send it records precedes the server's sight of it", async () => {
    const from = server.seen.length;
    const before = monotonicMs();
    const r = await runBench({
      target: server.url,
      model: 'm',
      requests: 6,
      rate: 60,
      seed: 3,
      progress: false,
    });
    const after = monotonicMs();
    expect(r.clockZeroMonotonicMs).toBeGreaterThanOrEqual(before);
    expect(r.clockZeroMonotonicMs).toBeLessThanOrEqual(after);
    const arrived = new Map(posts(from).map((s) => [s.headers['x-request-id'], s.monotonicMs]));
    expect(arrived.size).toBe(6);
    for (const rec of r.records) {
      const sent = r.clockZeroMonotonicMs + rec.startTime * 1000;
      const seen = arrived.get(rec.requestId)!;
      // The client's send and the server's arrival, on one clock: the send comes first.
      expect(seen).toBeGreaterThanOrEqual(sent);
      expect(seen).toBeLessThanOrEqual(after);
    }
  });

  /** How many requests a run of `rate` for `durationS` (the code workload, seed `seed`) sends. */
  const sentWith = async (rate: number, durationS: number, seed: number) =>
    (
      await runBench({
        target: server.url,
        model: 'm',
        rate,
        durationS,
        workload: 'code',
        seed,
        progress: false,
      })
    ).records.length;

  it('a rate and a duration send every scheduled request, the last one (at the duration) included', async () => {
    // Whether a timer fires a little early or late must not decide it: several runs, all whole.
    const sent: number[] = [];
    for (let run = 0; run < 8; run++) sent.push(await sentWith(100, 0.05, run));
    expect(sent).toEqual(Array(8).fill(5));
  });

  it('a rate and a duration whose product is no whole number send ceil(rate × S) requests, whatever the seed', async () => {
    const sent: number[] = [];
    // 150 × 0.07 = 10.5: 11 requests, the last at 0.07 s. And 70 × 0.1 is 7.000000000000001: 7.
    for (let run = 0; run < 6; run++) {
      sent.push(run % 2 === 0 ? await sentWith(150, 0.07, run) : await sentWith(70, 0.1, run));
    }
    expect(sent).toEqual([11, 7, 11, 7, 11, 7]);
  });

  it('a rate and a duration under a concurrency cap count the scheduled requests the cap held past the duration', async () => {
    // 20 due by 0.1 s; one at a time, each some 30 ms long: most are still waiting at the duration.
    const r = await runBench({
      target: server.url,
      model: 'm',
      rate: 200,
      durationS: 0.1,
      concurrency: 1,
      workload: 'code',
      seed: 1,
      progress: false,
    });
    expect(r.info.notSent).toBeGreaterThan(0);
    expect(r.records.length + r.info.notSent!).toBe(20);
    expect(r.json.not_sent).toBe(r.info.notSent);
    expect(r.table).toContain('Not sent (cap held past duration):');
  });

  it('a duration bounds an open-ended run under a concurrency cap', async () => {
    const r = await runBench({
      target: server.url,
      model: 'm',
      durationS: 0.3,
      concurrency: 2,
      workload: 'code',
      progress: false,
    });
    expect(r.records.length).toBeGreaterThanOrEqual(2);
    for (const x of r.records) expect(x.startTime).toBeLessThanOrEqual(0.35);
    expect(r.info.durationS).toBeGreaterThanOrEqual(0.3);
  });

  it('goodput and SLO attainment when every request meets a loose target', async () => {
    const r = await runBench({
      target: server.url,
      model: 'm',
      requests: 6,
      slo: { ttft: 60_000, tpot: 60_000 },
      progress: false,
    });
    expect(r.metrics.goodCompleted).toBe(6);
    expect(r.json.slo_attainment).toBe(1);
    expect(r.metrics.requestGoodput).toBeCloseTo(6 / r.info.durationS, 9);
  });

  it('stops sending on abort and still reports', async () => {
    const abort = new AbortController();
    const from = server.seen.length;
    // Abort once three requests have reached the server (of 200 spread over 10 s).
    const poll = setInterval(() => {
      if (posts(from).length >= 3) abort.abort();
    }, 5);
    const r = await runBench({
      target: server.url,
      model: 'm',
      requests: 200,
      rate: 20,
      signal: abort.signal,
      progress: false,
    });
    clearInterval(poll);
    expect(r.records.length).toBeGreaterThanOrEqual(3);
    expect(r.records.length).toBeLessThan(200);
  });

  it('rejects impossible options before sending anything', async () => {
    const from = server.seen.length;
    await expect(runBench({ target: server.url, model: 'm', rate: 0 })).rejects.toThrow(/rate/);
    await expect(runBench({ target: server.url, model: 'm', durationS: 1 })).rejects.toThrow(/duration/);
    // A duration without end would schedule without end (a send loop that never yields).
    await expect(
      runBench({ target: server.url, model: 'm', rate: 5, durationS: Number.POSITIVE_INFINITY }),
    ).rejects.toThrow(/duration must be a finite number/);
    await expect(
      runBench({ target: server.url, model: 'm', requests: 2, timeoutMs: Number.POSITIVE_INFINITY }),
    ).rejects.toThrow(/timeout must be a finite number/);
    await expect(runBench({ target: server.url, model: 'm', requests: 2, timeoutMs: -1000 })).rejects.toThrow(
      /timeout must be a positive number/,
    );
    expect(server.seen.length).toBe(from);
  });

  it('counts no queue time without a concurrency cap, and only the wait for a slot with one', async () => {
    const open = await runBench({ target: server.url, model: 'm', requests: 30, seed: 2, progress: false });
    expect(open.records).toHaveLength(30);
    expect(open.records.every((x) => x.queueTime === 0)).toBe(true);
    // Under a cap of 1, the first request finds the slot free; every later one waits for it.
    const capped = await runBench({
      target: server.url,
      model: 'm',
      requests: 4,
      concurrency: 1,
      seed: 2,
      progress: false,
    });
    const byIndex = [...capped.records].sort((a, b) => a.index - b.index);
    expect(byIndex[0]!.queueTime).toBe(0);
    expect(byIndex.slice(1).every((x) => x.queueTime > 0)).toBe(true);
    // All four arrived at once: the k-th waited, from the run's start, until the one before it had
    // been sent and had finished (its last token at least), one at a time.
    for (let k = 1; k < byIndex.length; k++) {
      const before = byIndex[k - 1]!;
      expect(byIndex[k]!.queueTime).toBeGreaterThanOrEqual(before.startTime + before.latency);
    }
  });

  it('saves an even arrival spacing (burstiness inf) as "inf", as it does an unlimited rate', async () => {
    const r = await runBench({
      target: server.url,
      model: 'm',
      requests: 3,
      rate: 200,
      burstiness: Number.POSITIVE_INFINITY,
      progress: false,
    });
    expect(r.json.burstiness).toBe('inf');
    expect(JSON.parse(JSON.stringify(r.json)).burstiness).toBe('inf');
  });
});

describe('slagate bench (CLI)', () => {
  function capture() {
    let out = '';
    let err = '';
    vi.spyOn(process.stdout, 'write').mockImplementation((s) => {
      out += String(s);
      return true;
    });
    vi.spyOn(process.stderr, 'write').mockImplementation((s) => {
      err += String(s);
      return true;
    });
    return { out: () => out, err: () => err };
  }

  it('runs, prints the table with goodput, saves JSON with the asked percentiles and headers', async () => {
    const file = join(dir, 'result.json');
    const from = server.seen.length;
    const io = capture();
    const code = await benchCommand([
      '--target',
      server.url,
      '--requests',
      '5',
      '--workload',
      'prefix-shared',
      '--slo',
      'ttft=60000,tpot=60000',
      '--percentiles',
      '50,99',
      '--header',
      'Authorization: Bearer k1',
      '--class-hints',
      '--save-result',
      file,
    ]);
    vi.restoreAllMocks();
    expect(code).toBe(0);
    expect(io.out()).toContain('Traffic request rate: inf\nBurstiness factor: 1.0 (Poisson process)\n');
    expect(io.out()).toContain('============ Serving Benchmark Result ============');
    expect(io.out()).toContain('Request goodput (req/s):');
    expect(io.out()).toContain('P50 TTFT (ms):');
    const json = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    expect(json.completed).toBe(5);
    expect(json).toHaveProperty('p50_ttft_ms');
    expect(json).toHaveProperty('p99_e2el_ms');
    expect(json.workload).toBe('prefix-shared');
    const sent = posts(from);
    expect(sent.every((s) => s.headers.authorization === 'Bearer k1')).toBe(true);
    expect(sent.every((s) => s.headers['x-slagate-class'] === 'interactive')).toBe(true);
    expect(sent.every((s) => typeof s.headers['x-session-id'] === 'string')).toBe(true);
  });

  it('exit 2 on bad flags, 1 when nothing succeeds or the target is down', async () => {
    const io = capture();
    expect(await benchCommand(['--target', server.url, '--bogus'])).toBe(2);
    expect(await benchCommand(['--requests', '3'])).toBe(2);
    expect(await benchCommand(['--target', server.url, '--rate', '0'])).toBe(2);
    expect(await benchCommand(['--target', server.url, '--slo', 'latency=5'])).toBe(2);
    expect(await benchCommand(['--target', server.url, '--workload', 'nope'])).toBe(2);
    expect(await benchCommand(['--target', server.url, '--rate', '5', '--duration', 'inf'])).toBe(2);
    expect(await benchCommand(['--target', server.url, '--timeout', '-1'])).toBe(2);
    expect(await benchCommand(['--target', server.url, '--timeout', 'inf'])).toBe(2);
    // An output that cannot be written is refused before the run, not after it.
    const notADir = join(dir, 'a-file');
    await writeFile(notADir, '');
    const sentBefore = server.seen.length;
    for (const flag of ['--save-result', '--report']) {
      expect(
        await benchCommand(['--target', server.url, '--requests', '2', flag, join(notADir, 'out')]),
      ).toBe(2);
      expect(io.err()).toContain(`${flag} ${join(notADir, 'out')}: cannot be written (ENOTDIR)`);
    }
    expect(server.seen.length).toBe(sentBefore);
    expect(await benchCommand(['--target', failing.url, '--model', 'm', '--requests', '2'])).toBe(1);
    expect(io.err()).toContain('Error 0: HTTP 500: nope');
    const down = await startServer(async () => {});
    await down.close();
    expect(await benchCommand(['--target', down.url, '--requests', '2'])).toBe(1);
    expect(io.err()).toMatch(/cannot reach/);
  });

  it('parses every flag', () => {
    const parsed = parseBenchArgs([
      '--target',
      'http://127.0.0.1:1',
      '--endpoint',
      'completions',
      '--model',
      'x',
      '--workload',
      'mixed',
      '--requests',
      '10',
      '--duration',
      '5',
      '--rate',
      '2.5',
      '--burstiness',
      '0.5',
      '--concurrency',
      '4',
      '--seed',
      '9',
      '--slo',
      'ttft:500,tpot=50,e2el=9000',
      '--percentiles',
      '90,99.9',
      '--percentile-metrics',
      'ttft,itl',
      '--header',
      'x-slagate-class: batch',
      '--no-session-id',
      '--label',
      'L',
      '--save-detailed',
      '--timeout',
      '30',
      '--save-result',
      'out.json',
    ]);
    expect(parsed).toEqual({
      saveResult: 'out.json',
      options: {
        target: 'http://127.0.0.1:1',
        endpoint: 'completions',
        model: 'x',
        workload: 'mixed',
        requests: 10,
        durationS: 5,
        rate: 2.5,
        burstiness: 0.5,
        concurrency: 4,
        seed: 9,
        slo: { ttft: 500, tpot: 50, e2el: 9000 },
        percentiles: [90, 99.9],
        metrics: ['ttft', 'itl'],
        headers: { 'x-slagate-class': 'batch' },
        classHints: false,
        sessionIds: false,
        label: 'L',
        detailed: true,
        timeoutMs: 30_000,
      },
    });
    expect(parseBenchArgs(['--help'])).toBeNull();
    expect(parseBenchArgs(['--target', 'http://h', '--rate', 'inf'])?.options.rate).toBe(
      Number.POSITIVE_INFINITY,
    );
  });
});

describe('progress bar', () => {
  it('draws on a terminal and stays silent when piped', () => {
    let tty = '';
    let piped = '';
    const fake = (isTTY: boolean, sink: (s: string) => void) =>
      ({
        isTTY,
        write: (s: string) => {
          sink(s);
          return true;
        },
      }) as unknown as NodeJS.WriteStream;
    let t = 0;
    const p = createProgress(
      4,
      fake(true, (s) => (tty += s)),
      () => t,
    );
    const q = createProgress(
      4,
      fake(false, (s) => (piped += s)),
      () => t,
    );
    for (let i = 0; i < 4; i++) {
      t += 500;
      p.tick(i !== 1);
      q.tick(true);
    }
    p.done();
    q.done();
    expect(piped).toBe('');
    expect(tty).toContain('4/4');
    expect(tty).toContain('1 failed');
    expect(tty).toContain('[##############################]');
  });
});
