// Late dispatch, the queue guard and the refusals of the scheduler (src/scheduler/scheduler.ts),
// against a real memory live state and a real backend set (no request is ever sent: a slot is a
// lease, and what happens on the wire is the upstream layer's).
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { RoutingPolicy } from '../../src/router/index.ts';
import { leastLoaded } from '../../src/router/policies/least-loaded.ts';
import { slagate } from '../../src/router/policies/slagate.ts';
import type { BackendView } from '../../src/router/types.ts';
import { gonePrefillMs } from '../../src/scheduler/prefix-gone.ts';
import type { SchedulerSettings } from '../../src/scheduler/scheduler.ts';
import type { ScheduledRequest } from '../../src/scheduler/types.ts';
import { DEFAULT_CAPACITY } from '../../src/state/prefix-index.ts';
import { Cancel } from '../../src/upstream/cancel.ts';
import type { DecodeMeter } from '../../src/upstream/measure.ts';
import type { Slot } from '../../src/upstream/slot.ts';
import { rankingFirst, route } from '../router/fixtures.ts';
import { latencySample, observe } from '../state/fixtures/sample.ts';
import { schedulerFixture, schedulerSettings as settings } from './fixtures.ts';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(
  names: string[],
  s: SchedulerSettings = settings(),
  router?: Parameters<typeof schedulerFixture>[2],
  opts?: Parameters<typeof schedulerFixture>[3],
) {
  const f = schedulerFixture(names, s, router, opts);
  cleanups.push(() => f.close());
  return f;
}

let n = 0;
function req(over: Partial<ScheduledRequest> = {}): ScheduledRequest {
  const id = over.reqId ?? `r${n++}`;
  // The deadline on the arrival's clock: a test on the fixture's shared clock (far ahead of the
  // process's) gave an arrival of its own and kept a deadline long past on that clock, refused
  // at the guard's first timer, on a busy machine before the test looked.
  const arrivedAt = over.arrivedAt ?? performance.now();
  return {
    reqId: id,
    className: 'interactive',
    priority: 0,
    sheddable: false,
    tenant: 'anonymous',
    model: 'm',
    arrivedAt,
    ttftTargetMs: 60_000,
    tpotTargetMs: 50,
    deadlineAt: arrivedAt + 60_000,
    uncachedTokens: 100,
    promptTokens: 100,
    expectedOutputTokens: 10,
    noQueue: false,
    predictions: new Map(),
    prefillMs: null,
    bestBackendMs: null,
    ...over,
    ttftBudgetMs: over.ttftBudgetMs ?? over.ttftTargetMs ?? 60_000,
    loopDelayMs: over.loopDelayMs ?? 0,
    route: over.route ?? route({ reqId: id, promptTokens: over.promptTokens ?? 100 }),
  };
}

/** Teaches backend a's fit: dispatch → first token = 0.1 ms per uncached token − 10 ms (20 samples). */
function teachBelowZero(f: ReturnType<typeof setup>): void {
  for (let i = 0; i < 20; i++) {
    f.tick(10);
    const tokens = 200 + 200 * (i % 5);
    observe(
      f.live,
      latencySample({
        backend: 'a',
        uncachedPromptTokens: tokens,
        queueMs: 0,
        ttftMs: 0.1 * tokens - 10,
        loadAtDispatch: 0,
      }),
    );
  }
}

/** `n` gaps of `ms` each between token events, on the backend whose meter this is. */
function pace(meter: DecodeMeter, n: number, ms: number): void {
  for (let i = 0; i < n; i++) meter.add(ms);
}

const first = (signal = new Cancel()) => ({
  attempt: 0,
  excluded: new Set<string>(),
  signal,
});

/** A first attempt that may not use `names`: asked again after one of them refused it before it started. */
const firstExcluding = (...names: string[]) => ({
  attempt: 0,
  excluded: new Set(names),
  signal: new Cancel(),
});

/** Settles within the current turn of the event loop, or reports it is still waiting. */
async function state(p: Promise<Slot | null>): Promise<Slot | null | 'waiting' | { error: unknown }> {
  const waiting = Symbol('waiting');
  const r = await Promise.race([
    p.then(
      (v) => v,
      (error: unknown) => ({ error }),
    ),
    new Promise<typeof waiting>((resolve) => setImmediate(() => resolve(waiting))),
  ]);
  return r === waiting ? 'waiting' : r;
}

