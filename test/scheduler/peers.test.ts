// Gateway instances on one real redis-server, each with its own closed loop per backend: an
// instance whose loop has no evidence of its own (nothing it sent there ran) follows the limit
// another instance's evidence set, instead of holding its own while the others fill the backend.
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import type { RedisStateConfig } from '../../src/config/index.ts';
import { leastLoaded } from '../../src/router/policies/least-loaded.ts';
import { Scheduler } from '../../src/scheduler/scheduler.ts';
import { createLiveState, type LiveState } from '../../src/state/index.ts';
import { BackendSet } from '../../src/upstream/backends.ts';
import { Cancel } from '../../src/upstream/cancel.ts';
import { DEFAULT_BACKEND_SET_OPTIONS } from '../../src/upstream/options.ts';
import { type RedisServer, startRedisServer } from '../helpers/redis-server.ts';
import { schedulerSettings } from './fixtures.ts';

const BACKENDS = [{ name: 'a', url: 'http://127.0.0.1:9' }];
let redis: RedisServer;
const cleanups: (() => unknown)[] = [];

beforeAll(async () => {
  redis = await startRedisServer();
});
afterAll(async () => {
  await redis.stop();
});
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function store(prefix: string): RedisStateConfig {
  return {
    store: 'redis',
    redis_url: redis.url,
    key_prefix: prefix,
    connect_timeout_ms: 1_000,
    command_timeout_ms: 500,
    refresh_interval_ms: 100,
    inflight_interval_ms: 50,
    topology: 'standalone',
    sentinels: [],
    sentinel_name: 'mymaster',
    cluster_nodes: [],
  };
}

async function until(cond: () => boolean, what: string): Promise<void> {
  const deadline = performance.now() + 5_000;
  while (!cond()) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Resolves after the next `n` completed exchanges of `s` with Redis. */
function exchanges(s: LiveState, n: number): Promise<void> {
  return new Promise((resolve) => {
    let left = n;
    s.onPeersChanged(() => {
      if (--left === 0) resolve();
    });
  });
}

function instance(prefix: string, id: string): LiveState {
  const live = createLiveState(store(prefix), { instanceId: id, backends: BACKENDS, scrape: false });
  cleanups.push(() => live.close());
  return live;
}

it('an instance with no evidence of its own takes the limit a peer set on evidence, with a slot to learn from, and tells none itself', async () => {
  const peer = instance('peers1', 'peer');
  const live = instance('peers1', 'me');
  await Promise.all([peer.ready(), live.ready()]);
  // The peer runs 12 requests there under the limit its own loop set, 40.
  for (let i = 0; i < 12; i++) peer.lease('a', { promptTokens: 10, expectedOutputTokens: 10 });
  peer.shareLimit('a', 40);
  const backends = new BackendSet(
    { ...DEFAULT_BACKEND_SET_OPTIONS, health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: 0 } },
    BACKENDS,
  );
  cleanups.push(() => backends.close());
  const settings = schedulerSettings({
    concurrency: { ...schedulerSettings().concurrency, initial: 4, intervalMs: 50 },
  });
  const scheduler = new Scheduler({
    backends: () => backends.list(),
    live,
    router: () => leastLoaded(() => 0.5),
    settings: () => settings,
  });
  cleanups.push(() => scheduler.close());
  // Its room at its own limit (4) is gone under the peer's 12: it would be granted nothing, and
  // learn nothing. Its loop follows the peer's 40 instead, and it may start a request there now.
  await until(() => live.load('a') === 12, "the peer's requests counted");
  await until(() => scheduler.limit('a') === 40, "the peer's limit taken");
  expect(scheduler.startsNow('a', 0)).toBe(true);
  // Followed, not measured: it tells the peer no limit of its own. Four of its exchanges (a tick
  // every 50 ms) span control periods (every 50 ms) in which a limit of its own would have been
  // set and sent; the peer's next two read whatever was sent.
  await exchanges(live, 4);
  await exchanges(peer, 2);
  expect(peer.peersLimit('a')).toBeNull();
  // A peer's limit below the load there (set for a tighter target, say) is followed with one slot
  // over the load: a follower locked out would never learn a limit of its own.
  peer.shareLimit('a', 3);
  await until(() => scheduler.limit('a') === 13, "the peer's lower limit taken, with a slot");
  expect(scheduler.startsNow('a', 0)).toBe(true);
  // Once it has a request of its own running there, the slot is taken: it follows the peer's limit
  // itself (followers each adding one a period would push the load up together).
  const slot = await scheduler
    .ticket({
      reqId: 'mine',
      className: 'interactive',
      priority: 0,
      sheddable: false,
      tenant: 't',
      model: 'm',
      arrivedAt: performance.now(),
      ttftTargetMs: 60_000,
      tpotTargetMs: 60_000,
      deadlineAt: performance.now() + 60_000,
      promptTokens: 10,
      uncachedTokens: 10,
      expectedOutputTokens: 10,
      noQueue: false,
      route: {
        reqId: 'mine',
        promptTokens: 10,
        blocks: [],
        blockSizeTokens: 64,
        tokensPerBlock: 16,
        outputTokensPerSequence: 10,
        tpotTargetMs: 60_000,
      },
      predictions: new Map(),
      prefillMs: null,
      bestBackendMs: null,
      ttftBudgetMs: 60_000,
      loopDelayMs: 0,
    })
    .acquire({ attempt: 0, excluded: new Set(), signal: new Cancel() });
  expect(slot?.backend.name).toBe('a');
  await until(() => scheduler.limit('a') === 3, "the peer's limit, without the slot");
  slot!.release();
});
