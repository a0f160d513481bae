import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { RedisStateConfig } from '../../src/config/index.ts';
import { createLiveState, type LiveState, livenessTtlMs } from '../../src/state/index.ts';
import { SHARE_EVERY_MS } from '../../src/state/prefix-index.ts';
import { type RedisServer, startRedisServer } from '../helpers/redis-server.ts';
import { closeServer, metricsServer, vllmPage } from './fixtures/metrics-server.ts';
import { latencySample, observe } from './fixtures/sample.ts';

const BACKENDS = [
  { name: 'gpu-0', url: 'http://127.0.0.1:1' },
  { name: 'gpu-1', url: 'http://127.0.0.1:2' },
];
const REFRESH_MS = 100;
const COMMAND_TIMEOUT_MS = 100;

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function until(
  cond: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string,
): Promise<number> {
  const start = performance.now();
  while (!(await cond())) {
    if (performance.now() - start > timeoutMs)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(5);
  }
  return performance.now() - start;
}

const sample = latencySample;

/** Parses `INFO commandstats` into calls per command. */
async function commandCalls(redis: RedisServer): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const m of (await redis.cli('info', 'commandstats')).matchAll(/cmdstat_([a-z|]+):calls=(\d+)/g)) {
    out[m[1] as string] = Number(m[2]);
  }
  return out;
}

/** A Promise or other thenable: something the caller would have to wait for. */
function isThenable(value: unknown): boolean {
  return typeof (value as { then?: unknown } | null | undefined)?.then === 'function';
}

/** The TTFT the request-path samples below follow exactly: base, per prefill token, per load. */
const ttftOf = (tokens: number, load: number) => 20 + 0.1 * tokens + 5 * load;

/**
 * The request path's calls for `n` requests to gpu-1, made while Redis does not answer: every one
 * returns its value itself (no Promise to wait on), and the values are those of the local state:
 * the lease held is counted, every record is in the window at once. Returns what went otherwise
 * (empty when all is well); collected rather than asserted per call to keep the loop short.
 */
function requestPathCalls(s: LiveState, n: number): string[] {
  const wrong: string[] = [];
  const check = (i: number, what: string, ok: boolean) => {
    if (!ok && wrong.length < 10) wrong.push(`request ${i}: ${what}`);
  };
  const before = s.backendView('gpu-1')!.latency.ttft.count;
  for (let i = 0; i < n; i++) {
    const lease = s.lease('gpu-1', { promptTokens: 100, expectedOutputTokens: 10 });
    check(i, 'lease is a thenable', !isThenable(lease) && typeof lease.end === 'function');
    const tokens = (i % 50) * 20;
    const load = i % 7;
    const ttftMs = ttftOf(tokens, load);
    const first = s.recordFirstToken({
      backend: 'gpu-1',
      backendTtftMs: ttftMs,
      uncachedPromptTokens: tokens,
      prefillAheadTokens: 0,
      loadAtDispatch: load,
    });
    check(i, 'recordFirstToken returned a value', first === undefined);
    const recorded = s.record(sample({ backend: 'gpu-1', ttftMs, loadAtDispatch: load }));
    check(i, 'record returned a value', recorded === undefined);
    const view = s.backendView('gpu-1');
    check(i, 'backendView is a thenable', !isThenable(view));
    check(i, 'own lease not counted', view?.localInflight.requests === 1);
    check(i, 'record not in the window', view?.latency.ttft.count === before + i + 1);
    const predicted = s.predictTtftMs('gpu-1', 1000);
    check(i, 'predictTtftMs not a number', predicted === null || Number.isFinite(predicted));
    const ended = typeof lease.end === 'function' ? lease.end() : 'no end()';
    check(i, 'lease.end returned a value', ended === undefined);
  }
  if (s.backendView('gpu-1')?.localInflight.requests !== 0) wrong.push('leases still counted after end');
  return wrong;
}

/** After requestPathCalls: the TTFT prediction is the one its samples imply (learnt locally). */
async function expectLocalPrediction(s: LiveState): Promise<void> {
  await sleep(50); // past the fit's re-solve interval (20 ms), so the last samples are in it
  const now = s.inflight('gpu-1');
  const expected = ttftOf(1000 + now.pendingPrefillTokens, now.requests);
  expect(s.predictTtftMs('gpu-1', 1000)).toBeCloseTo(expected, 0);
}