describe('late dispatch', () => {
  it('grants up to each backend limit, queues the rest, and grants again when a slot is released', async () => {
    const { scheduler, live } = setup(['a', 'b']);
    const slots = await Promise.all([1, 2, 3, 4].map(() => scheduler.ticket(req()).acquire(first())));
    // Two per backend (the limit is `initial`), spread by the router.
    expect(slots.map((s) => s!.backend.name).sort()).toEqual(['a', 'a', 'b', 'b']);
    expect(live.load('a') + live.load('b')).toBe(4);
    const fifth = scheduler.ticket(req({ reqId: 'fifth' })).acquire(first());
    expect(await state(fifth)).toBe('waiting');
    expect(scheduler.view()).toMatchObject({ queued: 1 });
    slots[0]!.release();
    const granted = await fifth;
    expect(granted!.backend.name).toBe(slots[0]!.backend.name);
    // Released twice is released once: the lease subtracts exactly what it added.
    slots[0]!.release();
    expect(live.load('a') + live.load('b')).toBe(4);
  });

  /** Backends a and b with one slot each. */
  const oneSlotEach = () =>
    setup(['a', 'b'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }));

  it('a first attempt asked again (its backend refused it before it started) is never granted a backend it was given', async () => {
    const { scheduler } = oneSlotEach();
    const onA = await scheduler.ticket(req()).acquire(firstExcluding('b'));
    expect(onA!.backend.name).toBe('a');
    // b is free, but this request was on it: it waits for a.
    const again = scheduler.ticket(req()).acquire(firstExcluding('b'));
    expect(await state(again)).toBe('waiting');
    onA!.release();
    expect((await again)!.backend.name).toBe('a');
  });

  it('such a request gets null at once when none of the backends it may use is left, as a retry does', async () => {
    const { scheduler, backends } = oneSlotEach();
    const onA = await scheduler.ticket(req()).acquire(firstExcluding('b'));
    const again = scheduler.ticket(req()).acquire(firstExcluding('b'));
    expect(await state(again)).toBe('waiting');
    backends.get('a')!.breaker.open();
    scheduler.pump();
    expect(await state(again)).toBeNull();
    expect(scheduler.view()).toMatchObject({ queued: 0 });
    onA!.release();
  });

  it('…whether the pump reaches it or not: behind an entry waiting for a full backend', async () => {
    const { scheduler, backends } = oneSlotEach();
    const onA = await scheduler.ticket(req()).acquire(firstExcluding('b'));
    const onB = await scheduler.ticket(req()).acquire(firstExcluding('a'));
    // Both full: the first queued entry waits for one of them and the pump goes no further.
    const ahead = scheduler.ticket(req()).acquire(first());
    const again = scheduler.ticket(req()).acquire(firstExcluding('b'));
    expect(await state(again)).toBe('waiting');
    backends.get('a')!.breaker.open();
    scheduler.pump();
    expect(await state(again)).toBeNull();
    expect(await state(ahead)).toBe('waiting');
    onB!.release();
    (await ahead)!.release();
    onA!.release();
  });

  it('such a request is not refused for a full queue: its place was counted when it first asked', async () => {
    const { scheduler } = setup(
      ['a', 'b'],
      settings({ maxQueue: 1, concurrency: { ...settings().concurrency, initial: 1 } }),
    );
    const onA = await scheduler.ticket(req()).acquire(firstExcluding('b'));
    const ticket = scheduler.ticket(req({ reqId: 'refused-unstarted' }));
    const onB = await ticket.acquire(first());
    expect(onB!.backend.name).toBe('b');
    // b's breaker refused the granted request before it started: b goes to the next request.
    onB!.release();
    const next = await scheduler.ticket(req()).acquire(first());
    expect(next!.backend.name).toBe('b');
    // One request waits: the queue is at its bound, and a new request is refused.
    const behind = scheduler.ticket(req()).acquire(first());
    expect(await state(behind)).toBe('waiting');
    expect(await state(scheduler.ticket(req()).acquire(first()))).toMatchObject({
      error: { code: 'queue_full' },
    });
    // The request b refused asks again: it waits.
    const again = ticket.acquire(firstExcluding('b'));
    expect(await state(again)).toBe('waiting');
    expect(scheduler.view()).toMatchObject({ queued: 2 });
    onA!.release();
    expect((await again)!.backend.name).toBe('a');
    next!.release();
    (await behind)!.release();
  });

  it('…and keeps the place its first ask gave it: requests that came after it do not pass it', async () => {
    const { scheduler } = oneSlotEach();
    const onA = await scheduler.ticket(req()).acquire(firstExcluding('b'));
    const ticket = scheduler.ticket(req({ reqId: 'earlier' }));
    const onB = await ticket.acquire(first());
    expect(onB!.backend.name).toBe('b');
    // Both full. A later request queues; then b refuses the earlier one before it starts.
    const later = scheduler.ticket(req({ reqId: 'later' })).acquire(first());
    expect(await state(later)).toBe('waiting');
    onB!.release();
    // b is free now, and the later request takes it.
    const laterSlot = await later;
    expect(laterSlot!.backend.name).toBe('b');
    const latest = scheduler.ticket(req({ reqId: 'latest' })).acquire(first());
    const again = ticket.acquire(firstExcluding('b'));
    expect(await state(again)).toBe('waiting');
    expect(await state(latest)).toBe('waiting');
    // a frees: the earlier request, asked again after the latest one queued, is served first.
    onA!.release();
    expect((await again)!.backend.name).toBe('a');
    expect(await state(latest)).toBe('waiting');
    laterSlot!.release();
    (await latest)!.release();
  });

  it('…and its tenant is charged once for it, though it was granted twice', async () => {
    const { scheduler } = oneSlotEach();
    const of = (tenant: string, reqId: string, uncachedTokens = 100) =>
      req({ reqId, tenant, uncachedTokens, expectedOutputTokens: 0 });
    const hold = await scheduler.ticket(of('z', 'hold')).acquire(firstExcluding('b'));
    const ticket = scheduler.ticket(of('x', 'x0'));
    const onB = await ticket.acquire(first());
    expect(onB!.backend.name).toBe('b');
    // Both full. y queues first (work 50), then x and y again (100 each).
    const y0 = scheduler.ticket(of('y', 'y0', 50)).acquire(first());
    const x1 = scheduler.ticket(of('x', 'x1')).acquire(first());
    const y1 = scheduler.ticket(of('y', 'y1')).acquire(first());
    // b refused x0 before it started: b goes to y0 (y charged 50), and x0 asks again.
    onB!.release();
    const y0Slot = await y0;
    expect(y0Slot!.backend.name).toBe('b');
    const x0 = ticket.acquire(firstExcluding('b'));
    hold!.release();
    const x0Slot = await x0;
    expect(x0Slot!.backend.name).toBe('a');
    // x was charged for x0 at its first grant, not again: x 0 against y 50, so x1 goes before y1
    // (charged again, x would be at 100 and y1 would go first).
    y0Slot!.release();
    expect(await state(x1)).not.toBe('waiting');
    expect(await state(y1)).toBe('waiting');
    x0Slot!.release();
    (await x1)!.release();
    (await y1)!.release();
  });

  it('a retry never goes back to a backend it tried, and is served before fresh requests', async () => {
    const { scheduler } = setup(
      ['a', 'b'],
      settings({ concurrency: { ...settings().concurrency, initial: 1 } }),
    );
    const sa = await scheduler.ticket(req()).acquire(first());
    const sb = await scheduler.ticket(req()).acquire(first());
    const fresh = scheduler.ticket(req({ reqId: 'fresh' })).acquire(first());
    const retry = scheduler
      .ticket(req({ reqId: 'retry' }))
      .acquire({ attempt: 1, excluded: new Set(['a']), signal: new Cancel() });
    // a frees first: the retry may not use it, so the fresh request gets it.
    const freed = sa!.backend.name === 'a' ? sa! : sb!;
    const other = freed === sa ? sb! : sa!;
    freed.release();
    expect((await fresh)!.backend.name).toBe('a');
    expect(await state(retry)).toBe('waiting');
    // b frees: the retry takes it, although it was queued after `fresh`'s successors would be.
    const later = scheduler.ticket(req({ reqId: 'later' })).acquire(first());
    other.release();
    expect((await retry)!.backend.name).toBe('b');
    expect(await state(later)).toBe('waiting');
  });

  it('a retry of a request that may not wait gets null at once when no backend has room, not a wait', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, set } = setup(['a', 'b'], s);
    const held = [
      await scheduler.ticket(req()).acquire(first()),
      await scheduler.ticket(req()).acquire(first()),
    ];
    const retryOf = (over: Partial<ScheduledRequest>) =>
      scheduler.ticket(req(over)).acquire({ attempt: 1, excluded: new Set(['a']), signal: new Cancel() });
    expect(await state(retryOf({ noQueue: true }))).toBeNull();
    // One that may wait waits for b.
    const patient = retryOf({});
    expect(await state(patient)).toBe('waiting');
    set(settings({ maxQueue: 0, concurrency: { ...s.concurrency } }));
    expect(await state(retryOf({}))).toBeNull();
    for (const h of held) h!.release();
    expect((await patient)!.backend.name).toBe('b');
  });

  it('a retry that has no backend left gets null at once; a fresh request with no available backend too', async () => {
    const { scheduler, backends } = setup(['a']);
    const none = await scheduler
      .ticket(req())
      .acquire({ attempt: 1, excluded: new Set(['a']), signal: new Cancel() });
    expect(none).toBeNull();
    backends.get('a')!.breaker.open();
    expect(await scheduler.ticket(req()).acquire(first())).toBeNull();
  });

  it('offers a request only the backends that list its model, and none when none does', async () => {
    const { scheduler, backends } = setup(
      ['a', 'b'],
      settings({ concurrency: { ...settings().concurrency, initial: 1 } }),
    );
    backends.get('a')!.models = new Set(['other']);
    // b has not listed its models: taken to serve every one.
    const first1 = await scheduler.ticket(req()).acquire(first());
    expect(first1!.backend.name).toBe('b');
    // b is full and a has room, but a does not serve 'm': the next one waits for b.
    const waiting = scheduler.ticket(req({ reqId: 'waits' })).acquire(first());
    expect(await state(waiting)).toBe('waiting');
    first1!.release();
    expect((await waiting)!.backend.name).toBe('b');
    backends.get('b')!.models = new Set(['other']);
    expect(await scheduler.ticket(req()).acquire(first())).toBeNull();
  });

  it("a backlog of one model does not hide an idle backend from another model's entries behind it", async () => {
    const fcfs = settings({ policy: 'fcfs', concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, backends } = setup(['a', 'b'], fcfs);
    backends.get('a')!.models = new Set(['big']);
    backends.get('b')!.models = new Set(['small']);
    const held = await scheduler.ticket(req({ model: 'big' })).acquire(first());
    expect(held!.backend.name).toBe('a');
    // More waiting for a than a pump ranks before it stops (16 per available backend).
    const backlog = Array.from({ length: 40 }, () =>
      scheduler.ticket(req({ model: 'big' })).acquire(first()),
    );
    const small = await scheduler.ticket(req({ model: 'small' })).acquire(first());
    expect(small!.backend.name).toBe('b');
    held!.release();
    expect((await backlog[0]!)!.backend.name).toBe('a');
  });

  it("predicts a request's queue wait over the backends of its model, not the whole fleet's", async () => {
    const fcfs = settings({ policy: 'fcfs', concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, backends } = setup(['a', 'b'], fcfs);
    backends.get('a')!.models = new Set(['big']);
    backends.get('b')!.models = new Set(['small']);
    const held = await scheduler.ticket(req({ model: 'big' })).acquire(first());
    const backlog = Array.from({ length: 5 }, () => scheduler.ticket(req({ model: 'big' })).acquire(first()));
    // b is free and nothing waits for it: no wait for 'small', whatever 'big' has queued.
    expect(scheduler.estimateWaitMs(req({ model: 'small' }))).toBe(0);
    // b full, a nothing 'small' may use: not 0 (unknown here, no release rate measured yet).
    const onB = await scheduler.ticket(req({ model: 'small' })).acquire(first());
    expect(onB!.backend.name).toBe('b');
    expect(scheduler.estimateWaitMs(req({ model: 'small' }))).toBeNull();
    held!.release();
    for (const p of backlog) (await p)?.release();
    onB!.release();
  });

  /** a serving model 'm' and b model 'other', one slot each. */
  const twoModels = () => {
    const f = setup(['a', 'b'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }));
    f.backends.get('a')!.models = new Set(['m']);
    f.backends.get('b')!.models = new Set(['other']);
    return f;
  };

  it('a queued request whose model loses its last backend gets null at once, not at its expiry', async () => {
    const { scheduler, backends } = twoModels();
    const held = await scheduler.ticket(req()).acquire(first());
    const waiting = scheduler.ticket(req({ reqId: 'orphaned' })).acquire(first());
    expect(await state(waiting)).toBe('waiting');
    // a stops listing 'm' (a refresh of its /v1/models): nothing left may take the request.
    backends.get('a')!.models = new Set(['x']);
    scheduler.pump();
    expect(await state(waiting)).toBeNull();
    held!.release();
  });

  it('so it does with every backend full: the round that cannot rank anything still settles it', async () => {
    const { scheduler, backends } = twoModels();
    const onA = await scheduler.ticket(req()).acquire(first());
    const onB = await scheduler.ticket(req({ model: 'other' })).acquire(first());
    // One waiting for b ahead of one waiting for a: both backends full.
    const other = scheduler.ticket(req({ reqId: 'other', model: 'other' })).acquire(first());
    const waiting = scheduler.ticket(req({ reqId: 'orphaned' })).acquire(first());
    expect(await state(waiting)).toBe('waiting');
    backends.get('a')!.models = new Set(['x']);
    scheduler.pump();
    expect(await state(waiting)).toBeNull();
    expect(await state(other)).toBe('waiting');
    onA!.release();
    onB!.release();
    (await other)?.release();
  });

  it("a backend whose models are held is granted nothing, but its model's requests wait for it", async () => {
    const { scheduler, backends } = twoModels();
    backends.get('b')!.holdModels();
    const waiting = scheduler.ticket(req({ reqId: 'other', model: 'other' })).acquire(first());
    scheduler.pump();
    expect(await state(waiting)).toBe('waiting');
    backends.get('b')!.releaseModels();
    scheduler.pump();
    expect((await waiting)!.backend.name).toBe('b');
  });

  it('a request whose client leaves while queued is out of the queue at once and never granted', async () => {
    const { scheduler } = setup(['a'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }));
    const held = await scheduler.ticket(req()).acquire(first());
    const ac = new Cancel();
    const gone = scheduler.ticket(req({ reqId: 'gone' })).acquire(first(ac));
    const next = scheduler.ticket(req({ reqId: 'next' })).acquire(first());
    expect(scheduler.view().queued).toBe(2);
    ac.abort(new Error('client went away'));
    expect(await state(gone)).toMatchObject({ error: new Error('client went away') });
    expect(scheduler.view().queued).toBe(1);
    held!.release();
    expect((await next)!.backend.name).toBe('a');
  });

  it('with a prefill cap, the next request waits until the backend has prefill room, and nobody passes it there', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 8, prefillTokens: 1000 } });
    const { scheduler, live } = setup(['a'], s);
    const big = await scheduler.ticket(req({ uncachedTokens: 800, promptTokens: 800 })).acquire(first());
    // 800 pending + 300 > 1000: waits, and the small one behind it waits too.
    const second = scheduler
      .ticket(req({ reqId: 'second', uncachedTokens: 300, promptTokens: 300 }))
      .acquire(first());
    const small = scheduler
      .ticket(req({ reqId: 'small', uncachedTokens: 10, promptTokens: 10 }))
      .acquire(first());
    expect(await state(second)).toBe('waiting');
    expect(await state(small)).toBe('waiting');
    expect(live.inflight('a').pendingPrefillTokens).toBe(800);
    // The first token of the big one: its prefill no longer waits, and both go.
    big!.prefillDone();
    const [s2, s3] = [(await second)!, (await small)!];
    expect([s2.backend.name, s3.backend.name]).toEqual(['a', 'a']);
    // A prompt larger than the cap still goes, once nothing else is pending on the backend.
    const huge = scheduler
      .ticket(req({ reqId: 'huge', uncachedTokens: 5000, promptTokens: 5000 }))
      .acquire(first());
    expect(await state(huge)).toBe('waiting');
    s2.prefillDone();
    s3.prefillDone();
    expect((await huge)!.backend.name).toBe('a');
  });

  it("with a prefill cap, a backend held closed by a prompt waiting there for prefill room shows that prompt's prefill as the wait, and a request on time elsewhere goes there", async () => {
    // x holds the prefix; y holds none of it. The router ranks by the slagate cost (no exploration).
    const cost = slagate({ exploreRatio: 0, tolerance: () => null });
    const views = new Map<string, BackendView[]>();
    const router: RoutingPolicy = {
      name: 'recording',
      rank: (r, v) => {
        views.set(r.reqId, [...v]);
        // The cold prompt waits on x whatever its cost (as it would when ranked there).
        if (r.reqId === 'cold') return ['x', 'y'].map((backend) => ({ backend, cost: 0 }));
        return cost.rank(r, v);
      },
      sent: cost.sent,
    };
    const s = settings({
      seeds: false,
      concurrency: { ...settings().concurrency, initial: 8, prefillTokens: 1000 },
    });
    const f = setup(['x', 'y'], s, router, { sharedClock: true });
    f.teach(); // 20 ms + 0.1 ms per prefill token, on both
    const chain = (from: number, k: number) => Array.from({ length: k }, (_, i) => from + i);
    const prefix = chain(1, 100); // 1,600 tokens in blocks of 16
    f.live.prefixInsert('x', prefix);
    const on = (id: string, tokens: number, budget: number, tail: number) =>
      req({
        reqId: id,
        arrivedAt: f.now(),
        deadlineAt: f.now() + 60_000,
        ttftTargetMs: budget,
        promptTokens: tokens,
        uncachedTokens: tokens - 1600,
        route: route({
          reqId: id,
          promptTokens: tokens,
          blocks: [...prefix, ...chain(tail, Math.ceil((tokens - 1600) / 16))],
        }),
      });
    // 900 tokens of prefill under way on x.
    const running = await f.scheduler.ticket(on('running', 2500, 5000, 10_000)).acquire(first());
    expect(running!.backend.name).toBe('x');
    // 3,000 uncached tokens, over the cap: waits on x until nothing is ahead there (x has slots).
    const cold = f.scheduler.ticket(on('cold', 4600, 60_000, 20_000)).acquire(first());
    expect(await state(cold)).toBe('waiting');
    // 100 uncached on x and a 280 ms budget; y would start it now, cold, in 190 ms.
    const warm = f.scheduler.ticket(on('warm', 1700, 280, 30_000)).acquire(first());
    const seen = views.get('warm')!;
    const x = seen.find((v) => v.name === 'x')!;
    expect(x.hasRoom).toBe(false);
    // The cold prompt's 3,000 tokens at 0.1 ms each: x is 300 ms away, not 0.
    expect(x.slotWaitMs).toBeCloseTo(300, 3);
    // So it goes to y now, on time, rather than wait for x and be late once the cold one leaves.
    expect(((await state(warm)) as Slot).backend.name).toBe('y');
    running!.release();
    await cold.then((c) => c?.release());
  });

  it('with a prefill cap, a backend short of slots too shows the later of a slot and the prefill queued ahead', async () => {
    // The control loop's timer by hand: its period measures the rate slots free at.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    cleanups.push(() => vi.useRealTimers());
    const views = new Map<string, BackendView[]>();
    const inner = leastLoaded(() => 0.5);
    const router: RoutingPolicy = {
      name: 'recording',
      rank: (r, v) => {
        views.set(r.reqId, [...v]);
        return inner.rank(r, v);
      },
    };
    const s = settings({
      seeds: false,
      concurrency: { ...settings().concurrency, initial: 1, max: 1, intervalMs: 100, prefillTokens: 1000 },
    });
    // y is there to keep the pump going past the entry waiting for x (it may not use y).
    const f = setup(['x', 'y'], s, router, { sharedClock: true });
    f.teach(); // 20 ms + 0.1 ms per prefill token
    const onX = () => firstExcluding('y');
    // Ten slots freed on x in a second: two more take a few hundred ms at that rate.
    for (let i = 0; i < 10; i++) {
      const slot = await f.scheduler.ticket(req({ arrivedAt: f.now() })).acquire(onX());
      f.tick(100);
      slot!.release();
    }
    vi.advanceTimersByTime(100);
    const running = await f.scheduler.ticket(req({ reqId: 'running', arrivedAt: f.now() })).acquire(onX());
    expect(running!.backend.name).toBe('x');
    // 6,000 uncached tokens wait for x's one slot; then a request that may use either is ranked.
    const cold = f.scheduler
      .ticket(req({ reqId: 'cold', arrivedAt: f.now(), uncachedTokens: 6000, promptTokens: 6000 }))
      .acquire(onX());
    expect(await state(cold)).toBe('waiting');
    const warm = await f.scheduler.ticket(req({ reqId: 'warm', arrivedAt: f.now() })).acquire(first());
    const x = views.get('warm')!.find((v) => v.name === 'x')!;
    expect(x.hasRoom).toBe(false);
    // The cold one's prefill, 600 ms, is later than the two slots (280 ms at the rate measured here).
    expect(x.slotWaitMs).toBeCloseTo(600, 3);
    running!.release();
    (await cold)!.release();
    warm!.release();
  });

  it('with a prefill cap, a backend most of the way through a prompt larger than the cap has room for the next before its first token', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 8, prefillTokens: 1000 } });
    const f = setup(['a'], s);
    f.teach(); // 20 ms + 0.1 ms per prefill token: 10 tokens a millisecond
    const huge = await f.scheduler.ticket(req({ uncachedTokens: 5000, promptTokens: 5000 })).acquire(first());
    const next = f.scheduler
      .ticket(req({ reqId: 'next', uncachedTokens: 300, promptTokens: 300 }))
      .acquire(first());
    expect(await state(next)).toBe('waiting');
    // 300 ms on, 2,000 are left: 2,000 + 300 > 1,000, still no room.
    f.tick(300);
    f.scheduler.pump();
    expect(await state(next)).toBe('waiting');
    // 460 ms on, 400 are left: room for 300 more, though no first token has come back.
    f.tick(160);
    f.scheduler.pump();
    const sent = (await state(next)) as Slot;
    expect(sent.backend.name).toBe('a');
    expect(f.live.inflight('a').pendingPrefillTokens).toBe(5300);
    // A second prompt larger than the cap goes alone: not while any of the others is estimated
    // ahead, and once they are estimated done, before their first tokens are back.
    const huge2 = f.scheduler
      .ticket(req({ reqId: 'huge2', uncachedTokens: 5000, promptTokens: 5000 }))
      .acquire(first());
    f.tick(60);
    f.scheduler.pump();
    expect(f.live.prefillAheadTokens('a')).toBeGreaterThan(0);
    expect(await state(huge2)).toBe('waiting');
    f.tick(1000);
    f.scheduler.pump();
    expect(((await huge2) as Slot).backend.name).toBe('a');
    expect(f.live.inflight('a').pendingPrefillTokens).toBe(10_300);
    for (const s of [huge!, sent, (await huge2)!]) s.release();
  });
});

/** Ranks x first for requests whose id starts with b, y first for the others. */
const bToX: RoutingPolicy = {
  name: 'b-to-x',
  rank: (r, views) => {
    const want = r.reqId.startsWith('b') ? 'x' : 'y';
    return [...views]
      .sort((p, q) => (p.name === want ? 0 : 1) - (q.name === want ? 0 : 1))
      .map((v) => ({ backend: v.name, cost: 0 }));
  },
};

