// Two gateway instances' schedulers over one real redis-server: the entry that has waited longest
// for a backend's prefill room gets it, whichever instance queues it (src/scheduler/scheduler.ts,
// #startable; src/state/live-state.ts, holdPrefill).
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { createLiveState, type LiveState } from '../../src/state/index.ts';
import { Cancel, type Slot } from '../../src/upstream/index.ts';
import { type RedisServer, startRedisServer } from '../helpers/redis-server.ts';
import { scheduledRequest, schedulerFixture, schedulerSettings } from './fixtures.ts';

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

let prefix = 0;
function instances(ids: string[]) {
  const key = `sp${prefix++}`;
  return ids.map((id) => {
    const live = createLiveState(
      {
        store: 'redis',
        redis_url: redis.url,
        key_prefix: key,
        connect_timeout_ms: 500,
        command_timeout_ms: 200,
        refresh_interval_ms: 50,
        topology: 'standalone',
        sentinels: [],
        sentinel_name: 'mymaster',
        cluster_nodes: [],
      },
      { instanceId: id, backends: [{ name: 'gpu-0', url: 'http://127.0.0.1:9' }], scrape: false },
    );
    const settings = schedulerSettings({
      concurrency: { ...schedulerSettings().concurrency, initial: 8, prefillTokens: 1000 },
    });
    const f = schedulerFixture(['gpu-0'], settings, undefined, { live });
    cleanups.push(() => f.close());
    return f;
  });
}

/** Resolves at the first exchange with the store after which `cond` holds. */
function whenPeers(live: LiveState, cond: () => boolean): Promise<void> {
  if (cond()) return Promise.resolve();
  return new Promise((resolve) => {
    let done = false;
    live.onPeersChanged(() => {
      if (!done && cond()) {
        done = true;
        resolve();
      }
    });
  });
}

const req = scheduledRequest;

const first = () => ({ attempt: 0, excluded: new Set<string>(), signal: new Cancel() });

async function state(p: Promise<Slot | null>): Promise<Slot | null | 'waiting'> {
  const waiting = Symbol('waiting');
  const r = await Promise.race([
    p,
    new Promise<typeof waiting>((resolve) => setImmediate(() => resolve(waiting))),
  ]);
  return r === waiting ? 'waiting' : r;
}

it("a peer leaves a backend's prefill to the entry that has waited longest for it there", async () => {
  const [a, b] = instances(['a', 'b']);
  await Promise.all([a!.live.ready(), b!.live.ready()]);
  // b is prefilling 800 tokens on gpu-0 (the cap is 1,000).
  const running = await b!.scheduler.ticket(req({ uncachedTokens: 800, promptTokens: 800 })).acquire(first());
  await whenPeers(a!.live, () => a!.live.inflight('gpu-0').pendingPrefillTokens === 800);
  // a's long prompt, over the cap, waits until nothing is pending there, and holds the prefill.
  const huge = a!.scheduler
    .ticket(req({ reqId: 'huge', uncachedTokens: 5000, promptTokens: 5000 }))
    .acquire(first());
  expect(await state(huge)).toBe('waiting');
  await whenPeers(b!.live, () => b!.live.prefillHeldByPeer('gpu-0'));
  expect(a!.live.prefillHeldByPeer('gpu-0')).toBe(false);
  // b's small prompt would fit under the cap (800 + 100), but the peer's entry has waited longer.
  const small = b!.scheduler
    .ticket(req({ reqId: 'small', uncachedTokens: 100, promptTokens: 100 }))
    .acquire(first());
  expect(await state(small)).toBe('waiting');
  // b's prefill ends: a sees nothing pending at its next exchange and sends the long prompt.
  running!.prefillDone();
  const hugeSlot = (await huge)!;
  expect(hugeSlot.backend.name).toBe('gpu-0');
  // Its hold goes with it; its prefill (5,000) is pending now, and the small one waits for that.
  await whenPeers(b!.live, () => !b!.live.prefillHeldByPeer('gpu-0'));
  expect(await state(small)).toBe('waiting');
  hugeSlot.prefillDone();
  expect((await small)!.backend.name).toBe('gpu-0');
  running!.release();
  hugeSlot.release();
});