describe('LiveState with the Redis store (real redis-server)', () => {
  let redis: RedisServer;
  const states: LiveState[] = [];
  let prefixN = 0;
  let cfg: RedisStateConfig;

  const make = (
    id: string,
    over: Partial<RedisStateConfig> = {},
    blockSizeTokens?: number,
    departedTokensMs?: number,
  ) => {
    const s = createLiveState(
      { ...cfg, ...over },
      {
        instanceId: id,
        backends: BACKENDS,
        scrape: false,
        ...(blockSizeTokens === undefined ? {} : { blockSizeTokens: () => blockSizeTokens }),
        ...(departedTokensMs === undefined ? {} : { departedTokensMs }),
      },
    );
    states.push(s);
    return s;
  };

  beforeAll(async () => {
    redis = await startRedisServer();
  });
  afterAll(async () => {
    await redis.stop();
  });
  beforeEach(() => {
    // A fresh key prefix per test: no test sees another's instances.
    cfg = {
      store: 'redis',
      redis_url: redis.url,
      key_prefix: `t${prefixN++}`,
      connect_timeout_ms: 500,
      command_timeout_ms: COMMAND_TIMEOUT_MS,
      refresh_interval_ms: REFRESH_MS,
      inflight_interval_ms: REFRESH_MS,
      topology: 'standalone',
      sentinels: [],
      sentinel_name: 'mymaster',
      cluster_nodes: [],
    };
  });
  afterEach(async () => {
    await Promise.all(states.splice(0).map((s) => s.close()));
  });

  it('a peer of the last snapshot version (a rolling upgrade) is not counted: not its leases, not as a peer', async () => {
    // What an instance of the version before writes: its heartbeat (kept live for the test) and a
    // snapshot with its in-flight counts inside, and no in-flight part.
    const [secs] = (await redis.cli('time')).trim().split(/\s+/);
    const key = (k: string) => `{${cfg.key_prefix}}:${k}`;
    await redis.cli('zadd', key('instances'), String(Number(secs) * 1000 + 60_000), 'old');
    const v2 = { v: 2, b: { 'gpu-0': { f: [7, 700, 70, 0], a: 0, w: {}, p: [], d: [] } }, t: {} };
    await redis.cli('hset', key('snapshots'), 'old', JSON.stringify(v2));
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    b.lease('gpu-0', { promptTokens: 1, expectedOutputTokens: 1 });
    await until(() => a.inflight('gpu-0').requests === 1, 2_000, "a to see b's lease");
    // Several exchanges later, full ones among them (every 50 ms here), still only b's.
    await exchanges(a, 4);
    expect(a.inflight('gpu-0')).toMatchObject({ requests: 1, promptTokens: 1 });
    expect(a.status().peers).toBe(1);
  });

  it('two instances see each other’s in-flight counts, windows and fits within one refresh', async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    expect(a.status()).toMatchObject({ store: 'redis', degraded: false, lastError: null });

    const leases = [1, 2, 3].map(() => a.lease('gpu-0', { promptTokens: 1000, expectedOutputTokens: 100 }));
    b.lease('gpu-0', { promptTokens: 10, expectedOutputTokens: 1 });
    // Counted in time, in exchanges rather than milliseconds: a's exchange under way may have taken
    // its snapshot before the leases, so its next one carries them; and b's under way may have read
    // before that write, so its next one reads them.
    await exchanges(a, 2);
    await exchanges(b, 2);
    expect(b.inflight('gpu-0').requests).toBe(4);
    expect(b.inflight('gpu-0')).toMatchObject({ promptTokens: 3010, expectedOutputTokens: 301 });
    expect(b.backendView('gpu-0')?.localInflight.requests).toBe(1);
    await until(() => a.inflight('gpu-0').requests === 4, 2_000, 'a to see b’s lease');
    expect(a.status().peers).toBe(1);

    // Latency windows: each records half; both see the union.
    for (let i = 1; i <= 100; i++) observe(i % 2 ? a : b, sample({ ttftMs: i * 10 }));
    await until(
      () =>
        a.backendView('gpu-0')?.latency.ttft.count === 100 &&
        b.backendView('gpu-0')?.latency.ttft.count === 100,
      2_000,
      'merged windows',
    );
    const pa = a.backendView('gpu-0')!.latency.ttft;
    const pb = b.backendView('gpu-0')!.latency.ttft;
    expect(pa.p99).toBeCloseTo(pb.p99 as number, 6);
    expect(pa.p50!).toBeGreaterThan(500 * 0.95);
    expect(pa.p50!).toBeLessThan(500 * 1.05);

    for (const l of leases) l.end();
    await until(() => b.inflight('gpu-0').requests === 1, 2_000, 'b to see a’s leases end');
  });

  it('in-flight counts travel at their own pace: a peer sees a lease and its end between two exchanges of the full snapshots', async () => {
    // Full snapshots every 500 ms (half the refresh interval), in-flight parts every 10 ms.
    const over = { refresh_interval_ms: 1_000, inflight_interval_ms: 20 };
    const a = make('a', over);
    const b = make('b', over);
    await Promise.all([a.ready(), b.ready()]);
    const windowCount = () => b.backendView('gpu-0')?.latency.ttft.count ?? 0;
    // The first sample reaches b with a full exchange: b has just read a's full snapshot when it
    // shows, so the next one is half a second away.
    observe(a, sample({ ttftMs: 100 }));
    await until(() => windowCount() === 1, 3_000, "b to read a's full snapshot");
    observe(a, sample({ ttftMs: 200 }));
    const lease = a.lease('gpu-0', { promptTokens: 1000, expectedOutputTokens: 100 });
    await until(() => b.inflight('gpu-0').requests === 1, 400, "b to see a's lease");
    expect(b.inflight('gpu-0')).toMatchObject({ promptTokens: 1000, expectedOutputTokens: 100 });
    // The second sample travels with the full snapshot, not yet read.
    expect(windowCount()).toBe(1);
    lease.end();
    await until(() => b.inflight('gpu-0').requests === 0, 400, "b to see a's lease end");
    expect(windowCount()).toBe(1);
    // And the full snapshot still comes, at its own pace.
    await until(() => windowCount() === 2, 3_000, "b to read a's next full snapshot");
    expect(b.status().peers).toBe(1);
  });

  it('fits combine across instances: each sees the rate learnt from both', async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    // a only sees short prompts, b only long ones: neither alone could tell a rate from its own
    // samples if they did not vary, but together they span the range.
    for (let i = 0; i < 40; i++) {
      observe(a, sample({ ttftMs: 20 + 0.1 * 100, uncachedPromptTokens: 100, loadAtDispatch: 0 }));
      observe(b, sample({ ttftMs: 20 + 0.1 * 3000, uncachedPromptTokens: 3000, loadAtDispatch: 0 }));
    }
    await until(() => (a.backendView('gpu-0')?.rates.ttft?.samples ?? 0) === 80, 2_000, 'merged fit');
    for (const s of [a, b]) {
      expect(s.backendView('gpu-0')!.rates.prefillTokensPerS!).toBeCloseTo(10_000, -1);
      expect(s.predictTtftMs('gpu-0', 1000)!).toBeCloseTo(120, 3);
    }
    // a sends 30,000 tokens to prefill (3 s at that rate): b counts what a's last snapshot had
    // still ahead, as a's own prediction does, not the whole until its first token.
    const cold = a.lease('gpu-0', { promptTokens: 30_000, expectedOutputTokens: 10 });
    await until(
      () => b.prefillAheadTokens('gpu-0') > 0 && b.prefillAheadTokens('gpu-0') < 30_000,
      2_000,
      "b to see a's prefill drain",
    );
    expect(b.inflight('gpu-0').requests).toBe(1);
    expect(a.inflight('gpu-0').pendingPrefillTokens).toBe(30_000);
    cold.end();
    await until(() => b.prefillAheadTokens('gpu-0') === 0, 2_000, "b to see a's prefill end");
  });

  it('with two instances prefilling on one backend neither counts its part drained (it cannot tell whose goes first); once one is done, the other drains from then on', async () => {
    let clock = 1_000_000;
    const on = (id: string) => {
      const s = createLiveState(cfg, { instanceId: id, backends: BACKENDS, scrape: false, now: () => clock });
      states.push(s);
      return s;
    };
    const a = on('a');
    const b = on('b');
    await Promise.all([a.ready(), b.ready()]);
    for (let i = 0; i < 40; i++) {
      clock += 10;
      observe(a, sample({ ttftMs: 20 + 0.1 * 100, uncachedPromptTokens: 100, loadAtDispatch: 0 }));
      observe(b, sample({ ttftMs: 20 + 0.1 * 3000, uncachedPromptTokens: 3000, loadAtDispatch: 0 }));
    }
    await until(
      () => {
        clock += 1; // past the fit's re-solve interval, so each look sees the merged sums
        return (a.backendView('gpu-0')?.rates.ttft?.samples ?? 0) === 80;
      },
      2_000,
      'merged fit',
    );
    // 10,000 tokens each, sent together: 20,000 at 10 tokens a millisecond is 2 s of prefill.
    const la = a.lease('gpu-0', { promptTokens: 10_000, expectedOutputTokens: 10 });
    const lb = b.lease('gpu-0', { promptTokens: 10_000, expectedOutputTokens: 10 });
    await until(
      () => a.prefillAheadTokens('gpu-0') === 20_000 && b.prefillAheadTokens('gpu-0') === 20_000,
      2_000,
      "each to see the other's",
    );
    // Half a second on, the backend has done 5,000 of the 20,000, but whose no instance can tell:
    // each drained its own at the whole rate, they would count 10,000 done. Neither drains.
    // (a writes its part at its next exchange; b reads it at its own next one.)
    clock += 500;
    await exchanges(a, 1);
    await exchanges(b, 1);
    expect(b.prefillAheadTokens('gpu-0')).toBe(20_000);
    // a's request ends: b's part drains from when b learns so, not from when it was sent.
    la.end();
    await exchanges(a, 1);
    await exchanges(b, 1);
    expect(b.prefillAheadTokens('gpu-0')).toBe(10_000);
    clock += 300;
    expect(b.prefillAheadTokens('gpu-0')).toBeCloseTo(7_000, -2);
    lb.end();
  });

  /** Resolves after the next `n` completed exchanges of `s` with Redis. */
  const exchanges = (s: LiveState, n: number) =>
    new Promise<void>((resolve) => {
      let left = n;
      s.onPeersChanged(() => {
        if (--left === 0) resolve();
      });
    });
  const chain = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

  it('the prefix index is shared: deltas reach a peer at its next exchange, and a late joiner reads the history', async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    const system = chain(1, 40);
    a.prefixInsert('gpu-0', [...system, ...chain(1000, 10)]);
    a.prefixInsert('gpu-1', chain(5000, 8));
    // a sends at its next exchange; b reads at the one after that.
    await exchanges(a, 1);
    await exchanges(b, 2);
    expect(b.prefixMatch('gpu-0', [...system, ...chain(2000, 3)])).toBe(40);
    expect(b.prefixMatch('gpu-1', chain(5000, 8))).toBe(8);
    expect(b.prefixMatch('gpu-1', system)).toBe(0);
    // A prefix re-sent within SHARE_EVERY_MS of being told adds nothing to the log.
    const before = Number(await redis.cli('xlen', `{${cfg.key_prefix}}:log`));
    a.prefixInsert('gpu-0', system);
    await exchanges(a, 2);
    expect(Number(await redis.cli('xlen', `{${cfg.key_prefix}}:log`))).toBe(before);
    // b's own inserts reach a.
    b.prefixInsert('gpu-1', chain(7000, 5));
    await exchanges(b, 1);
    await exchanges(a, 2);
    expect(a.prefixMatch('gpu-1', chain(7000, 5))).toBe(5);
    // An instance that joins now learns everything both have sent.
    const late = make('late');
    await late.ready();
    await exchanges(late, 1);
    expect(late.prefixMatch('gpu-0', [...system, ...chain(1000, 10)])).toBe(50);
    expect(late.prefixMatch('gpu-1', chain(7000, 5))).toBe(5);
  });

  it("an instance started after a backend's engine restarted does not learn the old engine's blocks from the log", async () => {
    // gpu-0's /metrics: its process start time, and a waiting count that marks each new answer.
    let start = 1_700_000_000.5;
    let waiting = 0;
    const srv = await metricsServer(() => vllmPage({ waiting, startS: start }));
    try {
      const scraping = (id: string) => {
        const s = createLiveState(cfg, {
          instanceId: id,
          backends: [{ name: 'gpu-0', url: srv.url }],
          scrape: { intervalMs: 20 },
        });
        states.push(s);
        return s;
      };
      const scraped = (s: LiveState, w: number) =>
        until(() => s.telemetry('gpu-0')?.waiting === w, 2_000, `a scrape showing ${w} waiting`);
      const a = scraping('a');
      await a.ready();
      await scraped(a, 0);
      a.prefixInsert('gpu-0', chain(1, 10));
      await exchanges(a, 1);
      // The engine restarts: a sees it and forgets what the old one held.
      start += 60;
      waiting = 1;
      await scraped(a, 1);
      expect(a.prefixMatch('gpu-0', chain(1, 10))).toBe(0);
      // An instance that joins now reads the log's history, told under the old engine.
      const late = scraping('late');
      await late.ready();
      await exchanges(late, 1);
      await scraped(late, 1);
      expect(late.prefixMatch('gpu-0', chain(1, 10))).toBe(0);
      // What is told of the new engine is learnt.
      a.prefixInsert('gpu-0', chain(100, 5));
      await exchanges(a, 1);
      await exchanges(late, 2);
      expect(late.prefixMatch('gpu-0', chain(100, 5))).toBe(5);
    } finally {
      await closeServer(srv.server);
    }
  });

  it('a peer learns only the blocks hashed at its own block size (a rolling change of router.block_size_tokens)', async () => {
    const a16 = make('a16', {}, 16);
    const b64 = make('b64', {}, 64);
    const c64 = make('c64', {}, 64);
    await Promise.all([a16.ready(), b64.ready(), c64.ready()]);
    a16.prefixInsert('gpu-0', chain(1, 20));
    b64.prefixInsert('gpu-1', chain(100, 5));
    await Promise.all([exchanges(a16, 1), exchanges(b64, 1)]);
    await Promise.all([exchanges(a16, 2), exchanges(b64, 2), exchanges(c64, 2)]);
    // The same size: learnt. Another size: skipped, both ways.
    expect(c64.prefixMatch('gpu-1', chain(100, 5))).toBe(5);
    expect(c64.prefixMatch('gpu-0', chain(1, 20))).toBe(0);
    expect(b64.prefixMatch('gpu-0', chain(1, 20))).toBe(0);
    expect(a16.prefixMatch('gpu-1', chain(100, 5))).toBe(0);
    expect(c64.prefixSize('gpu-0').blocks).toBe(0);
  });

  it('a peer skips blocks hashed by a gateway version that hashes prompts otherwise (a rolling upgrade)', async () => {
    // What the version before the endpoint-named root writes: the block size alone as the tag.
    const hex = (from: number, n: number) =>
      chain(from, n)
        .map((h) => h.toString(36))
        .join(',');
    const log = `{${cfg.key_prefix}}:log`;
    await redis.cli('xadd', log, '*', 'i', 'old', 'p', `gpu-0@64:${hex(500, 6)}`);
    const a = make('a', {}, 64);
    await a.ready();
    const b = make('b', {}, 64);
    await b.ready();
    b.prefixInsert('gpu-1', chain(900, 4));
    await exchanges(b, 1);
    await exchanges(a, 2);
    // This version's blocks: learnt; the older hashing's: skipped.
    expect(a.prefixMatch('gpu-1', chain(900, 4))).toBe(4);
    expect(a.prefixMatch('gpu-0', chain(500, 6))).toBe(0);
    expect(a.prefixSize('gpu-0').blocks).toBe(0);
  });

  it('a peer skips blocks told of another server under the same name (a reload that moved it, reaching one instance first)', async () => {
    const a = make('a');
    // b has had the reload: gpu-0 is another server now.
    const moved = BACKENDS.map((t) => (t.name === 'gpu-0' ? { ...t, url: 'http://127.0.0.1:1/moved' } : t));
    const b = createLiveState(cfg, { instanceId: 'b', backends: moved, scrape: false });
    states.push(b);
    await Promise.all([a.ready(), b.ready()]);
    b.prefixInsert('gpu-0', chain(300, 6));
    b.prefixInsert('gpu-1', chain(900, 4));
    // And a part of a version before parts named the server: taken as of the name's.
    const hex = (from: number, n: number) =>
      chain(from, n)
        .map((h) => h.toString(36))
        .join(',');
    await redis.cli('xadd', `{${cfg.key_prefix}}:log`, '*', 'i', 'old', 'p', `gpu-1:${hex(700, 3)}`);
    await exchanges(b, 1);
    await exchanges(a, 2);
    // The server both name the same: learnt. The one a does not know under that name: skipped.
    expect(a.prefixMatch('gpu-1', chain(900, 4))).toBe(4);
    expect(a.prefixMatch('gpu-1', chain(700, 3))).toBe(3);
    // What b wrote, as a version before the digest reads it (name up to '@' or ':', the hashes
    // that parse in base 36): the same backend and the same hashes, the digest no hash to it.
    const written = (await redis.cli('xrange', `{${cfg.key_prefix}}:log`, '-', '+'))
      .split('\n')
      .filter((l) => l.includes('gpu-1') && !l.includes(hex(700, 3)));
    expect(written).toHaveLength(1);
    const part = written[0]!.split(';').find((p) => p.startsWith('gpu-1'))!;
    expect(part).toMatch(/^gpu-1(@[0-9.]+)?:[0-9a-z,]+,~[A-Za-z0-9_-]{8}(\/[0-9.]+)?$/);
    const oldHashes = part
      .slice(part.indexOf(':') + 1)
      .split('/')[0]!
      .split(',')
      .map((h) => Number.parseInt(h, 36))
      .filter((h) => Number.isSafeInteger(h) && h >= 0);
    expect(oldHashes).toEqual(chain(900, 4));
    expect(a.prefixMatch('gpu-0', chain(300, 6))).toBe(0);
    expect(a.prefixSize('gpu-0').blocks).toBe(0);
    // Once a has the reload too, what b tells of the new server is learnt.
    a.setBackends(moved);
    b.prefixInsert('gpu-0', chain(400, 3));
    await exchanges(b, 1);
    await exchanges(a, 2);
    expect(a.prefixMatch('gpu-0', chain(400, 3))).toBe(3);
  });

  it('requests still running on a backend a reload removed are told to the peers that still list it, until they end', async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    const leases = [1, 2, 3].map(() => a.lease('gpu-1', { promptTokens: 100, expectedOutputTokens: 10 }));
    await until(() => b.load('gpu-1') === 3, 2_000, "b to see a's requests");
    // a's configuration no longer lists gpu-1; b's has not been reloaded yet.
    a.setBackends([BACKENDS[0]!]);
    await exchanges(a, 2);
    await exchanges(b, 2);
    expect(b.load('gpu-1')).toBe(3);
    expect(b.inflight('gpu-1').promptTokens).toBe(300);
    leases[0]!.end();
    await until(() => b.load('gpu-1') === 2, 2_000, 'b to see one end');
    for (const l of leases) l.end();
    await until(() => b.load('gpu-1') === 0, 2_000, 'b to see the rest end');
  });

  it('blocks hashed before a reload that changes the block size are not told to peers at the new size', async () => {
    let size = 16;
    const a = createLiveState(cfg, {
      instanceId: 'a',
      backends: BACKENDS,
      scrape: false,
      blockSizeTokens: () => size,
    });
    states.push(a);
    const b = make('b', {}, 64);
    await Promise.all([a.ready(), b.ready()]);
    a.prefixInsert('gpu-0', chain(1, 10));
    size = 64; // a reload, before a's next exchange
    await exchanges(a, 1);
    await exchanges(b, 2);
    expect(b.prefixSize('gpu-0').blocks).toBe(0);
    // What a hashes at the new size reaches b.
    a.prefixInsert('gpu-0', chain(50, 4));
    await exchanges(a, 1);
    await exchanges(b, 2);
    expect(b.prefixMatch('gpu-0', chain(50, 4))).toBe(4);
    expect(b.prefixSize('gpu-0').blocks).toBe(4);
  });

  it("a prefix one instance keeps using stays in the other's index while the other's own traffic churns past it", async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    const hot = chain(1, 40);
    a.prefixInsert('gpu-0', hot);
    await exchanges(a, 1);
    await exchanges(b, 2);
    expect(b.prefixMatch('gpu-0', hot)).toBe(40);
    // b sends 18,000 blocks of its own to gpu-0 (more than the 16,384 its index holds per backend
    // without a KV size), in three parts; before each part a has used the hot prefix again, which
    // the backend's own LRU would count, and a tells b of that use.
    for (let part = 0; part < 3; part++) {
      await sleep(SHARE_EVERY_MS + 20);
      a.prefixInsert('gpu-0', hot);
      await exchanges(a, 1);
      await exchanges(b, 2);
      for (let i = 0; i < 6; i++) b.prefixInsert('gpu-0', chain(1_000_000 + (part * 6 + i) * 1000, 1000));
    }
    expect(b.prefixMatch('gpu-0', hot)).toBe(40);
    // The first of b's own parts, not used since, has aged out.
    expect(b.prefixMatch('gpu-0', chain(1_000_000, 1000))).toBe(0);
  });

  it('an instance that closes withdraws at once; one that is SIGKILLed stops counting within 5 s', async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    b.lease('gpu-1', { promptTokens: 1, expectedOutputTokens: 1 });
    await until(() => a.load('gpu-1') === 1, 2_000, 'a to see b');
    await b.close();
    const gone = await until(() => a.load('gpu-1') === 0, 2_000, 'closed instance gone');
    expect(gone).toBeLessThan(livenessTtlMs(cfg));

    // A separate process, killed with SIGKILL: no goodbye; its heartbeat expires.
    const watcher = createLiveState(
      { ...cfg, key_prefix: 'killtest' },
      { instanceId: 'watcher', backends: BACKENDS, scrape: false },
    );
    states.push(watcher);
    const fixture = fileURLToPath(new URL('./fixtures/instance.ts', import.meta.url));
    const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', fixture, redis.url, '5'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout?.on('data', (d: Buffer) => d.toString().includes('synced') && resolve());
        child.once('exit', (code) => reject(new Error(`instance exited early (${code})`)));
      });
      await until(() => watcher.load('gpu-0') === 5, 3_000, 'watcher to see the child’s leases');
      expect(watcher.backendView('gpu-0')?.latency.ttft.count).toBe(1);
      await until(() => watcher.tenantUsage('acme').tokens === 300, 3_000, 'watcher to see its tenant');
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await exited;
      const stoppedAfter = await until(
        () => watcher.load('gpu-0') === 0,
        6_000,
        'dead instance to stop counting',
      );
      expect(stoppedAfter).toBeLessThan(5_000);
      // The TTL is what bounds it (plus the watcher's next refresh, with slack for a busy machine).
      expect(stoppedAfter).toBeLessThan(livenessTtlMs(cfg) + 1_000);
      // Its windows go with the watcher's next full exchange (every tick here; that a peer's leaving
      // brings it forward is in redis-sync.test.ts).
      await until(
        () => watcher.backendView('gpu-0')?.latency.ttft.count === 0,
        1_000,
        "the dead instance's windows to leave",
      );
      // Its tenant's request died with it; the tokens it admitted were spent, and still count.
      expect(watcher.tenantUsage('acme')).toEqual({ inflight: 0, tokens: 300 });
    } finally {
      child.kill('SIGKILL');
    }
  });

  it("a full exchange that keeps failing: the counts still travel; the peers' tenants go at the TTL, as in an outage; the store stays degraded", async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    const tenant = a.tenantLease('acme', 700);
    const held = a.lease('gpu-0', { promptTokens: 10, expectedOutputTokens: 1 });
    await until(
      () => b.tenantUsage('acme').inflight === 1 && b.load('gpu-0') === 1,
      2_000,
      "b to see a's lease",
    );
    // Every full exchange is refused from now on (the snapshots key is not a hash); the in-flight parts pass.
    await redis.cli('set', `{${cfg.key_prefix}}:snapshots`, 'not a hash');
    tenant.end();
    // a's tenant, which travels only in full, is no longer known to b: not frozen at the last full
    // exchange (its ended request counted against acme's limits), but shared out as in an outage.
    await until(
      () => b.tenantUsage('acme').inflight === 0 && b.tenantShare() === 0.5,
      livenessTtlMs(cfg) + 2_000,
      "a's tenants to leave b's view",
    );
    // The counts still travel both ways.
    expect(b.load('gpu-0')).toBe(1);
    held.end();
    await until(() => b.load('gpu-0') === 0, 2_000, "a's request to leave b's count");
    expect(b.status().degraded).toBe(true);
    expect(a.status().degraded).toBe(true);
  });

  it("a tenant's tokens stay counted after the instance that admitted them stops, until they leave the window", async () => {
    // The window a departed instance's tokens count for, shortened from a minute.
    const KEEP_MS = 1_500;
    const a = make('a', {}, undefined, KEEP_MS);
    const b = make('b', {}, undefined, KEEP_MS);
    await Promise.all([a.ready(), b.ready()]);
    const lease = a.tenantLease('acme', 700);
    await until(() => b.tenantUsage('acme').tokens === 700, 2_000, "b to see a's tokens");
    expect(b.tenantUsage('acme').inflight).toBe(1);
    // A rolling restart: a stops with its request in flight.
    await a.close();
    await until(() => b.tenantUsage('acme').inflight === 0, 2_000, "a's request to leave the count");
    expect(b.tenantUsage('acme').tokens).toBe(700);
    // Its successor learns them at its first exchange.
    const c = make('c', {}, undefined, KEEP_MS);
    await c.ready();
    await until(() => c.tenantUsage('acme').tokens === 700, 2_000, "the successor to count a's tokens");
    expect(c.tenantUsage('acme').inflight).toBe(0);
    // Once they are out of the window, nobody counts them.
    await until(() => b.tenantUsage('acme').tokens === 0, KEEP_MS + 3_000, 'the departed tokens to expire');
    await until(() => c.tenantUsage('acme').tokens === 0, 2_000, 'the departed tokens to expire at c');
    lease.end();
  });

  it('the tokens of an instance killed with no peer left reach the successor that starts after its heartbeat expired', async () => {
    const fixture = fileURLToPath(new URL('./fixtures/instance.ts', import.meta.url));
    const prefix = `alone${prefixN++}`;
    const child: ChildProcess = spawn(
      process.execPath,
      ['--import', 'tsx', fixture, redis.url, '1', prefix],
      {
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const raw = new Redis(redis.url, { lazyConnect: true });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout?.on('data', (d: Buffer) => d.toString().includes('synced') && resolve());
        child.once('exit', (code) => reject(new Error(`instance exited early (${code})`)));
      });
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await exited;
      // Its in-flight part expires with the liveness TTL: from then on it is dead to anyone.
      await raw.connect();
      await until(
        async () => (await raw.exists(`{${prefix}}:inflight`)) === 0,
        10_000,
        'its heartbeat to expire',
      );
      const successor = make('successor', { key_prefix: prefix });
      await successor.ready();
      await until(() => successor.tenantUsage('acme').tokens === 300, 2_000, "the dead instance's tokens");
      expect(successor.tenantUsage('acme').inflight).toBe(0);
      // …and none of its leases or windows.
      expect(successor.load('gpu-0')).toBe(0);
    } finally {
      child.kill('SIGKILL');
      raw.disconnect();
    }
  });

  it('peers dropped by an outage are counted as running what this instance runs, their prefill ahead draining beside its own', async () => {
    // a on a clock of the test's own: the view ages past the TTL when the test says, between two
    // exchanges (each stamps the view with this clock).
    let now = Date.now();
    const a = createLiveState(cfg, { instanceId: 'a', backends: BACKENDS, scrape: false, now: () => now });
    states.push(a);
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    b.lease('gpu-1', { promptTokens: 10, expectedOutputTokens: 1 });
    await until(() => a.load('gpu-1') === 1, 2_000, "a to count b's lease");
    // The TTFT fit: 0.1 ms per prefill token.
    for (let i = 0; i < 40; i++) {
      const tokens = 500 + 100 * (i % 10);
      a.recordFirstToken({
        backend: 'gpu-1',
        backendTtftMs: ttftOf(tokens, 1),
        uncachedPromptTokens: tokens,
        prefillAheadTokens: 0,
        loadAtDispatch: 1,
      });
    }
    now += 50;
    expect(a.backendView('gpu-1')?.rates.prefillTokensPerS).toBeCloseTo(10_000, -2);
    // Everything from here to the end runs in one turn of the loop: no exchange comes between.
    now += livenessTtlMs(cfg) + 1;
    expect(a.status().peers).toBe(0);
    const lease = a.lease('gpu-1', {
      promptTokens: 1000,
      expectedOutputTokens: 10,
      uncachedPromptTokens: 1000,
    });
    // b is taken to run what a runs: twice a's one request, twice its 1,000 tokens of prefill.
    expect(a.load('gpu-1')).toBe(2);
    expect(a.prefillAheadTokens('gpu-1')).toBeCloseTo(2000, 0);
    // After a's 1,000 tokens' worth of prefill time (100 ms) half of the 2,000 is done: the backend
    // works b's beside a's, and a's part drains at half the rate.
    now += 100;
    expect(a.prefillAheadTokens('gpu-1')).toBeCloseTo(1000, -1);
    now += 100;
    expect(a.prefillAheadTokens('gpu-1')).toBeCloseTo(0, 0);
    lease.end();
  });

  it('Redis killed under load: calls answer from local state at once, degraded soon, recovery without backlog replay', async () => {
    const a = make('a');
    const b = make('b');
    await Promise.all([a.ready(), b.ready()]);
    const held = a.lease('gpu-0', { promptTokens: 100, expectedOutputTokens: 10 });
    b.lease('gpu-0', { promptTokens: 100, expectedOutputTokens: 10 });
    await until(() => a.load('gpu-0') === 2 && b.load('gpu-0') === 2, 2_000, 'shared counts');
    // With the peer's counts in view, each instance checks the tenants' whole limits.
    expect(a.tenantShare()).toBe(1);

    await redis.kill9();
    // Brought back however the test ends: the tests after it need a Redis.
    let up = false;
    try {
      const killedAt = performance.now();
      // Request-path calls while Redis is gone: 5000 requests' worth of leases and records, each
      // answered at once from the local state (none waits for Redis).
      expect(requestPathCalls(a, 5_000)).toEqual([]);
      // Soon counts from the end of those calls: they hold the event loop, so no tick runs until
      // they end (on a busy machine they took most of the allowance).
      const calledAt = performance.now();
      await expectLocalPrediction(a);
      await until(() => a.status().degraded && b.status().degraded, 3_000, 'degraded');
      expect(performance.now() - calledAt).toBeLessThan(COMMAND_TIMEOUT_MS + REFRESH_MS + 1_000);
      expect(a.status().lastError).not.toBeNull();
      // The tick never blocks: a failed exchange takes no longer than the command timeout.
      expect(a.status().lastSyncDurationMs!).toBeLessThan(COMMAND_TIMEOUT_MS + 100);
      // Local state keeps serving: a's own lease and records are there.
      expect(a.backendView('gpu-1')?.latency.ttft.count).toBe(5_000);
      expect(a.backendView('gpu-0')?.localInflight.requests).toBe(1);
      // The status counts the peers whose data the view still holds: b's, until the liveness TTL.
      expect(a.status().peers).toBe(a.load('gpu-0') - 1);
      // The peer's part lasts at most the liveness TTL, then only local data counts...
      await until(() => a.status().peers === 0, livenessTtlMs(cfg) + 1_000, 'peer data to expire');
      // ...and b, which a's last exchange counted, is taken to run what a runs on each backend: the
      // two, each counting alone, fill one concurrency limit together, not one each.
      expect(a.backendView('gpu-0')?.localInflight.requests).toBe(1);
      expect(a.load('gpu-0')).toBe(2);
      const more = a.lease('gpu-0', { promptTokens: 100, expectedOutputTokens: 10 });
      expect(a.load('gpu-0')).toBe(4);
      expect(a.inflight('gpu-0').promptTokens).toBe(400);
      // Counting alone now, each of the two takes half of every tenant limit.
      expect(a.tenantShare()).toBe(0.5);
      // And the fits learn nothing: a first token's load now counts a's requests alone, against
      // samples that ran beside b's.
      const samplesOf = () => a.backendView('gpu-1')?.rates.ttft?.samples ?? 0;
      const teach = (n: number) => {
        for (let i = 0; i < n; i++) {
          a.recordFirstToken({
            backend: 'gpu-1',
            backendTtftMs: ttftOf(500, 1),
            uncachedPromptTokens: 500,
            prefillAheadTokens: 0,
            loadAtDispatch: 1,
          });
        }
      };
      const taughtBefore = samplesOf();
      teach(10);
      await sleep(50); // past the fit's re-solve interval (20 ms)
      expect(samplesOf()).toBe(taughtBefore);

      await redis.restart();
      up = true;
      const recovered = await until(() => !a.status().degraded && !b.status().degraded, 5_000, 'recovery');
      expect(recovered).toBeLessThan(3_000);
      await until(() => b.load('gpu-0') === 3, 2_000, 'shared counts again');
      expect(b.tenantShare()).toBe(1);
      // b's one lease, not a's own counted twice.
      await until(() => a.load('gpu-0') === 3, 2_000, "a counting b's lease again");
      // With the peers counted again, first tokens teach again.
      teach(10);
      await until(() => samplesOf() === taughtBefore + 10, 1_000, 'the fit to learn again');
      more.end();
      held.end();
      await until(() => b.load('gpu-0') === 1, 2_000, 'b to see the end of a’s leases');
      // Let a few more ticks run, then count what Redis has executed since it came back.
      await sleep(5 * REFRESH_MS);
      const calls = await commandCalls(redis);
      const scripts = (calls.evalsha ?? 0) + (calls.eval ?? 0);
      const elapsedTicks = (performance.now() - killedAt) / REFRESH_MS;
      // One script per instance per tick since the restart, nothing per request made while down.
      expect(scripts).toBeGreaterThan(0);
      expect(scripts).toBeLessThanOrEqual(2 * (elapsedTicks + 2));
      // Each script writes the in-flight part, and on its ticks the full snapshot: nothing else.
      expect(calls.hset ?? 0).toBeLessThanOrEqual(2 * scripts);
      const total = Object.values(calls).reduce((x, y) => x + y, 0);
      expect(total).toBeLessThan(5_000 / 5);
    } finally {
      if (!up) await redis.restart();
    }
  });

  it('Redis that stops answering (SIGSTOP): the command timeout bounds every tick', async () => {
    const a = make('a');
    await a.ready();
    expect(a.status().degraded).toBe(false);
    redis.pause();
    try {
      expect(requestPathCalls(a, 2_000)).toEqual([]);
      // Counted from the end of the calls, which hold the event loop (as above).
      const stalledAt = performance.now();
      await expectLocalPrediction(a);
      await until(() => a.status().degraded, 3_000, 'degraded on timeout');
      expect(performance.now() - stalledAt).toBeLessThan(COMMAND_TIMEOUT_MS + REFRESH_MS + 1_000);
      expect(a.status().lastError).toMatch(/timed out/);
      expect(a.status().lastSyncDurationMs!).toBeLessThan(COMMAND_TIMEOUT_MS + 100);
    } finally {
      redis.resume();
    }
    await until(() => !a.status().degraded, 5_000, 'recovery after SIGCONT');
  });

  it('Redis stalled for many ticks: on waking it runs at most the call that timed out, not a backlog of ticks', async () => {
    const a = make('a');
    await a.ready();
    expect(a.status().degraded).toBe(false);
    const scriptsOf = (c: Record<string, number>) => (c.evalsha ?? 0) + (c.eval ?? 0);
    const before = scriptsOf(await commandCalls(redis));
    redis.pause();
    try {
      await until(() => a.status().degraded, 3_000, 'degraded on timeout');
      // The outage itself: a tick every REFRESH_MS / 2, about twenty of them while Redis is frozen.
      await sleep(10 * REFRESH_MS);
    } finally {
      redis.resume();
    }
    await until(() => !a.status().degraded, 5_000, 'recovery after SIGCONT');
    const ran = scriptsOf(await commandCalls(redis)) - before;
    // The call that timed out (Redis read it before it froze or finds it on the socket) and the
    // ticks since it woke; before the fix every tick of the outage queued one more, all run here.
    expect(ran).toBeGreaterThan(0);
    expect(ran).toBeLessThanOrEqual(5);
  });

  it('Redis down at boot: starts degraded and serving, recovers when Redis starts', async () => {
    await redis.kill9();
    try {
      const a = make('a');
      const started = performance.now();
      await a.ready();
      expect(performance.now() - started).toBeLessThan(cfg.connect_timeout_ms + COMMAND_TIMEOUT_MS + 500);
      expect(a.status()).toMatchObject({ store: 'redis', degraded: true, lastSyncAgeMs: null });
      // No peer was ever seen: nothing to share the tenants' limits with.
      expect(a.tenantShare()).toBe(1);
      const l = a.lease('gpu-0', { promptTokens: 1, expectedOutputTokens: 1 });
      observe(a, sample());
      expect(a.load('gpu-0')).toBe(1);
      expect(a.backendView('gpu-0')?.latency.ttft.count).toBe(1);
      await sleep(3 * REFRESH_MS);
      expect(a.status().degraded).toBe(true);
      await redis.restart();
      await until(() => !a.status().degraded, 5_000, 'recovery after a late Redis');
      const b = make('b');
      await b.ready();
      await until(() => b.load('gpu-0') === 1, 2_000, 'b to see a');
      l.end();
    } finally {
      await redis.restart();
    }
  });
});