describe("one tenant's run of entries for a busy backend", () => {
  it("does not use up the round's bound: an older entry of a tenant served more goes to the backend it wants, which stood idle", async () => {
    // Tenant b's requests (ids starting with b) want x (busy, one slot); everyone else's want y.
    const f = setup(['x', 'y'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }), bToX);
    const hx = (await f.scheduler.ticket(req({ reqId: 'bx', tenant: 'b' })).acquire(first()))!;
    let hy = (await f.scheduler.ticket(req({ reqId: 'hy', tenant: 'a' })).acquire(first()))!;
    expect([hx.backend.name, hy.backend.name]).toEqual(['x', 'y']);
    // b's first waits for x; meanwhile a is served five more on y: a's counter runs ahead of b's.
    const b0 = f.scheduler.ticket(req({ reqId: 'b0', tenant: 'b' })).acquire(first());
    for (let i = 0; i < 5; i++) {
      const a = f.scheduler.ticket(req({ reqId: `a${i}`, tenant: 'a' })).acquire(first());
      hy.release();
      hy = (await state(a)) as Slot;
      expect(hy.backend.name).toBe('y');
    }
    // a's older entry, then a run of 40 of b's for x: b, served less, comes first in the order.
    const aOld = f.scheduler.ticket(req({ reqId: 'aOld', tenant: 'a' })).acquire(first());
    const bs = Array.from({ length: 40 }, (_, i) =>
      f.scheduler.ticket(req({ reqId: `b${i + 1}`, tenant: 'b' })).acquire(first()),
    );
    expect(await state(aOld)).toBe('waiting');
    // y frees its slot: the pump passes b's run over (x is busy) and reaches a's entry, which goes.
    hy.release();
    const got = await state(aOld);
    expect(got).not.toBe('waiting');
    expect((got as Slot).backend.name).toBe('y');
    expect(await state(b0)).toBe('waiting');
    (got as Slot).release();
    hx.release();
    for (const p of [b0, ...bs])
      void p.then(
        (s) => s?.release(),
        () => {},
      );
  });
});

describe("one tenant's run of entries put off", () => {
  it('never lets a less urgent class ahead: with one tenant, the 21st interactive entry takes the backend that frees, not a batch entry behind it', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 1 } });
    const f = setup(['x', 'y'], s, bToX);
    const hx = (await f.scheduler.ticket(req({ reqId: 'bx' })).acquire(first()))!;
    const hy = (await f.scheduler.ticket(req({ reqId: 'hy' })).acquire(first()))!;
    expect([hx.backend.name, hy.backend.name]).toEqual(['x', 'y']);
    const forX = Array.from({ length: 20 }, (_, i) =>
      f.scheduler.ticket(req({ reqId: `b${i}` })).acquire(first()),
    );
    const mine = f.scheduler.ticket(req({ reqId: 'i21' })).acquire(first());
    const batch = Array.from({ length: 3 }, (_, i) =>
      f.scheduler.ticket(req({ reqId: `low${i}`, className: 'batch', priority: 1 })).acquire(first()),
    );
    expect(await state(mine)).toBe('waiting');
    hy.release();
    const got = await state(mine);
    expect(got).not.toBe('waiting');
    expect((got as Slot).backend.name).toBe('y');
    for (const p of batch) expect(await state(p)).toBe('waiting');
    (got as Slot).release();
    hx.release();
    for (const p of [...forX, ...batch])
      void p.then(
        (x) => x?.release(),
        () => {},
      );
  });

  it('never hides the entry a pump must reach: a request of that tenant that may not wait is still judged, and starts where there is room', async () => {
    // Ids starting with b want x (busy); the others want y (free).
    const f = setup(['x', 'y'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }), bToX);
    const hx = (await f.scheduler.ticket(req({ reqId: 'bx', tenant: 'b' })).acquire(first()))!;
    expect(hx.backend.name).toBe('x');
    const run = Array.from({ length: 40 }, (_, i) =>
      f.scheduler.ticket(req({ reqId: `b${i}`, tenant: 'b' })).acquire(first()),
    );
    // Of the same tenant and class, behind the run, and y idle: its pump goes past the run to it.
    const hurry = await state(
      f.scheduler.ticket(req({ reqId: 'nq', tenant: 'b', noQueue: true })).acquire(first()),
    );
    expect(hurry).not.toBe('waiting');
    expect((hurry as Slot).backend.name).toBe('y');
    (hurry as Slot).release();
    hx.release();
    for (const p of run)
      void p.then(
        (s) => s?.release(),
        () => {},
      );
  });
});

describe('an entry that leaves the queue', () => {
  it('opens what it held closed at once: the entry behind it, waiting for the same backend, is granted', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 8, prefillTokens: 1000 } });
    const { scheduler } = setup(['a'], s);
    const running = await scheduler.ticket(req({ uncachedTokens: 800, promptTokens: 800 })).acquire(first());
    // 800 pending: the large one waits for prefill room, and the small one behind it (which would
    // fit) waits because nobody passes the large one there.
    const cancel = new Cancel();
    const large = scheduler
      .ticket(req({ reqId: 'large', uncachedTokens: 3000, promptTokens: 3000 }))
      .acquire(first(cancel));
    const small = scheduler
      .ticket(req({ reqId: 'small', uncachedTokens: 100, promptTokens: 100 }))
      .acquire(first());
    expect(await state(small)).toBe('waiting');
    // The large one's client leaves: the small one goes now, not at the next first token or tick.
    cancel.abort(new Error('client gone'));
    await large.catch(() => null);
    expect(((await state(small)) as Slot).backend.name).toBe('a');
    running!.release();
  });
});

describe('a reload that lowers concurrency.max', () => {
  it('holds at its own pump, not from the next control period on', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 8 } });
    const f = setup(['a'], s);
    const held = await Promise.all(
      Array.from({ length: 2 }, () => f.scheduler.ticket(req()).acquire(first())),
    );
    f.set(settings({ concurrency: { ...settings().concurrency, initial: 8, min: 1, max: 3 } }));
    const more = Array.from({ length: 4 }, (_, i) =>
      f.scheduler.ticket(req({ reqId: `m${i}` })).acquire(first()),
    );
    const states = await Promise.all(more.map((m) => state(m)));
    // 2 running, the new max 3: one more, the other three wait.
    expect(states.filter((x) => x === 'waiting')).toHaveLength(3);
    // What the limit's readers are shown is the limit dispatch obeys, from the reload on.
    expect(f.scheduler.limit('a')).toBe(3);
    expect(f.scheduler.view().backends.find((b) => b.name === 'a')!.limit).toBe(3);
    f.set(settings({ concurrency: { ...settings().concurrency, initial: 8, min: 12, max: 20 } }));
    expect(f.scheduler.limit('a')).toBe(12);
    for (const h of held) h!.release();
  });
});

describe('a backend whose breaker is half-open', () => {
  it('is granted its one trial, not as many waiting entries as its limit has room for', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 4 } });
    const f = setup(['a', 'b'], s, undefined, { breakerResetMs: 50 });
    const a = f.backends.get('a')!;
    a.breaker.open();
    // b is full; three entries wait while a's breaker is open.
    const held = await Promise.all(
      Array.from({ length: 4 }, () => f.scheduler.ticket(req()).acquire(first())),
    );
    expect(held.map((x) => x!.backend.name)).toEqual(['b', 'b', 'b', 'b']);
    const waiting = ['w1', 'w2', 'w3'].map((id) => f.scheduler.ticket(req({ reqId: id })).acquire(first()));
    for (const w of waiting) expect(await state(w)).toBe('waiting');
    await new Promise((r) => a.breaker.once('halfOpen', r));
    f.scheduler.pump();
    const states = await Promise.all(waiting.map((w) => state(w)));
    expect(states.filter((x) => x === 'waiting')).toHaveLength(2);
    const trial = states.find((x) => x !== 'waiting') as Slot;
    expect(trial.backend.name).toBe('a');
    // Until the trial ends, a takes no other; once it ends without reaching the breaker, the next goes.
    f.scheduler.pump();
    expect((await Promise.all(waiting.map((w) => state(w)))).filter((x) => x === 'waiting')).toHaveLength(2);
    trial.release();
    expect((await Promise.all(waiting.map((w) => state(w)))).filter((x) => x === 'waiting')).toHaveLength(1);
    for (const h of held) h!.release();
  });

  it('with every breaker half-open and each trial out, a request waits for the trials instead of finding no backend', async () => {
    const f = setup(['a', 'b'], settings(), undefined, { breakerResetMs: 50 });
    const breakers = ['a', 'b'].map((n) => f.backends.get(n)!.breaker);
    for (const b of breakers) b.open();
    // Every breaker open: nowhere to go, at once.
    expect(await state(f.scheduler.ticket(req({ reqId: 'while-open' })).acquire(first()))).toBeNull();
    await Promise.all(breakers.map((b) => new Promise((r) => b.once('halfOpen', r))));
    const trials = await Promise.all(
      ['t1', 't2'].map((id) => f.scheduler.ticket(req({ reqId: id })).acquire(first())),
    );
    expect(trials.map((t) => t!.backend.name).sort()).toEqual(['a', 'b']);
    // Both trials out: the next request waits for them, not null (503 no_healthy_backend).
    const next = f.scheduler.ticket(req({ reqId: 'next' })).acquire(first());
    expect(await state(next)).toBe('waiting');
    f.scheduler.pump();
    expect(await state(next)).toBe('waiting');
    // A trial that succeeds closes its breaker; at the pump that follows (the gateway pumps at every
    // change of a breaker: src/gateway.ts) the next is granted there.
    breakers[0]!.close();
    f.scheduler.pump();
    const granted = (await state(next)) as Slot;
    expect(granted.backend.name).toBe('a');
    // Another waits for b's trial, which fails and opens b's breaker again, as a's does: with every
    // breaker open, the one waiting gets null at that pump, and a new request at once.
    const waiting = f.scheduler.ticket(req({ reqId: 'waiting' })).acquire(firstExcluding('a'));
    expect(await state(waiting)).toBe('waiting');
    breakers[1]!.open();
    f.scheduler.pump();
    expect(await state(waiting)).toBeNull();
    breakers[0]!.open();
    expect(await state(f.scheduler.ticket(req({ reqId: 'after' })).acquire(first()))).toBeNull();
    for (const t of trials) t!.release();
    granted.release();
  });
});

