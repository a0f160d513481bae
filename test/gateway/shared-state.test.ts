// Live state shared through a real redis-server between real `slagate serve` processes: each sees
// the other's in-flight counts and latency windows (how soon, in exchanges with Redis, is
// test/state/redis.test.ts's to show, in one process without a loaded machine's timing); a gateway killed
// with SIGKILL stops counting within 5 s; Redis killed under load fails no request, sets the
// degraded flag and clears it when Redis is back; Redis frozen under load makes no request wait
// for it (checklist items 23–25); Redis down at boot still serves.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type Fleet, startFleet } from '../../src/sim/fleet.ts';
import { freePort, type RedisServer, startRedisServer } from '../helpers/redis-server.ts';
import {
  chat,
  get,
  MODEL,
  type OpenStream,
  openStream,
  post,
  readRecords,
  type ServedGateway,
  serveChild,
  sseData,
  waitFor,
} from './harness.ts';

const CHAT = '/v1/chat/completions';
const REFRESH_MS = 200;
const COMMAND_TIMEOUT_MS = 50;

let fleet: Fleet;
let redis: RedisServer;
let prefixN = 0;
const cleanups: (() => unknown)[] = [];

beforeAll(async () => {
  // At the profile's own pace: the long streams below only need to be in flight, and a faster
  // fleet would make the gateways relay thousands of events a second beside what is tested.
  fleet = await startFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 1 });
  redis = await startRedisServer();
});
afterAll(async () => {
  await fleet.close();
  await redis.stop();
});
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function gatewayConfig(redisUrl: string, prefix: string, commandTimeoutMs = COMMAND_TIMEOUT_MS) {
  return {
    models: [MODEL],
    backends: fleet.urls.map((url, i) => ({ name: `r${i}`, url })),
    router: { policy: 'least_loaded' },
    // Targets no load here reaches: these tests are about Redis, and on a machine busy with the
    // rest of the suite admission would otherwise refuse what the gateway's own loop delays.
    sla: {
      default_class: 'interactive',
      classes: { interactive: { ttft_p99_ms: 60_000, tpot_p99_ms: 60_000, priority: 0 } },
    },
    state: {
      store: 'redis',
      redis_url: redisUrl,
      key_prefix: prefix,
      refresh_interval_ms: REFRESH_MS,
      command_timeout_ms: commandTimeoutMs,
      connect_timeout_ms: 300,
    },
    upstream: { metrics_scrape_interval_ms: 200, health_interval_ms: 200 },
  };
}

async function gateway(
  redisUrl = redis.url,
  prefix = `p${prefixN}`,
  commandTimeoutMs?: number,
): Promise<ServedGateway> {
  const g = await serveChild(gatewayConfig(redisUrl, prefix, commandTimeoutMs));
  cleanups.push(g.dispose);
  return g;
}

interface AdminBackend {
  name: string;
  local_inflight: number;
  inflight: { requests: number; promptTokens: number; pendingPrefillTokens: number };
  latency: { requests: number; ttft: { p50: number | null } };
}
interface AdminState {
  store: { store: string; degraded: boolean; peers: number };
  backends: AdminBackend[];
}

async function admin(url: string): Promise<AdminState> {
  return JSON.parse((await get(url, '/admin/state')).text) as AdminState;
}

const sum = (bs: AdminBackend[], f: (b: AdminBackend) => number) => bs.reduce((a, b) => a + f(b), 0);

async function longStreams(url: string, n: number): Promise<OpenStream[]> {
  const streams = await Promise.all(
    Array.from(
      { length: n },
      (_, i) =>
        openStream(url, CHAT, chat({ stream: true, max_tokens: 4000, ignore_eos: true }), {
          'x-request-id': `long-${prefixN}-${i}`,
        }).response,
    ),
  );
  for (const s of streams) await s.until((text) => sseData(text).length >= 2);
  for (const s of streams) cleanups.push(() => s.close());
  return streams;
}

describe('two gateway processes sharing one redis-server', () => {
  it("see each other's in-flight counts and latency windows", async () => {
    prefixN++;
    const a = await gateway();
    const b = await gateway();
    await waitFor(async () => (await admin(b.url)).store.peers >= 1, 5000, 'b sees a as a peer');

    await longStreams(a.url, 3);
    // A's own counts are up the moment its streams are; B must see them within a refresh of each.
    expect(sum((await admin(a.url)).backends, (x) => x.local_inflight)).toBe(3);
    await waitFor(
      async () => sum((await admin(b.url)).backends, (x) => x.inflight.requests) === 3,
      5000,
      "b sees a's 3 streams",
    );
    const onB = (await admin(b.url)).backends;
    expect(sum(onB, (x) => x.local_inflight)).toBe(0);
    expect(sum(onB, (x) => x.inflight.promptTokens)).toBeGreaterThan(0);
    // Every stream has its first token, so none of its prompt is still waiting for prefill. B may
    // first see a snapshot A published between dispatch and first token; the next one must be clear.
    await waitFor(
      async () => sum((await admin(b.url)).backends, (x) => x.inflight.pendingPrefillTokens) === 0,
      5000,
      'prefill marked done on b',
    );

    // Latency windows: streamed requests completed through A appear in B's window.
    for (let i = 0; i < 4; i++) {
      expect((await post(a.url, CHAT, chat({ max_tokens: 4, stream: true }))).status).toBe(200);
    }
    await waitFor(
      async () => sum((await admin(b.url)).backends, (x) => x.latency.requests) >= 4,
      5000,
      "b sees a's latency samples",
    );
    const withTtft = (await admin(b.url)).backends.filter((x) => x.latency.requests > 0);
    for (const x of withTtft) expect(x.latency.ttft.p50).toBeGreaterThan(0);
  });

  it('a gateway killed with SIGKILL stops counting within 5 s', async () => {
    prefixN++;
    const a = await gateway();
    const b = await gateway();
    await longStreams(a.url, 2);
    await waitFor(
      async () => sum((await admin(b.url)).backends, (x) => x.inflight.requests) === 2,
      5000,
      "b sees a's streams",
    );
    a.child.kill('SIGKILL');
    const killedAt = performance.now();
    await waitFor(
      async () => sum((await admin(b.url)).backends, (x) => x.inflight.requests) === 0,
      8000,
      "a's leases to expire",
    );
    expect(performance.now() - killedAt).toBeLessThan(5000);
  });
});