describe('LiveState on Redis Cluster (single-node cluster, ioredis Cluster client)', () => {
  let redis: RedisServer;
  beforeAll(async () => {
    redis = await startRedisServer({ cluster: true });
  });
  afterAll(async () => {
    await redis.stop();
  });

  it('the sync script runs in one slot and instances share counts', async () => {
    const cfg: RedisStateConfig = {
      store: 'redis',
      redis_url: redis.url,
      key_prefix: 'cluster',
      connect_timeout_ms: 1_000,
      command_timeout_ms: 200,
      refresh_interval_ms: REFRESH_MS,
      inflight_interval_ms: REFRESH_MS,
      topology: 'cluster',
      sentinels: [],
      sentinel_name: 'mymaster',
      cluster_nodes: [],
    };
    const opts = { backends: BACKENDS, scrape: false as const };
    const a = createLiveState(cfg, { ...opts, instanceId: 'a' });
    const b = createLiveState(cfg, { ...opts, instanceId: 'b' });
    try {
      await Promise.all([a.ready(), b.ready()]);
      a.lease('gpu-0', { promptTokens: 1, expectedOutputTokens: 1 });
      await until(() => b.load('gpu-0') === 1, 3_000, 'b to see a through the cluster');
      expect(b.status()).toMatchObject({ degraded: false, peers: 1 });
      expect(await redis.cli('cluster', 'keyslot', '{cluster}:instances')).toBe(
        await redis.cli('cluster', 'keyslot', '{cluster}:snapshots'),
      );
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});