describe('refusals while waiting', () => {
  it("queue full: a tenant's request takes the place of the worst entry of the tenant that holds the most", async () => {
    const s = settings({ maxQueue: 3, concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, refused } = setup(['a'], s);
    await scheduler.ticket(req({ tenant: 'a' })).acquire(first());
    const held = [0, 1, 2].map((i) =>
      scheduler.ticket(req({ reqId: `a${i}`, tenant: 'a' })).acquire(first()),
    );
    // Tenant a's own next request is refused: it holds the whole queue already.
    expect(await state(scheduler.ticket(req({ reqId: 'a3', tenant: 'a' })).acquire(first()))).toMatchObject({
      error: { code: 'queue_full' },
    });
    // Tenant b's is queued, in place of a's worst-placed entry (refused as b's enters: both read
    // in the same turn, so that no refusal goes unheard).
    const b = scheduler.ticket(req({ reqId: 'b0', tenant: 'b' })).acquire(first());
    const [victim, queued] = await Promise.all([state(held[2]!), state(b)]);
    expect(victim).toMatchObject({
      error: {
        code: 'queue_full',
        message: expect.stringMatching(/its tenant held more of it than another tenant/),
      },
    });
    expect(queued).toBe('waiting');
    expect(await state(held[0]!)).toBe('waiting');
    expect(refused).toEqual(['a3:queue_full', 'a2:queue_full']);
  });

  it('queue full: the entries behind a victim are looked at again at once, as after a cancel', async () => {
    const s = settings({
      maxQueue: 1,
      concurrency: { ...settings().concurrency, initial: 8, prefillTokens: 1000 },
    });
    const { scheduler } = setup(['a'], s);
    const big = await scheduler.ticket(req({ uncachedTokens: 800, promptTokens: 800 })).acquire(first());
    // A sheddable entry waits for prefill room on a (800 pending + 300 > 1000), closing a to
    // those behind it.
    const victim = scheduler
      .ticket(req({ reqId: 'v', sheddable: true, uncachedTokens: 300, promptTokens: 300 }))
      .acquire(first());
    expect(await state(victim)).toBe('waiting');
    // A protected request of a lower priority queues behind it, though a has room for its 10
    // tokens, and takes its place in the full queue.
    const next = scheduler
      .ticket(req({ reqId: 'w', priority: 10, uncachedTokens: 10, promptTokens: 10 }))
      .acquire(first());
    const [evicted, got] = await Promise.all([state(victim), state(next)]);
    expect(evicted).toMatchObject({ error: { code: 'queue_full' } });
    // Without the victim, a is open to it: it goes now, not at the next event.
    expect((got as Slot).backend.name).toBe('a');
    (got as Slot).release();
    big!.release();
  });

  it('queue full: a protected request evicts the worst sheddable one; a sheddable one is refused', async () => {
    const s = settings({ maxQueue: 2, concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, refused } = setup(['a'], s);
    await scheduler.ticket(req()).acquire(first());
    const batch = scheduler
      .ticket(req({ reqId: 'batch', className: 'batch', priority: 2, sheddable: true }))
      .acquire(first());
    const queued = scheduler.ticket(req({ reqId: 'queued' })).acquire(first());
    // Full (2 waiting): another sheddable request is refused at once.
    const more = await state(
      scheduler
        .ticket(req({ reqId: 'more', className: 'batch', priority: 2, sheddable: true }))
        .acquire(first()),
    );
    expect(more).toMatchObject({ error: { code: 'queue_full', status: 429 } });
    // A protected one takes the sheddable one's place.
    const protectedReq = scheduler.ticket(req({ reqId: 'protected' })).acquire(first());
    expect(await state(batch)).toMatchObject({ error: { code: 'queue_full' } });
    expect(await state(protectedReq)).toBe('waiting');
    expect(await state(queued)).toBe('waiting');
    expect(refused).toEqual(['more:queue_full', 'batch:queue_full']);
    // Now full of protected requests: the next protected one is refused.
    expect(await state(scheduler.ticket(req({ reqId: 'late' })).acquire(first()))).toMatchObject({
      error: { code: 'queue_full', retryAfterS: 1 },
    });
  });

  it('queue full: a protected request that will not wait (no-queue) evicts nobody', async () => {
    const s = settings({ maxQueue: 1, concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, refused } = setup(['a'], s);
    await scheduler.ticket(req()).acquire(first());
    const batch = scheduler
      .ticket(req({ reqId: 'batch', className: 'batch', priority: 2, sheddable: true }))
      .acquire(first());
    const hurry = await state(scheduler.ticket(req({ reqId: 'hurry', noQueue: true })).acquire(first()));
    expect(hurry).toMatchObject({
      error: { code: 'queue_full', message: expect.stringContaining('x-slagate-no-queue') },
    });
    // The sheddable request keeps its place: the one that refused to wait took none.
    expect(await state(batch)).toBe('waiting');
    expect(refused).toEqual(['hurry:queue_full']);
  });

  it("a reload that changes the queue's policy moves the waiting entries at its pump, keyed as the new policy keys them", async () => {
    const fcfs = settings({ policy: 'fcfs', concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, set } = setup(['a'], fcfs);
    const held = await scheduler.ticket(req()).acquire(first());
    // Under fcfs the batch request, first in, would go first.
    const served: string[] = [];
    const wait = (id: string, over: Partial<ScheduledRequest> = {}) =>
      scheduler
        .ticket(req({ reqId: id, ...over }))
        .acquire(first())
        .then((slot) => {
          served.push(id);
          return slot;
        });
    const batch = wait('batch', { className: 'batch', priority: 2 });
    const interactive = wait('interactive');
    expect(scheduler.view().policy).toBe('fcfs');
    set(settings({ ...fcfs, policy: 'slagate' }));
    scheduler.pump();
    expect(scheduler.view()).toMatchObject({ policy: 'slagate', queued: 2 });
    // Under slagate a class of priority 2 waits 2 × aging_ms behind the interactive one.
    held!.release();
    (await interactive)!.release();
    (await batch)!.release();
    expect(served).toEqual(['interactive', 'batch']);
  });

  describe('a reload that changes the order of a slagate queue keys the waiting entries again', () => {
    const order = (over: Partial<SchedulerSettings>) =>
      settings({
        priorities: new Map([
          ['interactive', 0],
          ['batch', 2],
        ]),
        concurrency: { ...settings().concurrency, initial: 1 },
        ...over,
      });
    /** One held slot, and a way to queue requests behind it that records the order they are served in. */
    async function behindOne(f: ReturnType<typeof setup>) {
      const held = await f.scheduler.ticket(req()).acquire(first());
      const served: string[] = [];
      const waiting: Promise<void>[] = [];
      return {
        wait(id: string, over: Partial<ScheduledRequest>) {
          const p = f.scheduler
            .ticket(req({ reqId: id, ...over }))
            .acquire(first())
            .then((slot) => {
              served.push(id);
              slot!.release();
            });
          waiting.push(p);
        },
        async drain() {
          held!.release();
          await Promise.all(waiting);
          return served;
        },
      };
    }
    const batch = { className: 'batch', priority: 2 };

    it('a class made as urgent as another no longer waits out its old aging offset behind it', async () => {
      const f = setup(['a'], order({}));
      const q = await behindOne(f);
      q.wait('batch', batch);
      q.wait('interactive', {});
      // batch, first in, ranked 2 × aging_ms behind; the reload puts both classes at priority 0.
      f.set(
        order({
          priorities: new Map([
            ['interactive', 0],
            ['batch', 0],
          ]),
        }),
      );
      f.scheduler.pump();
      expect(await q.drain()).toEqual(['batch', 'interactive']);
    });

    it("keeps what each tenant has been served: the heavy tenant does not take the light one's turns", async () => {
      const f = setup(['a'], order({}));
      const held = await f.scheduler.ticket(req()).acquire(first());
      const served: string[] = [];
      const all: Promise<void>[] = [];
      const wait = (id: string, tenant: string, uncachedTokens: number, then?: () => void) =>
        all.push(
          f.scheduler
            .ticket(req({ reqId: id, tenant, uncachedTokens }))
            .acquire(first())
            .then((slot) => {
              served.push(id);
              then?.();
              slot!.release();
            }),
        );
      // Once a1 is served, tenant A has been served 100 times B's work to come: B's five go first.
      // The reload (a class added) comes while a1 holds the slot.
      wait('a1', 'A', 10_000, () => {
        f.set(
          order({
            priorities: new Map([
              ['interactive', 0],
              ['batch', 2],
              ['new', 1],
            ]),
          }),
        );
        f.scheduler.pump();
      });
      wait('a2', 'A', 10_000);
      for (let i = 1; i <= 5; i++) wait(`b${i}`, 'B', 100);
      held!.release();
      await Promise.all(all);
      expect(served).toEqual(['a1', 'b1', 'b2', 'b3', 'b4', 'b5', 'a2']);
    });

    it("a shorter aging_ms does not let a class's new entries pass its old ones", async () => {
      const f = setup(['a'], order({ agingMs: 60_000 }));
      const q = await behindOne(f);
      q.wait('old', batch);
      f.set(order({ agingMs: 1 }));
      // Keyed now at 2 × 1 ms: before the reload's keys moved, it would pass the old entry's 2 × 60 s.
      q.wait('new', batch);
      expect(await q.drain()).toEqual(['old', 'new']);
    });
  });

  it("x-slagate-no-queue is judged however long the backlog ahead of it: a backend idle behind the pump's bound takes it", async () => {
    // Every queued request waits for `a` (ranked first, busy); `b` idles. A pump ranks at most 16
    // waiting entries per backend before it stops; the request that may not wait is 41st.
    const aFirst = rankingFirst('a');
    const { scheduler } = setup(
      ['a', 'b'],
      settings({ concurrency: { ...settings().concurrency, initial: 1 } }),
      aFirst,
    );
    const held = await scheduler.ticket(req()).acquire(first());
    expect(held!.backend.name).toBe('a');
    const waiting = Array.from({ length: 40 }, () => scheduler.ticket(req()).acquire(first()));
    expect(scheduler.view().queued).toBe(40);
    const slot = await scheduler.ticket(req({ reqId: 'hurry', noQueue: true })).acquire(first());
    expect(slot?.backend.name).toBe('b');
    // Those ahead still wait for `a`: none was passed for it.
    expect(await Promise.all(waiting.map(state))).toEqual(waiting.map(() => 'waiting'));
    expect(scheduler.view().queued).toBe(40);
  });

  it("a request that meets a full queue is judged by its pump, however long the backlog: a backend idle behind the pump's bound takes it", async () => {
    // Every queued request waits for `a` (ranked first for them, busy); `b` idles, and is the
    // first choice of the request that comes when the queue is full. A pump ranks at most 16
    // waiting entries per backend before it stops; that request is the 41st.
    const byRequest: RoutingPolicy = {
      name: 'fresh-on-b',
      rank: (r, views) => {
        const firstChoice = r.reqId === 'fresh' ? 'b' : 'a';
        const rankOf = (v: BackendView) => (v.name === firstChoice ? 0 : 1);
        return [...views].sort((x, y) => rankOf(x) - rankOf(y)).map((v) => ({ backend: v.name, cost: 0 }));
      },
    };
    const { scheduler } = setup(
      ['a', 'b'],
      settings({ maxQueue: 40, concurrency: { ...settings().concurrency, initial: 1 } }),
      byRequest,
    );
    const held = await scheduler.ticket(req()).acquire(first());
    expect(held!.backend.name).toBe('a');
    const waiting = Array.from({ length: 40 }, () => scheduler.ticket(req()).acquire(first()));
    expect(scheduler.view().queued).toBe(40);
    // Not refused queue_full (one tenant, nothing to give way) while b idles: started there.
    const slot = await scheduler.ticket(req({ reqId: 'fresh' })).acquire(first());
    expect(slot?.backend.name).toBe('b');
    expect(await Promise.all(waiting.map(state))).toEqual(waiting.map(() => 'waiting'));
    expect(scheduler.view().queued).toBe(40);
  });

  it('a request that meets a full queue with no backend open to it is not reached past the bound: its pump ranks no more than any other', async () => {
    // a (busy) serves the model; b, with room, serves another one only. 40 wait for a.
    let ranks = 0;
    const counting: RoutingPolicy = {
      name: 'counting',
      rank: (_r, views) => {
        ranks++;
        return views.map((v) => ({ backend: v.name, cost: 0 }));
      },
    };
    const f = setup(
      ['a', 'b'],
      settings({ maxQueue: 40, concurrency: { ...settings().concurrency, initial: 1 } }),
      counting,
    );
    f.backends.get('a')!.learned(new Set(['m']));
    f.backends.get('b')!.learned(new Set(['other']));
    const held = await f.scheduler.ticket(req()).acquire(first());
    expect(held!.backend.name).toBe('a');
    const waiting = Array.from({ length: 40 }, () => f.scheduler.ticket(req()).acquire(first()));
    expect(f.scheduler.view().queued).toBe(40);
    ranks = 0;
    expect(await state(f.scheduler.ticket(req({ reqId: 'more' })).acquire(first()))).toMatchObject({
      error: { code: 'queue_full' },
    });
    // Its pump stopped at the bound (16 passes per backend), as the pumps before it did.
    expect(ranks).toBeLessThanOrEqual(32);
    expect(await Promise.all(waiting.map(state))).toEqual(waiting.map(() => 'waiting'));
    held!.release();
  });

  it('x-slagate-no-queue (and max_queue 0) refuse what cannot be dispatched at once', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 1 } });
    const { scheduler, set } = setup(['a'], s);
    expect(await scheduler.ticket(req({ noQueue: true })).acquire(first())).not.toBeNull();
    expect(await state(scheduler.ticket(req({ noQueue: true })).acquire(first()))).toMatchObject({
      error: { code: 'queue_full', message: expect.stringContaining('x-slagate-no-queue') },
    });
    set(settings({ maxQueue: 0, concurrency: { ...s.concurrency } }));
    expect(await state(scheduler.ticket(req()).acquire(first()))).toMatchObject({
      error: { code: 'queue_full', message: expect.stringContaining('max_queue is 0') },
    });
    expect(scheduler.view().queued).toBe(0);
  });

  describe('the guard timer', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    /** One backend of one slot, held, on a shared fake clock: what a request queued now waits behind. */
    async function oneSlotHeld() {
      vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
      const s = settings({ concurrency: { ...settings().concurrency, initial: 1 } });
      const f = setup(['a'], s, undefined, { sharedClock: true });
      const held = await f.scheduler.ticket(req()).acquire(first());
      return { f, held, t0: f.now() };
    }

    /** Still waiting 1 ms before `ms` on the shared clock and its timers, refused queue_timeout at `ms`. */
    async function refusedAfter(f: ReturnType<typeof setup>, late: Promise<Slot | null>, ms: number) {
      f.tick(ms - 1);
      vi.advanceTimersByTime(ms - 1);
      expect(await state(late)).toBe('waiting');
      f.tick(1);
      vi.advanceTimersByTime(1);
      expect(await state(late)).toMatchObject({ error: { code: 'queue_timeout' } });
    }

    it('a request still queued at its latest start is refused queue_timeout, not served late', async () => {
      const { f, held, t0 } = await oneSlotHeld();
      // Target 300 ms, predicted 100 ms to first token once dispatched: it must start within 200 ms.
      const late = f.scheduler
        .ticket(
          req({
            reqId: 'late',
            arrivedAt: t0,
            deadlineAt: t0 + 60_000,
            ttftTargetMs: 300,
            bestBackendMs: 100,
          }),
        )
        .acquire(first());
      await refusedAfter(f, late, 200);
      expect(f.scheduler.view().queued).toBe(0);
      held!.release();
    });

    it("a class target longer than the request's deadline does not keep it queued past the deadline", async () => {
      const { f, held, t0 } = await oneSlotHeld();
      // A 120 s target, but the request's deadline (first_token_timeout_ms from arrival) is 150 ms.
      const late = f.scheduler
        .ticket(req({ reqId: 'late', arrivedAt: t0, ttftTargetMs: 120_000, deadlineAt: t0 + 150 }))
        .acquire(first());
      await refusedAfter(f, late, 150);
      held!.release();
    });
  });

  it('at the head of the queue, a request its backend would now serve past its target is refused, not sent', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 1 } });
    const f = setup(['a'], s);
    f.teach(); // dispatch → first token = 20 ms + 0.1 ms per uncached token
    const held = await f.scheduler.ticket(req()).acquire(first());
    const t0 = performance.now();
    // Predicted fast at arrival (the guard timer would let it wait up to its target), but on the
    // backend it gets, 5,000 uncached tokens take about 520 ms against a 300 ms target.
    const long = f.scheduler
      .ticket(req({ reqId: 'long', arrivedAt: t0, ttftTargetMs: 300, bestBackendMs: 0, promptTokens: 5000 }))
      .acquire(first());
    const short = f.scheduler
      .ticket(req({ reqId: 'short', arrivedAt: t0, ttftTargetMs: 300, bestBackendMs: 0, promptTokens: 100 }))
      .acquire(first());
    expect(f.scheduler.view().queued).toBe(2);
    held!.release();
    // Refused at once (within this turn of the event loop), not when its guard timer would fire.
    expect(await state(long)).toMatchObject({ error: { code: 'queue_timeout' } });
    // The slot went to the one that can still make it.
    const slot = await short;
    expect(slot).not.toBeNull();
    expect(f.refused).toContain('long:queue_timeout');
    slot!.release();
  });

  it("a request its router's first choice would serve late goes to the next backend that can serve it on time", async () => {
    // A router with a fixed order, as the slagate tie-break (room now) or exploration may rank a
    // backend first whatever this request's time there.
    let order = ['a', 'b', 'c'];
    const sent: string[] = [];
    const fixed: RoutingPolicy = {
      name: 'fixed',
      rank: (_r, views) =>
        [...views]
          .sort((x, y) => order.indexOf(x.name) - order.indexOf(y.name))
          .map((v) => ({ backend: v.name, cost: 0 })),
      sent: (r, backend) => sent.push(`${r.reqId}:${backend}`),
    };
    const f = setup(
      ['a', 'b', 'c'],
      settings({ concurrency: { ...settings().concurrency, initial: 4 } }),
      fixed,
    );
    f.teach(); // dispatch → first token = 20 ms + 0.1 ms per uncached token, prefill waiting there included
    const prefilling = async (on: string) => {
      order = [on, ...['a', 'b', 'c'].filter((n) => n !== on)];
      const slot = await f.scheduler.ticket(req({ promptTokens: 5000 })).acquire(first());
      expect(slot!.backend.name).toBe(on);
      return slot!;
    };
    // a is prefilling 5,000 tokens: a request sent there now waits about 500 ms for its first token.
    const held = [await prefilling('a')];
    order = ['a', 'b', 'c'];
    const ticket = f.scheduler.ticket(
      req({ reqId: 'x', arrivedAt: performance.now(), ttftTargetMs: 300, bestBackendMs: 30 }),
    );
    const onTime = await ticket.acquire(first());
    expect(onTime!.backend.name).toBe('b');
    // The router is told where it went; the log keeps the router's own order.
    expect(sent).toContain('x:b');
    expect(ticket.lastGrant?.candidates.map((c) => c.backend)).toEqual(['a', 'b', 'c']);
    onTime!.release();
    // b at its limit, with no measured rate of freeing slots: a wait there is not planned on.
    order = ['b', 'a', 'c'];
    const full = [];
    for (let i = 0; i < 4; i++) full.push((await f.scheduler.ticket(req()).acquire(first()))!);
    expect(full.every((h) => h.backend.name === 'b')).toBe(true);
    order = ['a', 'b', 'c'];
    const past = await f.scheduler
      .ticket(req({ reqId: 'z', arrivedAt: performance.now(), ttftTargetMs: 300, bestBackendMs: 30 }))
      .acquire(first());
    expect(past!.backend.name).toBe('c');
    past!.release();
    for (const h of full) h.release();
    // When every backend would be late, it is refused at once.
    held.push(await prefilling('b'), await prefilling('c'));
    order = ['a', 'b', 'c'];
    const late = f.scheduler
      .ticket(req({ reqId: 'y', arrivedAt: performance.now(), ttftTargetMs: 300, bestBackendMs: 30 }))
      .acquire(first());
    expect(await state(late)).toMatchObject({ error: { code: 'queue_timeout' } });
    expect(f.refused).toEqual(['y:queue_timeout']);
    for (const h of held) h.release();
  });

  it('teaches the TTFT fit at each first token, while the requests are still streaming', async () => {
    const f = setup(['a'], settings({ concurrency: { ...settings().concurrency, initial: 8 } }), undefined, {
      sharedClock: true,
    });
    expect(f.live.predictTtftMs('a', 1000)).toBeNull();
    const slots: Slot[] = [];
    for (const tokens of [200, 1000, 3000, 600, 2000]) {
      const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 };
      const slot = (await f.scheduler.ticket(req({ ...at, promptTokens: tokens })).acquire(first()))!;
      f.tick(20 + 0.1 * tokens); // its first token: 20 ms + 0.1 ms per uncached token after dispatch
      slot.prefillDone();
      slots.push(slot);
    }
    // None has ended (a generation takes seconds), and the fit already has their first tokens.
    expect(f.live.predictTtftMs('a', 1000)).not.toBeNull();
    expect(f.live.prefillMs('a', 1000)).toBeGreaterThan(50);
    for (const s of slots) s.release();
  });

  describe('the P99 of how predictions turned out', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    it('counts a near-zero prediction as the fastest first tokens, so it cannot inflate every other', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a'], s, undefined, { sharedClock: true });
      // A fit with a negative intercept: dispatch → first token = 0.1 ms per uncached token − 10 ms.
      teachBelowZero(f);
      // 95 requests of 1,000 tokens predicted (90 ms) and served exactly; 5 of 110 tokens predicted
      // at 1 ms that take 60 ms, as no first token comes faster.
      for (let i = 0; i < 100; i++) {
        const small = i % 20 === 0;
        const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 };
        const slot = await f.scheduler
          .ticket(req({ ...at, promptTokens: small ? 110 : 1000 }))
          .acquire(first());
        f.tick(small ? 60 : 90);
        slot!.prefillDone();
        slot!.release();
      }
      vi.advanceTimersByTime(100);
      // Taken as 60 / 1 = 60×, the five would make every 90 ms prediction plan for 5.4 s. (The fit
      // learns each of these first tokens too, so the five move it a little and the later
      // predictions are within a few percent of 90 ms, not exactly it.)
      expect(f.scheduler.upperBackendMs('a', 90)).toBeGreaterThanOrEqual(90);
      expect(f.scheduler.upperBackendMs('a', 90)).toBeLessThan(95);
      expect(f.scheduler.upperBackendMs('a', 1)).toBeGreaterThanOrEqual(60);
      expect(f.scheduler.upperBackendMs('a', 1)).toBeLessThan(64);
      expect(f.scheduler.predictionSpread()).toBeLessThan(0.05);
    });

    it('reads the first tokens of the last five minutes: a burst of late ones older than that no longer sets it', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a'], s, undefined, { sharedClock: true });
      f.teach(); // dispatch → first token = 20 ms + 0.1 ms per uncached token: 120 ms for 1,000
      const serve = async (n: number, ms: (i: number) => number) => {
        for (let i = 0; i < n; i++) {
          const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 };
          const slot = await f.scheduler.ticket(req({ ...at, promptTokens: 1000 })).acquire(first());
          f.tick(ms(i));
          slot!.prefillDone();
          slot!.release();
        }
        vi.advanceTimersByTime(100);
      };
      // Five of 100 first tokens come 2.5 times as late as predicted: they set the P99.
      await serve(100, (i) => (i % 20 === 0 ? 300 : 120));
      expect(f.scheduler.upperBackendMs('a', 120)).toBeGreaterThan(240);
      // Five minutes later, 10 on time: too few for a P99 of its own (100 in the window), nor for
      // the fleet's alone, which then reads its last 50, two late ones among them.
      f.tick(301_000);
      await serve(10, () => 120);
      expect(f.scheduler.upperBackendMs('a', 120)).toBeGreaterThan(240);
      // 90 more (still far fewer than the 1,024 the ring keeps): the late ones are out of the
      // window, and the P99 is of these.
      await serve(90, () => 120);
      expect(f.scheduler.upperBackendMs('a', 120)).toBeLessThan(130);
    });

    it("plans each backend on its own P99 while 100 of its own came in the window, on the fleet's otherwise", async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a', 'b'], s, undefined, { sharedClock: true });
      f.teach(['a', 'b']); // dispatch → first token = 20 ms + 0.1 ms per uncached token: 120 ms for 1,000
      const serve = async (on: string, n: number, ms: (i: number) => number) => {
        for (let i = 0; i < n; i++) {
          const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 };
          const other = on === 'a' ? 'b' : 'a';
          const slot = await f.scheduler
            .ticket(req({ ...at, promptTokens: 1000 }))
            .acquire(firstExcluding(other));
          expect(slot!.backend.name).toBe(on);
          f.tick(ms(i));
          slot!.prefillDone();
          slot!.release();
        }
        vi.advanceTimersByTime(100);
      };
      const own = (name: string) => f.scheduler.view().backends.find((b) => b.name === name)!.planMultiplier;
      // On a, five of 100 first tokens come 2.5 times as late as predicted; on b, 60 come on time.
      await serve('a', 100, (i) => (i % 20 === 0 ? 300 : 120));
      await serve('b', 60, () => 120);
      // b has too few of its own: it is planned on the fleet's P99, which a's late ones set.
      expect(own('b')).toBeNull();
      expect(f.scheduler.planning().multiplier).toBeGreaterThan(2);
      expect(f.scheduler.upperBackendMs('b', 120)).toBeGreaterThan(240);
      await serve('b', 40, () => 120);
      // With 100 of its own, b plans on them; a still on its own late ones, and so does the fleet.
      expect(own('b')).toBeLessThan(1.05);
      expect(f.scheduler.upperBackendMs('b', 120)).toBeLessThan(130);
      expect(own('a')).toBeGreaterThan(2);
      expect(f.scheduler.upperBackendMs('a', 120)).toBeGreaterThan(240);
      expect(f.scheduler.planning().multiplier).toBeGreaterThan(2);
      // Five minutes on, a has had no traffic and b 60 on time: a's own 100 are all older than the
      // window, so it plans on the fleet's, which holds b's fresh ones, not on its old late ones.
      f.tick(301_000);
      await serve('b', 60, () => 120);
      expect(own('a')).toBeNull();
      expect(f.scheduler.upperBackendMs('a', 120)).toBeLessThan(130);
    });
  });

  it("learns no first token as waiting before the backend's prefill fit: a cold start does not cut its limit", async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a'], s, undefined, { sharedClock: true });
      // One request stays running; 12 others take 0.1 ms per prompt token to their first token
      // (cold prefills of 1,000 to 3,000 tokens, 100 to 300 ms) against a 500 ms target: up to
      // 0.6 of it, over the 0.25 share, were it waiting.
      await f.scheduler.ticket(req()).acquire(first());
      for (let i = 0; i < 12; i++) {
        const tokens = 3000 - 500 * (i % 5);
        const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000, ttftTargetMs: 500 };
        const slot = await f.scheduler
          .ticket(req({ ...at, promptTokens: tokens, uncachedTokens: tokens }))
          .acquire(first());
        f.tick(0.1 * tokens);
        slot!.prefillDone();
        slot!.release();
      }
      vi.advanceTimersByTime(100);
      // Once fitted, the same first tokens are their prefill: nothing waited, the limit holds.
      expect(f.scheduler.view().backends[0]!.limit).toBe(64);
    } finally {
      vi.useRealTimers();
    }
  });

  it('learns no first token as waiting while its fit cannot tell the prefill rate: prompts all of about one size', async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a'], s, undefined, { sharedClock: true });
      // One request stays running; 12 prompts of 2,000 tokens each have their first token in the
      // 220 ms their prefill takes: the fit's rate is 0, its intercept 220 ms, and nothing waited.
      await f.scheduler.ticket(req()).acquire(first());
      const serve = async (ms: (tokens: number) => number, n: number, tokens: (i: number) => number) => {
        for (let i = 0; i < n; i++) {
          const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000, ttftTargetMs: 500 };
          const t = tokens(i);
          const slot = await f.scheduler
            .ticket(req({ ...at, promptTokens: t, uncachedTokens: t }))
            .acquire(first());
          f.tick(ms(t));
          slot!.prefillDone();
          slot!.release();
        }
        vi.advanceTimersByTime(100);
      };
      const limit = () => f.scheduler.view().backends[0]!.limit;
      await serve(
        () => 220,
        12,
        () => 2000,
      );
      expect(f.live.prefillMs('a', 1)).toBe(0);
      expect(f.live.prefillRateTold('a')).toBe(false);
      expect(limit()).toBe(64);
      // One prompt 5% longer, 1 ms slower: the fit has a rate now, next to nothing, and its
      // intercept still holds the prefill. Nothing waited: the limit holds.
      await serve(
        (t) => (t === 2100 ? 221 : 220),
        12,
        (i) => (i === 0 ? 2100 : 2000),
      );
      expect(f.live.prefillMs('a', 1)).toBeGreaterThan(0);
      expect(f.live.prefillRateTold('a')).toBe(false);
      expect(limit()).toBe(64);
      // Prompts of 1,000 to 3,000 tokens, each waiting 200 ms past its prefill (0.4 of the target,
      // over its 0.25 share): the rate is told, and the limit comes down.
      await serve(
        (t) => 0.1 * t + 200,
        24,
        (i) => 1000 + 500 * (i % 5),
      );
      expect(f.live.prefillRateTold('a')).toBe(true);
      expect(limit()).toBeLessThan(64);
    } finally {
      vi.useRealTimers();
    }
  });

  it('a request large for its class may wait until its budget, not its class target', async () => {
    const { scheduler } = setup(['a'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }));
    await scheduler.ticket(req()).acquire(first());
    // Both arrived a second ago with a 300 ms target; one is large for its class (budget 60 s).
    const arrivedAt = performance.now() - 1000;
    const normal = scheduler
      .ticket(req({ reqId: 'normal', arrivedAt, ttftTargetMs: 300, bestBackendMs: 0 }))
      .acquire(first());
    const late = scheduler
      .ticket(req({ reqId: 'late', arrivedAt, ttftTargetMs: 300, ttftBudgetMs: 60_000, bestBackendMs: 0 }))
      .acquire(first());
    await expect(normal).rejects.toMatchObject({ code: 'queue_timeout' });
    expect(await state(late)).toBe('waiting');
  });

  it('a retry still queued at the request deadline gets null (the attempt loop then gives up)', async () => {
    const { scheduler } = setup(
      ['a', 'b'],
      settings({ concurrency: { ...settings().concurrency, initial: 1 } }),
    );
    await scheduler.ticket(req()).acquire(first());
    await scheduler.ticket(req()).acquire(first());
    const retry = scheduler
      .ticket(req({ deadlineAt: performance.now() + 100 }))
      .acquire({ attempt: 1, excluded: new Set(['a']), signal: new Cancel() });
    expect(await retry).toBeNull();
  });
});