describe('Redis failures never fail a request', () => {
  interface Done {
    at: number;
    ms: number;
    status: number;
  }

  /** Closed-loop load from 4 clients until `stop()`; `done` fills as requests end. */
  function closedLoad(url: string): { done: Done[]; stop: () => Promise<void> } {
    const done: Done[] = [];
    let stopped = false;
    const loops = Promise.all(
      Array.from({ length: 4 }, async () => {
        while (!stopped) {
          const t = performance.now();
          const r = await post(url, CHAT, chat({ max_tokens: 4 }));
          done.push({ at: t, ms: performance.now() - t, status: r.status });
        }
      }),
    );
    return {
      done,
      stop: async () => {
        stopped = true;
        await loops;
      },
    };
  }

  /** `n` more requests have ended than `done` held when this was called. */
  const more = (done: Done[], n: number) => {
    const from = done.length;
    return waitFor(() => done.length >= from + n, 10_000, `${n} more requests`);
  };

  /** The requests of `done` begun at or after `t`. */
  const begunSince = (done: Done[], t: number) => done.filter((d) => d.at >= t);

  it('Redis killed under load: no request fails, degraded set then cleared (items 23, 25)', async () => {
    prefixN++;
    const g = await gateway();
    const load = closedLoad(g.url);
    let down = false;
    try {
      await more(load.done, 20);
      await redis.kill9();
      down = true;
      const killedAt = performance.now();
      await waitFor(async () => (await admin(g.url)).store.degraded, 3000, 'degraded');
      const ready = await get(g.url, '/readyz');
      expect(ready.status).toBe(200);
      expect(JSON.parse(ready.text)).toMatchObject({ status: 'degraded' });
      expect((await get(g.url, '/metrics')).text).toMatch(/^slagate_state_store_degraded 1$/m);
      await waitFor(
        () => begunSince(load.done, killedAt).length >= 20,
        10_000,
        '20 requests begun with Redis down',
      );
      await redis.restart();
      down = false;
      await waitFor(async () => !(await admin(g.url)).store.degraded, 5000, 'degraded to clear');
      expect((await get(g.url, '/metrics')).text).toMatch(/^slagate_state_store_degraded 0$/m);
      await more(load.done, 20);
      await load.stop();

      // No request failed because of Redis, before, during or after the outage.
      expect(load.done.filter((d) => d.status !== 200)).toEqual([]);
      expect(readRecords(g.log).filter((r) => r.outcome !== 'ok')).toEqual([]);
    } finally {
      if (down) await redis.restart();
      await load.stop();
    }
  });

  it('Redis frozen under load: no request waits for it (item 24)', async () => {
    // A frozen server (SIGSTOP) keeps its port open and answers nothing: each command waits its
    // whole timeout, here 2 s. A request whose path waited on Redis would take at least that; one
    // served from memory takes a few milliseconds, so 1 s apart is no question of the machine's speed.
    const TIMEOUT_MS = 2000;
    prefixN++;
    const g = await gateway(redis.url, `p${prefixN}`, TIMEOUT_MS);
    const load = closedLoad(g.url);
    let frozen = false;
    try {
      await more(load.done, 20);
      redis.pause();
      frozen = true;
      const frozenAt = performance.now();
      // Degraded once a sync's command has timed out: a whole timeout in which requests went on.
      await waitFor(async () => (await admin(g.url)).store.degraded, TIMEOUT_MS + 5000, 'degraded');
      // Waited for by count, with room for requests that each waited out a timeout (the failure
      // this looks for shows as their times, not as this wait's).
      const frozenOnes = () => begunSince(load.done, frozenAt);
      await waitFor(() => frozenOnes().length >= 12, 30_000, '12 requests begun while frozen');
      expect(Math.max(...frozenOnes().map((d) => d.ms))).toBeLessThan(TIMEOUT_MS / 2);
      redis.resume();
      frozen = false;
      await waitFor(async () => !(await admin(g.url)).store.degraded, TIMEOUT_MS + 5000, 'degraded to clear');
      await load.stop();
      expect(load.done.filter((d) => d.status !== 200)).toEqual([]);
      expect(readRecords(g.log).filter((r) => r.outcome !== 'ok')).toEqual([]);
    } finally {
      if (frozen) redis.resume();
      await load.stop();
    }
  });

  it('Redis down at boot: the gateway starts, serves, and reports degraded (item 23)', async () => {
    prefixN++;
    const port = await freePort();
    const g = await gateway(`redis://127.0.0.1:${port}`);
    expect((await post(g.url, CHAT, chat({ max_tokens: 4 }))).status).toBe(200);
    const ready = await get(g.url, '/readyz');
    expect(ready.status).toBe(200);
    expect(JSON.parse(ready.text)).toMatchObject({ status: 'degraded', store: 'redis' });
    expect((await admin(g.url)).store.degraded).toBe(true);
  });
});