describe('the control loop and the estimates', () => {
  it('grows a binding limit while the backend decodes fast, and feeds the limit view', async () => {
    const s = settings({ concurrency: { ...settings().concurrency, initial: 2, intervalMs: 50 } });
    const { scheduler } = setup(['a'], s);
    const slots = await Promise.all([1, 2].map(() => scheduler.ticket(req()).acquire(first())));
    // Demand waits behind the limit; the running streams report 10 ms gaps (target 50 ms).
    const waiting = [1, 2, 3].map(() => scheduler.ticket(req()).acquire(first()));
    const feed = setInterval(() => {
      pace(slots[0]!.meter!, 20, 10);
    }, 10);
    try {
      const granted = await Promise.all(waiting);
      expect(granted.every((g) => g !== null)).toBe(true);
      expect(scheduler.limit('a')).toBeGreaterThanOrEqual(5);
      expect(scheduler.view().backends[0]).toMatchObject({ name: 'a', inflight: 5 });
    } finally {
      clearInterval(feed);
    }
  });

  describe('the outer loop (tpot_share)', () => {
    // Two inner periods per outer step; the control timer is faked so each period is one call.
    const outer = () =>
      settings({ concurrency: { ...settings().concurrency, initial: 2, intervalMs: 100, outerPeriods: 2 } });
    const period = () => vi.advanceTimersByTime(100);
    /** One outer period: two inner ones. */
    const outerStep = () => {
      period();
      period();
    };
    const share = (f: ReturnType<typeof setup>) => f.scheduler.view().backends[0]!.tpotShare;
    /** `n` completed requests on `a` with TPOT `ratio` × their 50 ms target. */
    const complete = (f: ReturnType<typeof setup>, n: number, ratio: number) => {
      for (let i = 0; i < n; i++) f.scheduler.ticket(req()).completed('a', 50 * ratio);
    };
    /** A scheduler with one request running on `a` (1 of 2: the limit does not bind). */
    const oneRunning = async (s = outer()) => {
      const f = setup(['a'], s);
      await f.scheduler.ticket(req()).acquire(first());
      return f;
    };
    afterEach(() => {
      vi.useRealTimers();
    });

    it('lowers the share when the P99 TPOT is above 95% of the target, bound or not', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = await oneRunning();
      complete(f, 60, 1.5);
      outerStep();
      expect(share(f)).toBeCloseTo(0.8 * (1 + 0.1 * (1 - 1.5 / 0.95)), 9);
    });

    it('does not raise the share on fast completions while the backend has room', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = await oneRunning();
      complete(f, 60, 0.4);
      for (let i = 0; i < 6; i++) period();
      expect(share(f)).toBe(0.8);
    });

    it('raises the share on fast completions while the backend is held at its limit near the setpoint', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(['a'], outer());
      const slots = await Promise.all([1, 2].map(() => f.scheduler.ticket(req()).acquire(first())));
      // Demand waits behind the limit, and the decode pace is 90% of the setpoint (0.8 × 50 ms).
      for (let i = 0; i < 30; i++) void f.scheduler.ticket(req()).acquire(first());
      complete(f, 60, 0.4);
      for (let i = 0; i < 2; i++) {
        pace(slots[0]!.meter!, 20, 0.9 * 0.8 * 50);
        period();
      }
      expect(share(f)).toBeCloseTo(0.8 * (1 + 0.1 * (1 - 0.4 / 0.95)), 9);
    });

    it("a reload that gives the name another server starts it from the initial share, and the old one's completions do not count for it", async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(['a'], outer());
      const old = f.scheduler.ticket(req());
      expect((await old.acquire(first()))!.backend.url).toBe('http://127.0.0.1:9');
      complete(f, 60, 1.5);
      outerStep();
      expect(share(f)).toBeLessThan(0.8);
      // The reload: `a` is another server now; the request granted on the old one still runs.
      void f.backends.update([{ name: 'a', url: 'http://127.0.0.1:19' }]);
      period();
      expect(share(f)).toBe(0.8);
      // The old server's request ends, slow, sixty times over: nothing of it reaches the new one.
      for (let i = 0; i < 60; i++) old.completed('a', 50 * 1.5);
      outerStep();
      expect(share(f)).toBe(0.8);
      // The new server's own slow completions do.
      const fresh = f.scheduler.ticket(req());
      expect((await fresh.acquire(first()))!.backend.url).toBe('http://127.0.0.1:19');
      for (let i = 0; i < 60; i++) fresh.completed('a', 50 * 1.5);
      outerStep();
      expect(share(f)).toBeLessThan(0.8);
    });

    it('reaches back past four outer periods for the fifty completions its P99 needs, but not past 24', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      // A backend that completes few requests: 30 slow ones, five outer periods with none, 30 more.
      // The window then spans six outer periods, so the step is 4/6 of the usual one.
      const lowered = 0.8 * (1 + (4 / 6) * 0.1 * (1 - 1.5 / 0.95));
      const f = await oneRunning();
      complete(f, 30, 1.5);
      for (let i = 0; i < 2 * 5; i++) period();
      expect(share(f)).toBe(0.8);
      complete(f, 30, 1.5);
      outerStep();
      expect(share(f)).toBeCloseTo(lowered, 9);
      // The same with 23 outer periods between them: the window holds 24, and moves.
      const h = await oneRunning();
      complete(h, 30, 1.5);
      for (let i = 0; i < 2 * 23; i++) period();
      complete(h, 30, 1.5);
      outerStep();
      expect(share(h)).toBeLessThan(0.8);
      // With 24 between them, the first 30 have left the window.
      const g = await oneRunning();
      complete(g, 30, 1.5);
      for (let i = 0; i < 2 * 24; i++) period();
      complete(g, 30, 1.5);
      outerStep();
      expect(share(g)).toBe(0.8);
    });

    it('judges a backend that completes many on its last four outer periods', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = await oneRunning();
      // One outer period of slow completions, then fast ones, 60 a period: the slow ones lower the
      // share while they are in the window (four steps), and not after.
      complete(f, 60, 1.5);
      outerStep();
      for (let step = 0; step < 3; step++) {
        complete(f, 60, 0.4);
        outerStep();
      }
      const after = share(f);
      expect(after).toBeCloseTo(0.8 * (1 + 0.1 * (1 - 1.5 / 0.95)) ** 4, 9);
      for (let step = 0; step < 2; step++) {
        complete(f, 60, 0.4);
        outerStep();
      }
      expect(share(f)).toBe(after);
    });

    it('does not judge a reload to slagate on completions from the fixed limit of fcfs', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = await oneRunning({ ...outer(), policy: 'fcfs' });
      complete(f, 60, 1.5);
      period();
      f.set(outer());
      complete(f, 60, 0.4);
      outerStep();
      expect(share(f)).toBe(0.8);
    });

    it('under fcfs, after a reload from slagate, shows no control error and no share: no loop runs', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(['a'], outer());
      const slots = await Promise.all([1, 2].map(() => f.scheduler.ticket(req()).acquire(first())));
      pace(slots[0]!.meter!, 20, 0.9 * 0.8 * 50);
      period();
      expect(f.scheduler.view().backends[0]!.error).toBeCloseTo(0.9, 1);
      f.set({ ...outer(), policy: 'fcfs' });
      // At once, before any control step under fcfs, and after one.
      expect(f.scheduler.view().backends[0]).toMatchObject({ error: null, tpotShare: null });
      pace(slots[0]!.meter!, 20, 0.9 * 0.8 * 50);
      period();
      expect(f.scheduler.view().backends[0]).toMatchObject({ error: null, tpotShare: null });
      // Back under slagate, the loop measures again from its next step.
      f.set(outer());
      pace(slots[0]!.meter!, 20, 0.9 * 0.8 * 50);
      period();
      expect(f.scheduler.view().backends[0]).toMatchObject({ tpotShare: 0.8 });
      expect(f.scheduler.view().backends[0]!.error).toBeCloseTo(0.9, 1);
    });

    it('needs fifty completions in its window before it moves', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = await oneRunning();
      complete(f, 49, 1.5);
      outerStep();
      expect(share(f)).toBe(0.8);
    });
  });

  describe('the decode pace the limit sets', () => {
    const period = () => vi.advanceTimersByTime(100);
    afterEach(() => {
      vi.useRealTimers();
    });
    const paced = async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(
        ['a'],
        settings({ concurrency: { ...settings().concurrency, initial: 4, intervalMs: 100 } }),
      );
      const slots = await Promise.all([1, 2, 3, 4].map(() => f.scheduler.ticket(req()).acquire(first())));
      return { f, meter: slots[0]!.meter! };
    };

    it('a few slow steps (long prefill chunks) do not lower the limit while the typical step is fast', async () => {
      const { f, meter } = await paced();
      // The setpoint is 0.8 × 50 ms = 40 ms. Twenty decode steps of 20 ms and two of 250 ms that
      // carried a long prompt's chunks: their mean, 40.9 ms, is over the setpoint, under the target.
      pace(meter, 20, 20);
      pace(meter, 2, 250);
      period();
      expect(f.scheduler.limit('a')).toBeGreaterThan(4);
    });

    it('slow steps that make the mean gap longer than the TPOT target lower it, whatever the median', async () => {
      const { f, meter } = await paced();
      // Mean (400 + 1,200) / 22 = 72.7 ms against the 50 ms target: the average request is late.
      pace(meter, 20, 20);
      pace(meter, 2, 600);
      period();
      expect(f.scheduler.limit('a')).toBeCloseTo(4 / (72.7 / 50), 1);
    });

    /** A backend at limit 8 whose fit is taught, its loop run by `period()`, on the live state's clock. */
    const taughtAt8 = () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(
        ['a'],
        settings({ concurrency: { ...settings().concurrency, initial: 8, intervalMs: 100 } }),
        undefined,
        { sharedClock: true },
      );
      f.teach(); // first token = 20 + 0.1 ms per prompt token: 120 ms for 1,000
      return f;
    };

    it("takes no decode step off a first token's wait once the window has no gap: a step of a batch that left is not today's", async () => {
      const f = taughtAt8();
      // A long chat with a lax TPOT target: its 45 ms steps move nothing.
      const running = await f.scheduler
        .ticket(req({ arrivedAt: f.now(), deadlineAt: f.now() + 60_000, tpotTargetMs: 1000 }))
        .acquire(first());
      pace(running!.meter!, 20, 45);
      period();
      expect(f.scheduler.limit('a')).toBe(8);
      // Then no decode step for four periods: the window holds no gap.
      for (let i = 0; i < 4; i++) period();
      // Twelve one-token answers, each 150 ms past its 120 ms prefill: 0.3 of the 500 ms target,
      // over the 0.25 share. Less two stale 45 ms steps it would read 0.12, and hold.
      for (let i = 0; i < 12; i++) {
        const at = {
          arrivedAt: f.now(),
          deadlineAt: f.now() + 60_000,
          ttftTargetMs: 500,
          tpotTargetMs: 1000,
        };
        const slot = await f.scheduler
          .ticket(req({ ...at, promptTokens: 1000, uncachedTokens: 1000 }))
          .acquire(first());
        f.tick(120 + 150);
        slot!.prefillDone();
        slot!.release();
      }
      period();
      expect(f.scheduler.limit('a')).toBeLessThan(8);
      running!.release();
    });

    it("judges each class's first tokens on their own: a few with a tight target are not lost among many with a lax one", async () => {
      const f = taughtAt8();
      const running = await f.scheduler
        .ticket(req({ arrivedAt: f.now(), deadlineAt: f.now() + 600_000, tpotTargetMs: 1000 }))
        .acquire(first());
      const serve = async (ttftTargetMs: number, waitMs: number) => {
        const at = { arrivedAt: f.now(), deadlineAt: f.now() + 600_000, ttftTargetMs, tpotTargetMs: 1000 };
        const slot = await f.scheduler
          .ticket(req({ ...at, promptTokens: 1000, uncachedTokens: 1000 }))
          .acquire(first());
        f.tick(120 + waitMs);
        slot!.prefillDone();
        slot!.release();
      };
      // 20 interactive first tokens 300 ms past their prefill (0.6 of their 500 ms target, over the
      // 0.25 share), then 200 batch ones a second past it (a thirtieth of their 30 s target).
      // Pooled, the P90 is a batch one's (the interactive ones are 9% of the 220), and the limit
      // would hold. (The interactive ones come first: after the batch ones the guard would plan
      // them at the batch's ratio of actual to predicted, and refuse them.)
      for (let i = 0; i < 20; i++) await serve(500, 300);
      for (let i = 0; i < 200; i++) await serve(30_000, 1000);
      period();
      expect(f.scheduler.limit('a')).toBeLessThan(8);
      running!.release();
    });

    it('takes its signal over the last four periods together', async () => {
      const { f, meter } = await paced();
      // Five gaps a period: too few to act on (16) over three periods, enough over four.
      for (let i = 0; i < 3; i++) {
        pace(meter, 5, 60);
        period();
        expect(f.scheduler.limit('a')).toBe(4);
      }
      pace(meter, 5, 60);
      period();
      // The median is read to within its histogram bin (5%).
      expect(Math.abs(f.scheduler.limit('a') / (4 / 1.5) - 1)).toBeLessThan(0.05);
    });

    it('steps from the batch its signal was measured on when traffic ebbs, not from the one request left', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(
        ['a'],
        settings({ concurrency: { ...settings().concurrency, initial: 8, intervalMs: 100 } }),
      );
      const slots = await Promise.all(
        Array.from({ length: 8 }, () => f.scheduler.ticket(req()).acquire(first())),
      );
      const meter = slots[0]!.meter!;
      // 8 running, steps of 60 ms against the 40 ms setpoint (e = 1.5): 8 / 1.5.
      pace(meter, 20, 60);
      period();
      expect(Math.abs(f.scheduler.limit('a') / (8 / 1.5) - 1)).toBeLessThan(0.05);
      // Seven end; the one left decodes at the same pace through the next period. The window's
      // signal was measured on 8 and then on 4.5 (the period's two ends), 20 gaps each: a batch of
      // 6.25. From the one request left, the step would have been to the minimum (1 / 1.5).
      for (const s of slots.slice(1)) s!.release();
      pace(meter, 20, 60);
      period();
      expect(Math.abs(f.scheduler.limit('a') / (6.25 / 1.5) - 1)).toBeLessThan(0.05);
    });

    it('a typical step over the setpoint lowers it', async () => {
      const { f, meter } = await paced();
      pace(meter, 20, 60);
      pace(meter, 6, 5);
      period();
      expect(Math.abs(f.scheduler.limit('a') / (4 / 1.5) - 1)).toBeLessThan(0.05);
    });
  });

  describe('periods with nothing to free, and waits the limit does not cause', () => {
    const period = () => vi.advanceTimersByTime(100);
    afterEach(() => {
      vi.useRealTimers();
    });

    it('keeps the rate slots free at through an idle spell, rather than learn that they free slowly', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(
        ['a'],
        settings({ concurrency: { ...settings().concurrency, initial: 4, intervalMs: 100 } }),
      );
      const slots = await Promise.all([1, 2, 3, 4].map(() => f.scheduler.ticket(req()).acquire(first())));
      for (const slot of slots) slot!.release();
      period();
      const busy = f.scheduler.view().releasesPerS;
      expect(busy).toBeGreaterThan(0);
      // Five seconds with nothing in flight: nothing could free, which says nothing of the rate.
      for (let i = 0; i < 50; i++) period();
      expect(f.scheduler.view().releasesPerS).toBe(busy);
      // Nor does a peer instance's request in flight: its release is never counted here.
      const peer = f.live.lease('a', { promptTokens: 1, expectedOutputTokens: 1 });
      for (let i = 0; i < 50; i++) period();
      expect(f.scheduler.view().releasesPerS).toBe(busy);
      peer.end();
      // Nor one long stream of its own, with slots to spare and nobody waiting.
      const long = await f.scheduler.ticket(req()).acquire(first());
      for (let i = 0; i < 50; i++) period();
      expect(f.scheduler.view().releasesPerS).toBe(busy);
      // Every slot held and a request waiting, and none frees: that does say slots free slowly.
      const held = await Promise.all([1, 2, 3].map(() => f.scheduler.ticket(req()).acquire(first())));
      void f.scheduler.ticket(req()).acquire(first());
      for (let i = 0; i < 5; i++) period();
      expect(f.scheduler.view().releasesPerS!).toBeLessThan(busy! / 2);
      long!.release();
      for (const slot of held) slot!.release();
    });

    it('does not wind a limit up while requests wait for prefill room with slots free', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const f = setup(
        ['a'],
        settings({
          concurrency: { ...settings().concurrency, initial: 4, intervalMs: 100, prefillTokens: 1000 },
        }),
      );
      const big = await f.scheduler.ticket(req({ uncachedTokens: 900, promptTokens: 900 })).acquire(first());
      // 900 + 500 prefill tokens are over the room: this one waits, with 3 of 4 slots free.
      void f.scheduler.ticket(req({ uncachedTokens: 500, promptTokens: 500 })).acquire(first());
      for (let i = 0; i < 12; i++) {
        // A decode pace far under the setpoint, which would grow a limit that binds.
        pace(big!.meter!, 20, 10);
        period();
      }
      expect(f.scheduler.limit('a')).toBe(4);
    });
  });

  it("a refusal's Retry-After in a fleet of several models is its model's drain, not the fleet's", async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const s = settings({ concurrency: { ...settings().concurrency, initial: 1, max: 1, intervalMs: 100 } });
      const f = setup(['a', 'b'], s, undefined, { sharedClock: true });
      f.backends.get('a')!.models = new Set(['big']);
      f.backends.get('b')!.models = new Set(['small']);
      const at = (model: string) => req({ model, arrivedAt: f.now(), deadlineAt: f.now() + 60_000 });
      // In one control period b frees ten slots, a two.
      for (let i = 0; i < 12; i++) {
        const slot = await f.scheduler.ticket(at(i < 10 ? 'small' : 'big')).acquire(first());
        f.tick(50);
        slot!.release();
      }
      vi.advanceTimersByTime(100);
      // a's one slot held, five waiting for it.
      const held = await f.scheduler.ticket(at('big')).acquire(first());
      for (let i = 0; i < 5; i++) void f.scheduler.ticket(at('big')).acquire(first());
      const fleet = f.scheduler.drainMs()!;
      const big = f.scheduler.drainMs('big')!;
      // Five at a's two slots in the period, against the fleet's twelve: six times as long.
      expect(big / fleet).toBeCloseTo(6, 6);
      // Nothing waits for b.
      expect(f.scheduler.drainMs('small')).toBe(0);
      held!.release();
    } finally {
      vi.useRealTimers();
    }
  });

  it('estimates no wait when a backend has room, and none it cannot measure', async () => {
    const { scheduler } = setup(['a'], settings({ concurrency: { ...settings().concurrency, initial: 1 } }));
    expect(scheduler.estimateWaitMs(req())).toBe(0);
    await scheduler.ticket(req()).acquire(first());
    // Full, and no slot has been released yet: the drain rate is unknown, so is the wait.
    expect(scheduler.estimateWaitMs(req())).toBeNull();
    expect(scheduler.drainMs()).toBeNull();
  });
});

describe('routing at grant time: the prefix index and the slagate cost', () => {
  const chain = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
  // 100 blocks of 16 tokens: a 1,600-token shared prefix, then 100 tokens of question.
  const prefix = chain(1, 100);
  let question = 0;
  /** The shared prefix and a question of its own (6 blocks no other request has). */
  const ask = (id: string, over: Partial<ScheduledRequest> = {}) => {
    const blocks = [...prefix, ...chain(10_000 + 10 * question++, 6)];
    return req({
      reqId: id,
      promptTokens: 1700,
      route: route({ reqId: id, promptTokens: 1700, blocks }),
      ...over,
    });
  };
  const cost = slagate({ exploreRatio: 0, tolerance: () => null });
  const grantOf = async (f: ReturnType<typeof setup>, r: ScheduledRequest) => {
    const slot = await f.scheduler.ticket(r).acquire(first());
    return slot!.backend.name;
  };

  /** A router that ranks in the given order and keeps every view it was shown. */
  const recording = () => {
    const seen: BackendView[] = [];
    const recorder: RoutingPolicy = {
      name: 'recorder',
      rank: (_r, views) => {
        seen.push(...views);
        return views.map((v) => ({ backend: v.name, cost: 0 }));
      },
    };
    return { seen, recorder };
  };

  it('tells the router the TPOT the fit learnt for a request sent at the load it finds now', async () => {
    const { seen, recorder } = recording();
    const f = setup(['a'], settings({ concurrency: { ...settings().concurrency, initial: 8 } }), recorder);
    // A request that found L others running decoded at 10 + 2·L ms per token.
    for (let i = 0; i < 30; i++) {
      f.tick(10);
      const load = i % 6;
      observe(f.live, latencySample({ backend: 'a', loadAtDispatch: load, tpotMs: 10 + 2 * load }));
    }
    const held = [];
    for (let i = 0; i < 3; i++) held.push((await f.scheduler.ticket(req()).acquire(first()))!);
    seen.length = 0;
    held.push((await f.scheduler.ticket(req()).acquire(first()))!);
    // It finds 3 running: TPOT(3), not TPOT(4).
    expect(seen.map((v) => v.inflight)).toEqual([3]);
    expect(seen[0]!.tpotMs).toBeCloseTo(16, 6);
    for (const h of held) h.release();
  });

  it('tells the router how full the index believes each cache is', async () => {
    const { seen, recorder } = recording();
    const f = setup(['a', 'b'], settings(), recorder);
    f.live.prefixInsert('a', prefix);
    await grantOf(f, ask('fill'));
    const fill = Object.fromEntries(seen.map((v) => [v.name, v.cacheFill]));
    expect(fill).toEqual({ a: 100 / DEFAULT_CAPACITY, b: 0 });
  });

  it('sends a prompt where its prefix is held, counts only the uncached part, and inserts it where it went', async () => {
    const f = setup(['a', 'b'], settings({ concurrency: { ...settings().concurrency, initial: 8 } }), cost);
    f.teach();
    f.live.prefixInsert('a', prefix);
    const t = f.scheduler.ticket(ask('q1'));
    const slot = await t.acquire(first());
    expect(slot!.backend.name).toBe('a');
    // 1,600 of 1,700 tokens held: prefix hit 1600/1700, predicted 20 + 0.1 × 100 ms.
    expect(t.lastGrant).toMatchObject({ cachedBlocks: 100, cachedTokens: 1600, uncachedTokens: 100 });
    expect(slot!.prefixHit).toBeCloseTo(1600 / 1700, 9);
    expect(f.live.inflight('a').pendingPrefillTokens).toBe(100);
    // The whole prompt is now in a's index.
    expect(f.live.prefixMatch('a', t.req.route.blocks)).toBe(106);
    expect(f.live.prefixMatch('b', t.req.route.blocks)).toBe(0);
  });

  it("gives an attempt time to prefill the cached part too, should it be gone: a cold prefill is no backend's failure", async () => {
    const f = setup(['a', 'b'], settings({ concurrency: { ...settings().concurrency, initial: 8 } }), cost);
    f.teach(); // dispatch → first token = 20 ms + 0.1 ms per uncached token
    f.live.prefixInsert('a', prefix);
    const t = f.scheduler.ticket(ask('held', { ttftTargetMs: 100, ttftBudgetMs: 60_000 }));
    const slot = await t.acquire(first());
    expect(t.lastGrant).toMatchObject({ backend: 'a', cachedTokens: 1600, uncachedTokens: 100 });
    // Predicted 20 + 0.1 × 100 = 30 ms as cached; 4 × that is 120 ms, over the 100 ms target: the
    // timeout was 120 ms. With the 1,600 cached tokens' prefill added, once: 120 + 160 ms.
    expect(slot!.firstTokenTimeoutMs).toBeCloseTo(4 * 30 + 0.1 * 1600, 0);
    // Nothing cached: the allowance on the prediction alone, as before.
    const cold = f.scheduler.ticket(
      req({
        reqId: 'cold',
        ttftTargetMs: 100,
        ttftBudgetMs: 60_000,
        promptTokens: 1000,
        uncachedTokens: 1000,
      }),
    );
    const coldSlot = await cold.acquire(first());
    expect(coldSlot!.firstTokenTimeoutMs).toBeCloseTo(4 * (20 + 0.1 * 1000), 0);
  });

  it('inserts no blocks hashed at a block size the index no longer holds (a reload while it queued)', async () => {
    let size = 16;
    const f = setup(['a', 'b'], settings(), cost, { blockSizeTokens: () => size });
    const before = ask('old', {
      route: route({ reqId: 'old', promptTokens: 1700, blocks: [...prefix], blockSizeTokens: 16 }),
    });
    size = 64;
    expect(await grantOf(f, before)).toMatch(/^[ab]$/);
    expect(f.live.prefixSize('a').blocks + f.live.prefixSize('b').blocks).toBe(0);
    const after = ask('new', {
      route: route({ reqId: 'new', promptTokens: 1700, blocks: [...prefix], blockSizeTokens: 64 }),
    });
    const to = await grantOf(f, after);
    expect(f.live.prefixMatch(to, prefix)).toBe(prefix.length);
  });

  it('spreads a hot prefix once its backend is predicted slower than a cold one', async () => {
    const f = setup(['a', 'b'], settings({ concurrency: { ...settings().concurrency, initial: 8 } }), cost);
    f.teach();
    f.live.prefixInsert('a', prefix);
    expect(await grantOf(f, ask('hot-1'))).toBe('a');
    // Prefill piling up on a: 20 + 0.1 × (100 + 100 + 1600) = 200 ms there, 190 ms on b cold.
    f.live.lease('a', { promptTokens: 1600, expectedOutputTokens: 1, uncachedPromptTokens: 1600 });
    const hot2 = await f.scheduler.ticket(ask('hot-2')).acquire(first());
    expect(hot2!.backend.name).toBe('b');
    // b holds the prefix now too; once hot-2's prefill is done there, b is the cheaper warm one.
    hot2!.prefillDone();
    expect(await grantOf(f, ask('hot-3'))).toBe('b');
  });

  it('a request late everywhere, its prefix held on one busy backend, seeds an idle one rather than be refused; once', async () => {
    const seeded = async (policy: 'slagate' | 'fcfs') => {
      const f = setup(
        ['a', 'b', 'c'],
        settings({ policy, concurrency: { ...settings().concurrency, initial: 8 } }),
        cost,
      );
      f.teach();
      f.live.prefixInsert('a', prefix);
      // 2,000 tokens of another prompt still prefilling on a: warm there, 20 + 0.1 × (100 + 2,000)
      // = 230 ms; cold on b or c, 190 ms; the target 150 ms.
      f.live.lease('a', { promptTokens: 2000, expectedOutputTokens: 1, uncachedPromptTokens: 2000 });
      const ticket = f.scheduler.ticket(ask('late', { ttftTargetMs: 150 }));
      return { f, ticket, got: await state(ticket.acquire(first())) };
    };
    const { f, ticket, got } = await seeded('slagate');
    expect((got as Slot).backend.name).toBe('b');
    expect(ticket.lastGrant!.seed).toBe(true);
    // The prefix has two homes now: the next such request is refused, not sent to seed a third.
    expect(
      await state(f.scheduler.ticket(ask('next', { ttftTargetMs: 150 })).acquire(first())),
    ).toMatchObject({
      error: { code: 'queue_timeout' },
    });
    // Under fcfs nothing seeds.
    expect((await seeded('fcfs')).got).toMatchObject({ error: { code: 'queue_timeout' } });
  });

  it('a backend whose first few samples fit a free prefill does not draw every cold prompt', async () => {
    const f = setup(
      ['a', 'b', 'c'],
      settings({ concurrency: { ...settings().concurrency, initial: 8 } }),
      cost,
    );
    // a and b: 20 samples of several sizes, 20 ms + 0.1 ms per uncached token.
    f.teach(['a', 'b']);
    // c: three prompts of one size, a little faster than a and b. Alone they fit a flat line at
    // 150 ms, and any prefill on c would cost nothing, however much is already waiting there.
    for (let i = 0; i < 3; i++) {
      f.tick(10);
      observe(
        f.live,
        latencySample({
          backend: 'c',
          uncachedPromptTokens: 1700,
          queueMs: 0,
          ttftMs: 150,
          loadAtDispatch: 0,
        }),
      );
    }
    f.tick(100);
    // Six cold prompts (nothing of them held anywhere), none prefilled yet: the prefill waiting on
    // a backend grows with each one sent there.
    const went: string[] = [];
    for (let i = 0; i < 6; i++) {
      const id = `cold-${i}`;
      const blocks = chain(50_000 + 1000 * i, 106);
      went.push(
        await grantOf(
          f,
          req({
            reqId: id,
            promptTokens: 1700,
            uncachedTokens: 1700,
            route: route({ reqId: id, promptTokens: 1700, blocks }),
          }),
        ),
      );
    }
    const on = (b: string) => went.filter((x) => x === b).length;
    expect(on('c')).toBeLessThanOrEqual(3);
    expect(on('a')).toBeGreaterThanOrEqual(1);
    expect(on('b')).toBeGreaterThanOrEqual(1);
  });

  describe('busy backends: the wait for a slot is part of the cost', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    /**
     * Two backends with one slot each, fits taught, the shared prefix held on a, a release rate of
     * 10 slots in 0.9 s measured there (a control period), and a's one slot taken.
     */
    async function busy(router: RoutingPolicy, maxQueue?: number) {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const s = settings({
        concurrency: { ...settings().concurrency, initial: 1, max: 1, intervalMs: 100 },
        ...(maxQueue === undefined ? {} : { maxQueue }),
      });
      const f = setup(['a', 'b'], s, router, { sharedClock: true });
      // Arrived now on the scheduler's clock (the fixture's, moved by tick).
      const at = () => ({ arrivedAt: f.now(), deadlineAt: f.now() + 60_000 });
      f.teach(); // 0.4 s of the clock
      f.live.prefixInsert('a', prefix);
      for (let i = 0; i < 10; i++) {
        const slot = await f.scheduler.ticket(ask(`r${i}`, at())).acquire(first());
        f.tick(50);
        slot!.release();
      }
      vi.advanceTimersByTime(100);
      const held = await f.scheduler.ticket(ask('held', at())).acquire(first());
      if (held!.backend.name !== 'a') throw new Error('the fixture wants a busy');
      return { f, held: held!, at };
    }

    /** A 1,700-token prompt no backend holds. */
    const heldNowhere = (at: { arrivedAt: number; deadlineAt: number }) =>
      req({
        reqId: 'cold',
        promptTokens: 1700,
        route: route({ reqId: 'cold', promptTokens: 1700, blocks: chain(50_000, 106) }),
        ...at,
      });

    it('a request waits for the busy backend holding its prefix, while one with nothing cached goes where a slot is free', async () => {
      const { f, held, at } = await busy(cost);
      // On a: a slot in 0.9 s / 10 = 90 ms, then 20 + 0.1 × (100 + 100 waiting) = 40 ms, and its
      // prefill's stall of the one running there, 10 ms; on b now: a cold 1,700-token prefill,
      // 190 ms. It waits for a.
      const warm = f.scheduler.ticket(ask('warm', at())).acquire(first());
      expect(await state(warm)).toBe('waiting');
      // A prompt held nowhere is cheaper on b at once than behind `warm` on a: it passes `warm`.
      const cold = await f.scheduler.ticket(heldNowhere(at())).acquire(first());
      expect(cold!.backend.name).toBe('b');
      expect(await state(warm)).toBe('waiting');
      held.release();
      const slot = await warm;
      expect(slot!.backend.name).toBe('a');
      expect(slot!.prefixHit).toBeCloseTo(1600 / 1700, 9);
    });

    it('a full queue refuses no request a backend starts at once; one that must wait, it does', async () => {
      const { f, at } = await busy(cost, 1);
      // The queue's one place: `warm`, waiting for a.
      const warm = f.scheduler.ticket(ask('warm', at())).acquire(first());
      expect(await state(warm)).toBe('waiting');
      // A prompt held nowhere starts on b at once.
      const cold = await f.scheduler.ticket(heldNowhere(at())).acquire(first());
      expect(cold!.backend.name).toBe('b');
      // Both busy now: another request would wait, and the queue is full.
      expect(await state(f.scheduler.ticket(ask('late', at())).acquire(first()))).toMatchObject({
        error: { code: 'queue_full' },
      });
      cold!.release();
      expect(await state(warm)).toBe('waiting');
      // One that may not wait takes b's free slot, the queue full or not.
      const hurry = await f.scheduler.ticket(ask('hurry', { ...at(), noQueue: true })).acquire(first());
      expect(hurry!.backend.name).toBe('b');
    });

    it('a request that may not wait (x-slagate-no-queue) takes the free slot rather than be refused', async () => {
      const { f, at } = await busy(cost);
      const slot = await f.scheduler.ticket(ask('hurry', { ...at(), noQueue: true })).acquire(first());
      expect(slot!.backend.name).toBe('b');
    });

    it('the baselines dispatch at once where a slot is free, as the routers they copy do', async () => {
      const { f, at } = await busy(leastLoaded(() => 0.5));
      const warm = await f.scheduler.ticket(ask('warm', at())).acquire(first());
      expect(warm!.backend.name).toBe('b');
    });
  });

  it('an aged-out prefix stops attracting requests', async () => {
    const f = setup(['a', 'b'], settings({ concurrency: { ...settings().concurrency, initial: 8 } }), cost);
    f.teach();
    f.live.prefixInsert('a', prefix);
    // a runs a little more than b: without the prefix, b is the cheaper.
    f.live.lease('a', { promptTokens: 50, expectedOutputTokens: 1, uncachedPromptTokens: 50 });
    expect(await grantOf(f, ask('before'))).toBe('a');
    // More than a backend's worth of other prompts (16,384 blocks until its KV size is known).
    for (let i = 0; i < 20; i++) f.live.prefixInsert('a', chain(100_000 + i * 1000, 1000));
    expect(f.live.prefixMatch('a', prefix)).toBe(0);
    expect(await grantOf(f, ask('after'))).toBe('b');
  });

  describe('a prefix the index counted on was gone', () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    // The fit the fixture teaches: dispatch → first token = 20 ms + 0.1 ms per uncached token. With
    // 1,600 of `ask`'s 1,700 tokens held, a request is predicted at 30 ms; prefilled cold, the
    // cached part adds 160 ms.
    async function serve(
      f: ReturnType<typeof setup>,
      firstTokenMs: (i: number) => number,
      n: number,
      target = 60_000,
    ) {
      for (let i = 0; i < n; i++) {
        const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000, ttftTargetMs: target };
        const slot = await f.scheduler.ticket(ask(`gone${i}`, at)).acquire(first());
        f.tick(firstTokenMs(i));
        slot!.prefillDone();
        slot!.release();
      }
      vi.advanceTimersByTime(100);
    }
    const withTimers = () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a'], s, cost, { sharedClock: true });
      f.teach();
      f.live.prefixInsert('a', prefix);
      return f;
    };

    it('learns a first token that came as a cold prefill as one: it moves neither the P99 nor the fit', async () => {
      const f = withTimers();
      // Five of 100 requests find the prefix gone and take the cold prompt's 190 ms.
      await serve(f, (i) => (i % 20 === 0 ? 190 : 30), 100);
      expect(f.scheduler.planning()).toEqual({
        multiplier: expect.any(Number),
        prefixJudged: 100,
        prefixGone: 5,
      });
      // Learnt as predicted they would make every 30 ms prediction plan for 190 ms (a ratio of 6.3).
      expect(f.scheduler.upperBackendMs('a', 30)).toBeLessThan(31);
      // The fit learnt 1,700 cold tokens in 190 ms, as it was taught, not 100 tokens in 190 ms.
      expect(f.live.predictTtftMs('a', 100)).toBeCloseTo(30, 0);
    });

    it('a prefix partly gone is learnt as partly prefilled', async () => {
      const f = withTimers();
      // Five of 100 requests come 140 ms late: 0.875 of the cached part, 1,400 of its 1,600 tokens.
      await serve(f, (i) => (i % 20 === 0 ? 170 : 30), 100);
      expect(f.scheduler.planning()).toMatchObject({ prefixJudged: 100, prefixGone: 5 });
      // The fit learnt 1,500 tokens in 170 ms, on its line; all 1,700 in 170 ms would have bent it.
      expect(f.live.predictTtftMs('a', 1700)).toBeCloseTo(190, 1);
      expect(f.scheduler.upperBackendMs('a', 30)).toBeLessThan(31);
    });

    it('a prefix gone under a prediction below the quickest first tokens is learnt from those', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      const s = settings({ concurrency: { ...settings().concurrency, initial: 64, intervalMs: 100 } });
      const f = setup(['a'], s, cost, { sharedClock: true });
      // A fit that predicts next to nothing for a small prefill: 0.1 ms per token − 10 ms.
      teachBelowZero(f);
      f.live.prefixInsert('a', prefix);
      // Requests of 700–1,500 uncached tokens on the fit's line (60–140 ms) make the quickest first
      // tokens 60 ms. Then the prefix's requests, predicted at 0 (100 uncached tokens): none comes
      // in under 60 ms, and the first finds the prefix gone and takes 160 ms more.
      for (let i = 0; i < 60; i++) {
        const tokens = 700 + 200 * (i % 5);
        const r = {
          arrivedAt: f.now(),
          deadlineAt: f.now() + 60_000,
          uncachedTokens: tokens,
          promptTokens: tokens,
        };
        const slot = await f.scheduler.ticket(req(r)).acquire(first());
        f.tick(0.1 * tokens - 10);
        slot!.prefillDone();
        slot!.release();
      }
      vi.advanceTimersByTime(100);
      await serve(f, (i) => (i % 12 === 0 ? 220 : 60), 12);
      expect(f.scheduler.planning().prefixGone).toBe(1);
      // Learnt as 60 + 160 ms predicted, not (a prediction under 60) + 160: nothing is late.
      expect(f.scheduler.upperBackendMs('a', 60)).toBeLessThan(62);
    });

    it('a first token late by less than 0.8 of the cached part is a wait, and counts as one', async () => {
      const f = withTimers();
      // 100 ms late, 0.625 of the cached part's 160 ms: a wait behind other prefills, not a miss.
      await serve(f, (i) => (i % 20 === 0 ? 130 : 30), 100);
      expect(f.scheduler.planning()).toMatchObject({ prefixJudged: 100, prefixGone: 0 });
      // They set the P99 of the ratios: about 130 / 30 (the fit learns them too, so the later
      // predictions are a little over 30 ms and the ratio a little under 4.3). Judged gone, none.
      expect(f.scheduler.upperBackendMs('a', 30)).toBeGreaterThan(100);
    });

    it('judges only a cached part whose prefill is at least the prediction, and learns what the lateness shows', () => {
      // Predicted 30 ms, the cached part 160 ms, the quickest first tokens 30 ms.
      expect(gonePrefillMs(30, 190, 160, 30)).toBe(160);
      // Late by 140 ms, 0.875 of the part: that much of it was prefilled, not all of it.
      expect(gonePrefillMs(30, 170, 160, 30)).toBe(140);
      expect(gonePrefillMs(30, 130, 160, 30)).toBe(0);
      // A part shorter than the prediction, or than the quickest first tokens: not judged.
      expect(gonePrefillMs(180, 240, 8, 30)).toBeNull();
      expect(gonePrefillMs(5, 45, 30, 40)).toBeNull();
      expect(gonePrefillMs(5, 45, 30, 0)).toBe(30);
      expect(gonePrefillMs(null, 190, 160, 30)).toBeNull();
      // Late from the quickest first tokens, not from a prediction under them: 10 ms past 40 ms.
      expect(gonePrefillMs(10, 50, 45, 40)).toBe(0);
      expect(gonePrefillMs(10, 80, 45, 40)).toBe(40);
      // The line is 0.8 of the part: 0.75 of it late is a wait, 0.85 a prefix gone.
      expect(gonePrefillMs(30, 150, 160, 30)).toBe(0);
      expect(gonePrefillMs(30, 166, 160, 30)).toBe(136);
    });

    it('a short cached part is not judged: any wait would pass for its miss', async () => {
      const f = withTimers();
      // 80 tokens of a short system prompt held (8 ms to prefill), 1,600 of the request's own
      // (predicted 180 ms): 60 ms late is eight times what the whole cached part could explain.
      const system = chain(5_000, 5);
      f.live.prefixInsert('a', system);
      for (let i = 0; i < 5; i++) {
        const blocks = [...system, ...chain(20_000 + 100 * i, 100)];
        const r = req({
          reqId: `short${i}`,
          promptTokens: 1680,
          route: route({ reqId: `short${i}`, promptTokens: 1680, blocks }),
        });
        const slot = await f.scheduler
          .ticket({ ...r, arrivedAt: f.now(), deadlineAt: f.now() + 60_000 })
          .acquire(first());
        f.tick(240);
        slot!.prefillDone();
        slot!.release();
      }
      expect(f.scheduler.planning()).toMatchObject({ prefixJudged: 0, prefixGone: 0 });
    });

    it('a cold prefill is not a wait the limit could take away', async () => {
      const f = withTimers();
      // One request stays running: the loop judges a backend only with something in flight.
      const held = await f.scheduler
        .ticket(ask('held', { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 }))
        .acquire(first());
      // Every request finds its prefix gone: 190 ms is 180 past its own predicted prefill, 0.45 of
      // a 400 ms target, past the controller's TTFT setpoint (0.25 of it) if it counted as a wait.
      await serve(f, () => 190, 20, 400);
      expect(f.scheduler.planning().prefixGone).toBe(20);
      expect(f.scheduler.view().backends[0]!.error).toBeLessThan(1);
      expect(f.scheduler.limit('a')).toBe(64);
      held!.release();
    });
  });
});
