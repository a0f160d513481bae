// The admission controller (src/admission): tenant limits, the TTFT prediction and the refusals
// made on it, shedding of sheddable classes, the predictor's error. Real live state (memory), real
// backend set and scheduler; the fits are taught by recording samples, as finished requests do.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { AdmissionController, type AdmissionRequest, SHED_WINDOW_MS } from '../../src/admission/index.ts';
import type { RoutingPolicy } from '../../src/router/index.ts';
import type { SchedulerSettings } from '../../src/scheduler/scheduler.ts';
import { Cancel } from '../../src/upstream/cancel.ts';
import type { Slot } from '../../src/upstream/slot.ts';
import { rankingFirst, route } from '../router/fixtures.ts';
import { schedulerFixture, schedulerSettings } from '../scheduler/fixtures.ts';
import { latencySample, observe } from '../state/fixtures/sample.ts';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(names = ['a', 'b']) {
  const f = schedulerFixture(
    names,
    schedulerSettings({ concurrency: { ...schedulerSettings().concurrency, initial: 4 } }),
  );
  cleanups.push(() => f.close());
  const { backends, live, scheduler } = f;
  let now = 0;
  const loop = { delayMs: 0 };
  const admission = new AdmissionController({
    backends: () => backends.list(),
    live,
    scheduler,
    loopDelayMs: () => loop.delayMs,
    now: () => now,
  });
  return {
    admission,
    backends,
    loop,
    live,
    scheduler,
    teach: f.teach,
    tick: (ms: number) => {
      now += ms;
      f.tick(ms);
    },
  };
}

function req(over: Partial<AdmissionRequest> = {}): AdmissionRequest {
  const base: Omit<AdmissionRequest, 'route'> = {
    reqId: 'r',
    className: 'interactive',
    priority: 0,
    sheddable: false,
    tenant: 'team-a',
    model: 'm',
    limits: null,
    arrivedAt: performance.now(),
    ttftTargetMs: 500,
    tpotTargetMs: 50,
    deadlineAt: performance.now() + 60_000,
    promptTokens: 1000,
    expectedOutputTokens: 100,
    budgetTokens: 1100,
    noQueue: false,
    ...over,
  };
  return { ...base, route: over.route ?? route({ reqId: base.reqId, promptTokens: base.promptTokens }) };
}

/**
 * A fixture whose scheduler reads the live state's clock (moved by its `tick`), and an admission
 * controller over it (`deps` in place of its defaults).
 */
function onOneClock(
  names: string[],
  settings: SchedulerSettings,
  router?: RoutingPolicy,
  deps: Partial<ConstructorParameters<typeof AdmissionController>[0]> = {},
) {
  const f = schedulerFixture(names, settings, router, { sharedClock: true });
  cleanups.push(() => f.close());
  const admission = new AdmissionController({
    backends: () => f.backends.list(),
    live: f.live,
    scheduler: f.scheduler,
    ...deps,
  });
  return { f, admission };
}

/** Prefill waiting on every backend (a lease each, until its first token), as dispatched requests make. */
function pendingPrefill(live: ReturnType<typeof setup>['live'], names: string[], tokens: number) {
  const leases = names.map((b) =>
    live.lease(b, { promptTokens: tokens, expectedOutputTokens: 10, uncachedPromptTokens: tokens }),
  );
  return () => {
    for (const l of leases) l.end();
  };
}

const firstAttempt = () => ({ attempt: 0, excluded: new Set<string>(), signal: new Cancel() });

/** What `fn` throws (undefined when it returns). */
function thrownBy(fn: () => unknown): unknown {
  try {
    fn();
  } catch (e) {
    return e;
  }
  return undefined;
}

const codeOf = (fn: () => unknown): string => {
  try {
    fn();
    return 'admitted';
  } catch (e) {
    return `${(e as { code: string }).code}:${(e as { retryAfterS: number }).retryAfterS}`;
  }
};

describe('tenant limits (item 31)', () => {
  it('max_concurrency: the tenant over its limit is refused with Retry-After; another tenant is not', () => {
    const { admission } = setup();
    const limits = { max_concurrency: 2 };
    const leases = [admission.admit(req({ limits })), admission.admit(req({ limits }))];
    expect(codeOf(() => admission.admit(req({ limits })))).toBe('rate_limited:1');
    expect(codeOf(() => admission.admit(req({ tenant: 'team-b', limits })))).toBe('admitted');
    leases[0]!.tenantLease.end();
    leases[0]!.tenantLease.end(); // idempotent: frees one place, not two
    expect(codeOf(() => admission.admit(req({ limits })))).toBe('admitted');
    expect(codeOf(() => admission.admit(req({ limits })))).toBe('rate_limited:1');
  });

  it('tokens_per_minute counts prompt + max_tokens admitted in the last minute, whatever has ended', () => {
    const { admission, tick } = setup();
    const limits = { tokens_per_minute: 3000 };
    admission.admit(req({ limits, budgetTokens: 1100 })).tenantLease.end();
    admission.admit(req({ limits, budgetTokens: 1100 })).tenantLease.end();
    tick(30_000);
    // 2200 used: 1100 more would pass 3000. Retry-After: when the first tokens leave the window.
    const refused = codeOf(() => admission.admit(req({ limits, budgetTokens: 1100 })));
    expect(refused).toMatch(/^rate_limited:(30|31)$/);
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 700 })))).toBe('admitted');
    // A request larger than the whole budget can never pass, however long it waits: a 400 with
    // no Retry-After, and it charges nothing.
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 5000 })))).toBe(
      'invalid_request:undefined',
    );
    // 2,900 used: the last 100 of the budget are still there.
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 100 })))).toBe('admitted');
    tick(31_000);
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 1100 })))).toBe('admitted');
  });

  it('a request larger than the whole budget is a 400 even while the tenant is at its concurrency limit', () => {
    const { admission } = setup();
    const limits = { max_concurrency: 1, tokens_per_minute: 3000 };
    admission.admit(req({ limits, budgetTokens: 100 }));
    // A 429 would have the client wait and retry what can never pass.
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 5000 })))).toBe(
      'invalid_request:undefined',
    );
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 100 })))).toBe('rate_limited:1');
  });
});

describe('tenant limits through an outage of the shared state', () => {
  /** An admission controller whose live state says this instance enforces `share` of each limit alone. */
  function sharing(share: number) {
    const f = schedulerFixture(['a', 'b'], schedulerSettings());
    cleanups.push(() => f.close());
    const live = new Proxy(f.live, {
      get(target, key) {
        if (key === 'tenantShare') return () => share;
        const v = Reflect.get(target, key, target);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    });
    return new AdmissionController({ backends: () => f.backends.list(), live, scheduler: f.scheduler });
  }

  it('max_concurrency: one instance of three, counting alone, admits its share (rounded up), and says so', () => {
    const admission = sharing(1 / 3);
    const limits = { max_concurrency: 10 };
    for (let i = 0; i < 4; i++) expect(codeOf(() => admission.admit(req({ limits })))).toBe('admitted');
    const err = thrownBy(() => admission.admit(req({ limits }))) as { code: string; message: string };
    expect(err.code).toBe('rate_limited');
    expect(err.message).toContain('its limit is 10 (4 on this gateway instance');
    // With the peers' counts in view, the whole limit.
    const whole = sharing(1);
    for (let i = 0; i < 10; i++) expect(codeOf(() => whole.admit(req({ limits })))).toBe('admitted');
    expect(codeOf(() => whole.admit(req({ limits })))).toBe('rate_limited:1');
  });

  it('tokens_per_minute: its share of the budget, but a request that fits the whole budget still passes alone', () => {
    const admission = sharing(1 / 3);
    const limits = { tokens_per_minute: 3000 };
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 900 })))).toBe('admitted');
    expect(codeOf(() => admission.admit(req({ limits, budgetTokens: 200 })))).toMatch(/^rate_limited:/);
    expect(codeOf(() => admission.admit(req({ tenant: 'team-b', limits, budgetTokens: 2500 })))).toBe(
      'admitted',
    );
    expect(codeOf(() => admission.admit(req({ tenant: 'team-b', limits, budgetTokens: 100 })))).toMatch(
      /^rate_limited:/,
    );
  });
});

describe('predicted TTFT', () => {
  it('is null without a fit (admitted: nothing to refuse on), and per backend once the fits have samples', () => {
    const { admission, teach } = setup();
    const cold = admission.admit(req());
    expect(cold.prediction.best).toBeNull();
    expect(cold.prediction.complete).toBe(false);
    teach();
    const warm = admission.admit(req({ promptTokens: 1000 }));
    // Nothing queued: no wait; 20 + 0.1 × 1000 on both backends (nothing pending on either).
    expect(warm.prediction.waitMs).toBe(0);
    expect(warm.prediction.complete).toBe(true);
    expect(warm.prediction.best!.totalMs).toBeCloseTo(120, 0);
    expect([...warm.prediction.byBackend.keys()].sort()).toEqual(['a', 'b']);
    // The scheduler sees the same numbers: size and guard.
    expect(warm.scheduled.bestBackendMs).toBeCloseTo(120, 0);
    expect(warm.scheduled.prefillMs).toBeCloseTo(100, 0);
  });

  it("predicts on the backends that serve the request's model only", () => {
    const f = setup(['a', 'b', 'c']);
    f.teach();
    f.backends.get('a')!.models = new Set(['other']);
    f.backends.get('c')!.models = new Set(['m', 'other']);
    const p = f.admission.admit(req({ model: 'm' })).prediction;
    expect([...p.byBackend.keys()].sort()).toEqual(['b', 'c']);
    f.backends.get('b')!.models = new Set(['other']);
    f.backends.get('c')!.models = new Set(['other']);
    expect(f.admission.admit(req({ model: 'm' })).prediction.byBackend.size).toBe(0);
  });

  it('what the load makes miss its class target on every backend is refused at once, with the prediction', () => {
    const { admission, teach, live } = setup();
    teach();
    // Unloaded 20 + 0.1 × 1000 = 120 ms; with 4,000 tokens of prefill waiting on each backend,
    // 20 + 0.1 × 5000 = 520 ms > 500.
    const release = pendingPrefill(live, ['a', 'b'], 4000);
    const caught = thrownBy(() => admission.admit(req({ promptTokens: 1000 })));
    expect(caught).toMatchObject({ code: 'sla_unattainable', status: 429 });
    expect((caught as { retryAfterS: number }).retryAfterS).toBeGreaterThanOrEqual(1);
    expect((caught as { prediction: { best: { totalMs: number } } }).prediction.best.totalMs).toBeCloseTo(
      520,
      -1,
    );
    // The same request in a class with room in its target is admitted, and so is it once the
    // prefill ahead of it is done.
    expect(codeOf(() => admission.admit(req({ promptTokens: 1000, ttftTargetMs: 30_000 })))).toBe('admitted');
    // Not when its deadline (first_token_timeout_ms from arrival) is sooner than the prediction:
    // it would be cut there, a 504 where this 429 is due.
    const now = performance.now();
    const cut = req({ promptTokens: 1000, ttftTargetMs: 30_000, arrivedAt: now, deadlineAt: now + 400 });
    expect(codeOf(() => admission.admit(cut))).toMatch(/^sla_unattainable/);
    expect((thrownBy(() => admission.admit(cut)) as Error).message).toContain(
      'its deadline, 400 ms after arrival',
    );
    release();
    expect(codeOf(() => admission.admit(req({ promptTokens: 1000 })))).toBe('admitted');
  });

  describe('a seed: late everywhere because the one backend holding its prefix is busy', () => {
    // 6,000 tokens: a 5,008-token prefix (313 blocks) held on a, then a question of its own. Cold,
    // 20 + 0.1 × 6,000 = 620 ms anywhere; warm on a, 120 ms, but a has 5,000 tokens of another
    // request's prefill waiting (a further 500 ms): late everywhere against the 500 ms target.
    const chain = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
    const prefix = chain(1, 313);
    let question = 0;
    /** A 6,000-token prompt: `held` (a's prefix unless given), then a question of its own. */
    const ask = (id: string, held: number[] = prefix) =>
      req({
        reqId: id,
        promptTokens: 6000,
        route: route({
          reqId: id,
          promptTokens: 6000,
          blocks: [...held, ...chain(10_000 + 100 * question++, 62)],
        }),
      });
    const busyHolder = (
      policy: 'slagate' | 'fcfs' = 'slagate',
      prefillTokens = 0,
      router?: RoutingPolicy,
    ) => {
      const { f, admission } = onOneClock(
        ['a', 'b', 'c'],
        schedulerSettings({
          policy,
          concurrency: { ...schedulerSettings().concurrency, initial: 4, prefillTokens },
        }),
        router,
      );
      f.teach();
      f.live.prefixInsert('a', prefix);
      pendingPrefill(f.live, ['a'], 5000);
      return { f, admission };
    };

    it('is let in to seed the least loaded backend, once: its prefix then has a second home, not a third', async () => {
      const { f, admission } = busyHolder();
      // b is as idle as c; one request already running on c.
      f.live.lease('c', { promptTokens: 10, expectedOutputTokens: 10 });
      const first = admission.admit(ask('seed'));
      expect(first.scheduled.seedOn).toBe('b');
      // Two requests another instance sent to b since: by the rule b would seed nothing now (and
      // nothing else would), but the choice admission made stands for the first attempt.
      for (let i = 0; i < 2; i++) f.live.lease('b', { promptTokens: 10, expectedOutputTokens: 10 });
      const ticket = f.scheduler.ticket(first.scheduled);
      const slot = await ticket.acquire(firstAttempt());
      expect(slot!.backend.name).toBe('b');
      expect(ticket.lastGrant!.seed).toBe(true);
      // Its blocks are in b's index now: the prefix's next request is ranked on both, and late on
      // both it is refused, not sent to seed c.
      expect(f.live.prefixMatch('b', prefix)).toBe(prefix.length);
      expect(codeOf(() => admission.admit(ask('after')))).toMatch(/^sla_unattainable/);
    });

    it('is none under fcfs or with seeds off, none for a prompt no backend holds, none on a backend with a quarter of the mean load or more', () => {
      const fcfs = busyHolder('fcfs');
      expect(codeOf(() => fcfs.admission.admit(ask('fcfs')))).toMatch(/^sla_unattainable/);
      // Nor with scheduler.seeds off (a reload applies at once).
      const off = busyHolder();
      off.f.set(
        schedulerSettings({ seeds: false, concurrency: { ...schedulerSettings().concurrency, initial: 4 } }),
      );
      expect(codeOf(() => off.admission.admit(ask('off')))).toMatch(/^sla_unattainable/);
      off.f.set(schedulerSettings({ concurrency: { ...schedulerSettings().concurrency, initial: 4 } }));
      expect(off.admission.admit(ask('on')).scheduled.seedOn).toBe('b');
      // Held nowhere, its budget is twice its unloaded first token (1,240 ms): late with 8,000
      // tokens of prefill ahead everywhere, and there is no prefix to give a second home.
      const cold = busyHolder();
      pendingPrefill(cold.f.live, ['a', 'b', 'c'], 8000);
      const nowhere = req({
        reqId: 'cold',
        promptTokens: 6000,
        route: route({ reqId: 'cold', promptTokens: 6000, blocks: chain(90_000, 375) }),
      });
      expect(codeOf(() => cold.admission.admit(nowhere))).toMatch(/^sla_unattainable/);
      // b runs one request, a third of the mean (a and c run four each): not a backend the fleet
      // leaves unused.
      const level = busyHolder();
      const run = (b: string, n: number) => {
        for (let i = 0; i < n; i++) level.f.live.lease(b, { promptTokens: 10, expectedOutputTokens: 10 });
      };
      run('a', 3);
      run('b', 1);
      run('c', 4);
      expect(codeOf(() => level.admission.admit(ask('level')))).toMatch(/^sla_unattainable/);
    });

    it('at most one seed prefills on a backend at a time: the next once its first token came, or its attempt ended without one', async () => {
      const { f, admission } = busyHolder();
      // c runs twelve requests: far above the mean, never a seed's backend here.
      for (let i = 0; i < 12; i++) f.live.lease('c', { promptTokens: 10, expectedOutputTokens: 10 });
      // Two more tenants' prefixes, held on a only.
      const held = [chain(50_000, 313), chain(80_000, 313)];
      for (const p of held) f.live.prefixInsert('a', p);
      const seed = async (r: AdmissionRequest) => {
        const a = admission.admit(r);
        expect(a.scheduled.seedOn).toBe('b');
        const slot = await f.scheduler.ticket(a.scheduled).acquire(firstAttempt());
        expect(slot!.backend.name).toBe('b');
        return slot!;
      };
      const one = await seed(ask('one'));
      // Refused while b's seed is still prefilling...
      expect(codeOf(() => admission.admit(ask('two', held[0]!)))).toMatch(/^sla_unattainable/);
      // ...let in to seed b once that attempt ended, with no first token...
      one.release();
      const three = await seed(ask('three', held[0]!));
      expect(codeOf(() => admission.admit(ask('four', held[1]!)))).toMatch(/^sla_unattainable/);
      // ...or once its first token came.
      three.prefillDone();
      await seed(ask('five', held[1]!));
    });

    it('the pin holds for the first attempt only, and not while another seed prefills there', async () => {
      const { f, admission } = busyHolder();
      for (let i = 0; i < 12; i++) f.live.lease('c', { promptTokens: 10, expectedOutputTokens: 10 });
      const held = chain(50_000, 313);
      f.live.prefixInsert('a', held);
      // Both let in to seed b while nothing prefills there.
      const one = admission.admit(ask('one'));
      const two = admission.admit(ask('two', held));
      expect([one.scheduled.seedOn, two.scheduled.seedOn]).toEqual(['b', 'b']);
      const seed = await f.scheduler.ticket(one.scheduled).acquire(firstAttempt());
      expect(seed!.backend.name).toBe('b');
      // b prefills one's seed now: two is routed as any other, late everywhere, and refused.
      await expect(f.scheduler.ticket(two.scheduled).acquire(firstAttempt())).rejects.toMatchObject({
        code: 'queue_timeout',
      });
      seed!.release();
      // A first attempt asked again (b refused it before it started) is never pinned to b.
      const three = admission.admit(ask('three', held));
      expect(three.scheduled.seedOn).toBe('b');
      const again = { attempt: 0, excluded: new Set(['b']), signal: new Cancel() };
      await expect(f.scheduler.ticket(three.scheduled).acquire(again)).rejects.toMatchObject({
        code: 'queue_timeout',
      });
    });

    it('is none on a backend an entry is waiting for, though it has a slot and prefill room', async () => {
      // prefill_tokens 8,000: b has 2,000 ahead; E (7,000, cold everywhere, an easy target) cannot
      // start anywhere now, and waits for b, its router's first.
      const bFirst: RoutingPolicy = {
        name: 'b-first',
        rank: (_r, views) =>
          [...views]
            .sort((x, y) => (x.name === 'b' ? -1 : y.name === 'b' ? 1 : 0))
            .map((v) => ({ backend: v.name, cost: 0 })),
      };
      const { f, admission } = busyHolder('slagate', 8000, bFirst);
      for (let i = 0; i < 12; i++) f.live.lease('c', { promptTokens: 10, expectedOutputTokens: 10 });
      pendingPrefill(f.live, ['b'], 2000);
      const e = req({
        reqId: 'e',
        promptTokens: 7000,
        ttftTargetMs: 30_000,
        route: route({ reqId: 'e', promptTokens: 7000, blocks: chain(300_000, 437) }),
      });
      const waiting = f.scheduler.ticket(admission.admit(e).scheduled).acquire(firstAttempt());
      expect(f.scheduler.view().queued).toBe(1);
      // b has slots and room for 6,000 more tokens of prefill, but E waits for it: no seed there.
      // (Admitted: the waits on b and c are not measured yet, so nothing refuses it; asked directly,
      // the scheduler names no backend it would seed.)
      const r = admission.admit(ask('r'));
      expect(f.scheduler.seedFor(r.scheduled)).toBeNull();
      r.tenantLease.end();
      waiting.catch(() => {});
    });
  });

  it("a request sent while another's prefill is under way is predicted to wait for what is left of it, not all of it", () => {
    const { admission, teach, live, tick } = setup();
    teach();
    // 4,000 tokens sent to each backend just now: 20 + 0.1 × (1000 + 4000) = 520 ms > 500.
    const release = pendingPrefill(live, ['a', 'b'], 4000);
    expect(codeOf(() => admission.admit(req({ promptTokens: 1000 })))).toMatch(/^sla_unattainable/);
    // 250 ms on, at 10 tokens a millisecond, 1,500 are left: 20 + 0.1 × 2500 = 270 ms. No first
    // token has come back (the counters still hold all 4,000), but the request is on time.
    tick(250);
    const admitted = admission.admit(req({ promptTokens: 1000 }));
    expect(admitted.prediction.best!.totalMs).toBeCloseTo(270, -1);
    expect(live.inflight('a').pendingPrefillTokens).toBe(4000);
    admitted.tenantLease.end();
    release();
  });

  it('counts from arrival: what the body took to arrive is spent, against a budget that counts it as the request’s own', () => {
    const { admission, teach, tick, live, loop } = setup();
    teach();
    tick(1_000);
    // 3,000 tokens of prefill waiting on each backend: 20 + 0.1 × 4000 = 420 ms to a first token.
    const release = pendingPrefill(live, ['a', 'b'], 3000);
    // Arrived now: 420 ms, within the 500 ms target.
    const fresh = admission.admit(req({ promptTokens: 1000, arrivedAt: 1_000, deadlineAt: 61_000 }));
    expect(fresh.prediction.best!.totalMs).toBeCloseTo(420, 0);
    // Its body took 100 ms to arrive: 520 ms from arrival, and the load is what puts it past.
    const late = thrownBy(() =>
      admission.admit(req({ promptTokens: 1000, arrivedAt: 900, deadlineAt: 60_900 })),
    ) as { code: string; message: string; prediction: { best: { totalMs: number } } };
    expect(late).toMatchObject({ code: 'sla_unattainable' });
    expect(late.prediction.best.totalMs).toBeCloseTo(520, 0);
    expect(late.message).toMatch(/Predicted time to first token 5[2-9]\d ms/);
    release();
    // A body that took 600 ms, on an idle fleet: past the target before anything was decided, as a
    // long prompt is by its own prefill. The load may delay it by that time again (the budget is
    // twice its own, 1,440 ms), not refuse it for what a retry would spend as well.
    const slow = admission.admit(req({ promptTokens: 1000, arrivedAt: 400, deadlineAt: 60_400 }));
    expect(slow.prediction.best!.totalMs).toBeCloseTo(720, 0);
    expect(slow.scheduled.ttftBudgetMs).toBeCloseTo(1440, 0);
    expect(slow.prediction.largeForClass).toBe(true);
    // What the gateway's own busy loop took of those 600 ms is not the request's own time: with
    // 100 ms of loop delay now, u is 500 + 120 and the budget 2u less the delay.
    loop.delayMs = 100;
    const lagged = admission.admit(req({ promptTokens: 1000, arrivedAt: 400, deadlineAt: 60_400 }));
    expect(lagged.scheduled.ttftBudgetMs).toBeCloseTo(2 * 620 - 100, 0);
  });

  it('no budget reaches past the deadline: not the class target, nor twice the first token unloaded', () => {
    const { admission, teach, live, loop } = setup();
    teach();
    const now = performance.now();
    // Target 600 ms, deadline 300 ms; 1,800 tokens take 200 ms unloaded (2u = 400 ms).
    const big = (at: number) =>
      req({ promptTokens: 1800, ttftTargetMs: 600, arrivedAt: at, deadlineAt: at + 300 });
    expect(admission.admit(big(now)).scheduled.ttftBudgetMs).toBeCloseTo(300, 6);
    // 1,500 tokens ahead: 350 ms, within 2u but past the deadline: refused, naming the deadline.
    const release = pendingPrefill(live, ['a', 'b'], 1500);
    const refused = thrownBy(() => admission.admit(big(performance.now())));
    expect(refused).toMatchObject({ code: 'sla_unattainable' });
    expect((refused as Error).message).toContain('its deadline, 300 ms after arrival');
    release();
    // A request whose own first token is past its deadline already is let in when nothing delays it.
    const huge = req({ promptTokens: 8000, ttftTargetMs: 500, arrivedAt: now, deadlineAt: now + 300 });
    expect(codeOf(() => admission.admit(huge))).toBe('admitted');
    // So it is with the loop a little late, as it always is once measured: its budget is the
    // bound found for it where nothing delays it, the loop's delay in it.
    loop.delayMs = 3;
    const lagged = admission.admit(huge);
    expect(lagged.scheduled.ttftBudgetMs).toBeGreaterThan(300);
    // Anything ahead still refuses it.
    const ahead = pendingPrefill(live, ['a', 'b'], 100);
    expect(codeOf(() => admission.admit(huge))).toMatch(/^sla_unattainable:/);
    ahead();
  });

  it("plans each backend at the P99 of its own first tokens: a backend's late ones do not refuse what another meets", async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const { f, admission } = onOneClock(
        ['a', 'b'],
        schedulerSettings({
          concurrency: { ...schedulerSettings().concurrency, initial: 64, intervalMs: 100 },
        }),
        undefined,
        { loopDelayMs: () => 0, now: () => 0 },
      );
      f.teach(); // dispatch → first token = 20 ms + 0.1 ms per uncached token: 120 ms for 1,000
      // 100 first tokens on each: on a, five come 2.5 times as late as predicted; on b, none.
      for (const [on, other] of [
        ['a', 'b'],
        ['b', 'a'],
      ] as const) {
        for (let i = 0; i < 100; i++) {
          const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 };
          const { scheduled } = admission.admit(req({ ...at, ttftTargetMs: 60_000, promptTokens: 1000 }));
          const slot = await f.scheduler
            .ticket(scheduled)
            .acquire({ attempt: 0, excluded: new Set([other]), signal: new Cancel() });
          expect(slot!.backend.name).toBe(on);
          f.tick(on === 'a' && i % 20 === 0 ? 300 : 120);
          slot!.prefillDone();
          slot!.release();
        }
      }
      vi.advanceTimersByTime(100);
      expect(f.scheduler.planning().multiplier).toBeGreaterThan(2);
      // With 1,000 tokens of prefill ahead on each backend, a 200-token request is predicted about
      // 20 + 0.1 × 1,200 = 140 ms on either. At the fleet's P99 (2.5, which a's late ones set) that
      // is 350 ms on both, past a 300 ms target: refused. b's own record plans it at about 140 ms.
      const release = pendingPrefill(f.live, ['a', 'b'], 1000);
      const at = { arrivedAt: f.now(), deadlineAt: f.now() + 60_000 };
      const admitted = admission.admit(req({ ...at, ttftTargetMs: 300, promptTokens: 200 }));
      // Checked on every backend (a prediction on each), and not admitted for its size: its first
      // token unloaded is far under half the target.
      expect(admitted.prediction.complete).toBe(true);
      expect(admitted.scheduled.ttftBudgetMs).toBe(300);
      expect(admitted.prediction.byBackend.get('b')?.backendMs).toBeCloseTo(140, -1);
      expect(f.scheduler.upperBackendMs('b', 140)).toBeLessThan(150);
      expect(f.scheduler.upperBackendMs('a', 140)).toBeGreaterThan(300);
      release();
    } finally {
      vi.useRealTimers();
    }
  });

  it('the budget is the class target, or twice the first token on an unloaded backend when that is more', () => {
    const { admission, teach, live } = setup();
    teach();
    // 20 + 0.1 × 8000 = 820 ms on either backend with nothing else there: over 500 however long
    // it waits, so a 429 with Retry-After would promise what no retry keeps. Budget 2 × 820.
    const large = admission.admit(req({ promptTokens: 8000 }));
    expect(large.prediction.largeForClass).toBe(true);
    expect(large.prediction.unloadedMs).toBeCloseTo(820, -1);
    expect(large.scheduled.ttftBudgetMs).toBeCloseTo(1640, -1);
    // Within its budget the load may delay it (3,000 tokens ahead on each: 1,120 ms);
    const some = pendingPrefill(live, ['a', 'b'], 3000);
    expect(codeOf(() => admission.admit(req({ promptTokens: 8000 })))).toBe('admitted');
    // past it, it is refused like any other request (9,000 ahead: 1,720 ms).
    const more = pendingPrefill(live, ['a', 'b'], 6000);
    const caught = thrownBy(() => admission.admit(req({ promptTokens: 8000 })));
    expect(caught).toMatchObject({ code: 'sla_unattainable' });
    expect((caught as Error).message).toMatch(/it is allowed/);
    more();
    some();
    // Continuous in its size: 3,000 tokens (320 ms unloaded, over half the target) get 640 ms, so
    // a little load does not refuse them; 1,000 tokens (120 ms) keep the class target.
    expect(admission.admit(req({ promptTokens: 3000 })).scheduled.ttftBudgetMs).toBeCloseTo(640, -1);
    const fits = admission.admit(req({ promptTokens: 1000 }));
    expect(fits.prediction.largeForClass).toBe(false);
    expect(fits.scheduled.ttftBudgetMs).toBe(500);
  });

  describe('the queue wait on a backend that would start the request at once', () => {
    /**
     * Backends with `limit` slots each (`settings` over the fixture's), fits taught, a release
     * rate measured (ten slots taken and freed, then a control period), on one clock.
     */
    async function measured(
      names: string[],
      over: Partial<SchedulerSettings> & { limit: number; prefillTokens?: number },
      router?: RoutingPolicy,
      teach: (f: ReturnType<typeof schedulerFixture>) => void = (f) => f.teach(),
    ) {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      cleanups.push(() => vi.useRealTimers());
      const base = schedulerSettings();
      const { limit, prefillTokens, ...rest } = over;
      const { f, admission } = onOneClock(
        names,
        schedulerSettings({
          ...rest,
          concurrency: {
            ...base.concurrency,
            initial: limit,
            max: limit,
            intervalMs: 100,
            prefillTokens: prefillTokens ?? 0,
          },
        }),
        router,
      );
      teach(f);
      const at = (o: Partial<AdmissionRequest> = {}) =>
        req({ arrivedAt: f.now(), deadlineAt: f.now() + 60_000, ...o });
      // Ten on each backend, so that each has a rate of its own.
      for (const name of names) {
        const others = new Set(names.filter((n) => n !== name));
        for (let i = 0; i < 10; i++) {
          const slot = await f.scheduler
            .ticket(admission.admit(at()).scheduled)
            .acquire({ attempt: 0, excluded: others, signal: new Cancel() });
          f.tick(50);
          slot!.release();
        }
      }
      vi.advanceTimersByTime(100);
      return { f, admission, at };
    }

    it('a Retry-After counts what would leave before the request, not the less urgent backlog it passes', async () => {
      const { f, admission, at } = await measured(['a'], { limit: 1 });
      const held = await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(firstAttempt());
      // 90 requests of a less urgent class wait: the whole queue drains in seconds.
      const batch = Array.from({ length: 90 }, (_, i) =>
        f.scheduler
          .ticket(
            admission.admit(
              at({ reqId: `batch${i}`, className: 'batch', priority: 2, ttftTargetMs: 600_000 }),
            ).scheduled,
          )
          .acquire(firstAttempt())
          .catch(() => null),
      );
      expect(f.scheduler.view().queued).toBe(90);
      const drainS = f.scheduler.drainMs('m')! / 1000;
      expect(drainS).toBeGreaterThan(3);
      // An interactive request would pass every one of them: late by a few tens of milliseconds
      // (4,000 tokens of prefill ahead of it: 20 + 0.1 × 5,000 ms against 500, and one slot's
      // wait), it may come back in a second, not after the whole drain.
      const release = pendingPrefill(f.live, ['a'], 4000);
      const caught = thrownBy(() => admission.admit(at({ promptTokens: 1000 })));
      expect(caught).toMatchObject({ code: 'sla_unattainable', retryAfterS: 1 });
      // One of the same class as the backlog, come after it, waits behind all of it: its
      // Retry-After is the drain.
      f.tick(100);
      const behind = thrownBy(() =>
        admission.admit(at({ reqId: 'late', className: 'batch', priority: 2, ttftTargetMs: 1_000 })),
      );
      expect(behind).toMatchObject({ code: 'sla_unattainable' });
      expect((behind as { retryAfterS: number }).retryAfterS).toBeGreaterThanOrEqual(Math.floor(drainS));
      // An interactive request admitted, queued first, and still waiting at its latest start (the
      // slot stays held): refused queue_timeout, and told to come back in a second as well.
      release();
      const soon = f.scheduler
        .ticket(admission.admit(at({ reqId: 'soon', promptTokens: 1000 })).scheduled)
        .acquire(firstAttempt());
      f.tick(1_000);
      await expect(soon).rejects.toMatchObject({ code: 'queue_timeout', retryAfterS: 1 });
      expect(f.scheduler.drainMs('m')! / 1000).toBeGreaterThan(3);
      held!.release();
      // One of the backlog starts in the slot freed.
      const next = await Promise.race(batch);
      expect(next?.backend.name).toBe('a');
      next!.release();
    });

    it("a Retry-After is the soonest any backend could take the request on time, not the fleet's wait", async () => {
      const { f, admission, at } = await measured(['a', 'b'], { limit: 2 });
      const onlyA = () => ({ attempt: 0, excluded: new Set(['b']), signal: new Cancel() });
      const held = [
        await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(onlyA()),
        await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(onlyA()),
      ];
      // 100 retries wait for a alone (served before any fresh request): seconds of queue there,
      // none for b.
      const ahead = Array.from({ length: 100 }, (_, i) =>
        f.scheduler
          .ticket(admission.admit(at({ reqId: `w${i}` })).scheduled)
          .acquire({ ...onlyA(), attempt: 1 })
          .catch(() => null),
      );
      const rate = f.scheduler.view().releasesPerS!;
      expect(100 / rate).toBeGreaterThan(3);
      // b has a slot free, and 4,000 tokens of prefill just sent there: 20 + 0.1 × 5,000 ms
      // against 500, late by tens of milliseconds; on a, seconds of queue first.
      const release = pendingPrefill(f.live, ['b'], 4000);
      const caught = thrownBy(() => admission.admit(at({ promptTokens: 1000 })));
      expect(caught).toMatchObject({ code: 'sla_unattainable', retryAfterS: 1 });
      // Once b's prefill is done, the same request is admitted.
      release();
      expect(codeOf(() => admission.admit(at({ promptTokens: 1000 })))).toBe('admitted');
      for (const h of held) h!.release();
      await Promise.race(ahead);
    });

    it('…over the backends where waiting can make it on time: not one late with nothing else on it', async () => {
      const { f, admission, at } = await measured(['a', 'b'], { limit: 2 }, undefined, (f) => f.teach(['a']));
      // b is 600 ms slower than a at any size (an older GPU): 720 ms for 1,000 tokens, alone.
      for (let i = 0; i < 20; i++) {
        f.tick(10);
        const tokens = 100 + 200 * (i % 5);
        observe(
          f.live,
          latencySample({
            backend: 'b',
            uncachedPromptTokens: tokens,
            queueMs: 0,
            ttftMs: 620 + 0.1 * tokens,
          }),
        );
      }
      const onlyA = () => ({ attempt: 0, excluded: new Set(['b']), signal: new Cancel() });
      const held = [
        await f.scheduler.ticket(admission.admit(at({ promptTokens: 100 })).scheduled).acquire(onlyA()),
        await f.scheduler.ticket(admission.admit(at({ promptTokens: 100 })).scheduled).acquire(onlyA()),
      ];
      const ahead = Array.from({ length: 100 }, (_, i) =>
        f.scheduler
          .ticket(admission.admit(at({ reqId: `w${i}`, promptTokens: 100, ttftTargetMs: 60_000 })).scheduled)
          .acquire({ ...onlyA(), attempt: 1 })
          .catch(() => null),
      );
      const drainS = 100 / f.scheduler.view().releasesPerS!;
      expect(drainS).toBeGreaterThan(3);
      // b has room and is late by 220 ms for good; a is on time once its queue has gone.
      const caught = thrownBy(() => admission.admit(at({ promptTokens: 1000 })));
      expect(caught).toMatchObject({ code: 'sla_unattainable' });
      expect((caught as { retryAfterS: number }).retryAfterS).toBeGreaterThanOrEqual(Math.floor(drainS));
      for (const h of held) h!.release();
      await Promise.race(ahead);
    });

    it('a request the pump finds late on the one backend with room is told the wait of the entries ahead of it, those the pump passed included', async () => {
      const { f, admission, at } = await measured(['a', 'b'], { limit: 2 });
      const onlyA = { attempt: 0, excluded: new Set(['b']), signal: new Cancel() };
      const held = [
        await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(onlyA),
        await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(onlyA),
      ];
      expect(held.map((h) => h!.backend.name)).toEqual(['a', 'a']);
      // 31 requests wait for a (b is not for them); the pump ranks them each time it runs.
      const ahead = Array.from({ length: 31 }, (_, i) =>
        f.scheduler
          .ticket(admission.admit(at({ reqId: `w${i}`, ttftTargetMs: 60_000 })).scheduled)
          .acquire({ attempt: 0, excluded: new Set(['b']), signal: new Cancel() })
          .catch(() => null),
      );
      f.tick(1);
      // Admitted while b was free; then b takes 4,000 tokens of prefill (20 + 0.1 × 5,000 ms there
      // now, against 500), and the pump that reaches it finds it late on b and waiting on a.
      const late = admission.admit(at({ reqId: 'late', promptTokens: 1000 }));
      const release = pendingPrefill(f.live, ['b'], 4000);
      const refused = await f.scheduler
        .ticket(late.scheduled)
        .acquire(firstAttempt())
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(refused).toMatchObject({ code: 'queue_timeout' });
      // The 31 ahead of it leave before it could start: their wait, at the rate slots free.
      const rate = f.scheduler.view().releasesPerS!;
      expect((refused as { retryAfterS: number }).retryAfterS).toBe(Math.min(60, Math.ceil(32 / rate)));
      expect(Math.ceil(32 / rate)).toBeGreaterThan(1);
      release();
      for (const h of held) h!.release();
      await Promise.race(ahead);
    });

    it("is none for a request that meets a full queue, on a backend idle behind the pump's bound", async () => {
      const { f, admission, at } = await measured(['a', 'b'], { limit: 1, maxQueue: 40 });
      const onlyA = () => ({ attempt: 0, excluded: new Set(['b']), signal: new Cancel() });
      const held = await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(onlyA());
      expect(held!.backend.name).toBe('a');
      // 40 wait for a (b is not for them): the queue is full, and the last pump stopped at its
      // bound (16 passes per backend) before the end of it.
      const waiting = Array.from({ length: 40 }, (_, i) =>
        f.scheduler
          .ticket(admission.admit(at({ reqId: `w${i}`, ttftTargetMs: 60_000 })).scheduled)
          .acquire(onlyA())
          .catch(() => null),
      );
      expect(f.scheduler.view().queued).toBe(40);
      f.tick(100);
      // A new request's pump reaches it, so b, idle, would start it at once: no wait there, and
      // admitted, where the 40 ahead of it on the fleet's count would have made it late.
      const fresh = admission.admit(at({ reqId: 'fresh', promptTokens: 1000 }));
      expect(fresh.prediction.byBackend.get('b')).toMatchObject({ waitMs: 0 });
      expect(fresh.prediction.waitMs!).toBeGreaterThan(1_000);
      const slot = await f.scheduler.ticket(fresh.scheduled).acquire(firstAttempt());
      expect(slot?.backend.name).toBe('b');
      slot!.release();
      held!.release();
      await Promise.race(waiting);
    });

    it('a request that meets a full queue starts on a backend with room, before a busy one its router ranks first', async () => {
      // a is ranked first for every request, busy, and would start one within its budget after a
      // short wait (nobody waits for it); b has room; the 40 queued wait for c (a and b are not for
      // them), and fill the queue.
      const { f, admission, at } = await measured(
        ['a', 'b', 'c'],
        { limit: 2, maxQueue: 40 },
        rankingFirst('a'),
      );
      const only = (name: string) => ({
        attempt: 0,
        excluded: new Set(['a', 'b', 'c'].filter((n) => n !== name)),
        signal: new Cancel(),
      });
      const held: (Slot | null)[] = [];
      for (const name of ['a', 'a', 'c', 'c'])
        held.push(await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(only(name)));
      expect(held.map((h) => h!.backend.name)).toEqual(['a', 'a', 'c', 'c']);
      const waiting = Array.from({ length: 40 }, (_, i) =>
        f.scheduler
          .ticket(admission.admit(at({ reqId: `w${i}`, ttftTargetMs: 60_000 })).scheduled)
          .acquire(only('c'))
          .catch(() => null),
      );
      expect(f.scheduler.view().queued).toBe(40);
      // Waiting for a, it would take a place in a full queue nobody gives up (one tenant): refused.
      const fresh = admission.admit(at({ reqId: 'fresh', promptTokens: 1000, ttftTargetMs: 5_000 }));
      const slot = await f.scheduler.ticket(fresh.scheduled).acquire(firstAttempt());
      expect(slot?.backend.name).toBe('b');
      slot!.release();
      for (const h of held) h!.release();
      await Promise.race(waiting);
    });

    it('is none where nobody waits: the queue ahead counts only on a backend that is full', async () => {
      const { f, admission, at } = await measured(['a', 'b'], { limit: 1 });
      // a's slot is taken, and eight retries that may not go to b wait for it.
      const held = await f.scheduler
        .ticket(admission.admit(at()).scheduled)
        .acquire({ attempt: 0, excluded: new Set(['b']), signal: new Cancel() });
      expect(held!.backend.name).toBe('a');
      const retries = Array.from({ length: 8 }, () =>
        f.scheduler
          .ticket(admission.admit(at()).scheduled)
          .acquire({ attempt: 1, excluded: new Set(['b']), signal: new Cancel() }),
      );
      // b takes a new request at once: 20 + 0.1 × 1000 = 120 ms, within 500, though the queue
      // ahead would take longer than the target to drain.
      const ok = admission.admit(at({ promptTokens: 1000 }));
      const queueMs = ok.prediction.waitMs!;
      expect(queueMs).toBeGreaterThan(500);
      expect(ok.prediction.byBackend.get('b')).toMatchObject({ waitMs: 0 });
      expect(ok.prediction.byBackend.get('b')!.totalMs).toBeCloseTo(120, 0);
      expect(ok.prediction.byBackend.get('a')).toMatchObject({ waitMs: queueMs });
      expect(ok.prediction.best!.backend).toBe('b');
      const onB = await f.scheduler.ticket(ok.scheduled).acquire(firstAttempt());
      expect(onB!.backend.name).toBe('b');
      // Now b is full too: the queue ahead counts everywhere, and the request is refused.
      expect(codeOf(() => admission.admit(at({ promptTokens: 1000 })))).toMatch(/^sla_unattainable/);
      held!.release();
      onB!.release();
      for (const r of retries) (await r)?.release();
    });

    it("is the queue's where an entry waits for that backend for prefill room, slot free or not", async () => {
      // One backend, two slots, 2,048 tokens of prefill room: one request is still prefilling
      // 1,500 tokens, so a slot is free, and three of 3,000 tokens wait for b (nothing may be
      // pending for them to fit). Nobody passes them there: a short request waits too.
      const { f, admission, at } = await measured(['b'], { limit: 2, prefillTokens: 2048 });
      const lease = f.live.lease('b', {
        promptTokens: 1500,
        expectedOutputTokens: 10,
        uncachedPromptTokens: 1500,
      });
      const big = [0, 1, 2].map((i) =>
        f.scheduler
          .ticket(
            admission.admit(at({ reqId: `big${i}`, promptTokens: 3000, ttftTargetMs: 20_000 })).scheduled,
          )
          .acquire(firstAttempt()),
      );
      // A second later a short request comes: behind them in the queue's order.
      f.tick(1000);
      const short = admission.admit(at({ reqId: 'short', promptTokens: 300, ttftTargetMs: 20_000 }));
      const b = short.prediction.byBackend.get('b')!;
      expect(b.waitMs).toBe(short.prediction.waitMs);
      expect(b.waitMs).toBeGreaterThan(0);
      let state = 'waiting';
      void f.scheduler
        .ticket(short.scheduled)
        .acquire(firstAttempt())
        .then(() => {
          state = 'granted';
        });
      await Promise.resolve();
      expect(state).toBe('waiting');
      // Once nothing is pending one of them starts; when it ends the next does, and the short one
      // still waits behind it.
      lease.end();
      f.scheduler.pump();
      (await Promise.race(big))!.release();
      await new Promise((r) => setImmediate(r));
      expect(state).toBe('waiting');
    });

    it("is the queue's while entries the pump never reached may be waiting for it", async () => {
      // a's one slot is taken and entries that may not go to b wait for it, in arrival order. A
      // pump passes over at most 16 waiting entries per backend: behind 3 of them a new request is
      // offered b, free, and starts there at once; behind 32 it is never reached, free as b is.
      const { f, admission, at } = await measured(['a', 'b'], { policy: 'fcfs', limit: 1 });
      const onlyA = () => ({ attempt: 0, excluded: new Set(['b']), signal: new Cancel() });
      const held = await f.scheduler.ticket(admission.admit(at()).scheduled).acquire(onlyA());
      expect(held!.backend.name).toBe('a');
      const queued = (n: number) =>
        Array.from({ length: n }, () => {
          const p = f.scheduler
            .ticket(admission.admit(at({ ttftTargetMs: 59_000 })).scheduled)
            .acquire(onlyA());
          f.tick(1);
          return p;
        });
      const few = queued(3);
      const near = admission.admit(at());
      expect(near.prediction.byBackend.get('b')!.waitMs).toBe(0);
      const onB = await f.scheduler.ticket(near.scheduled).acquire(firstAttempt());
      expect(onB!.backend.name).toBe('b');
      onB!.release();
      const many = queued(29);
      const far = admission.admit(at({ ttftTargetMs: 59_000 }));
      expect(far.prediction.waitMs).toBeGreaterThan(0);
      expect(far.prediction.byBackend.get('b')!.waitMs).toBe(far.prediction.waitMs);
      let state = 'waiting';
      void f.scheduler
        .ticket(far.scheduled)
        .acquire(firstAttempt())
        .then(
          (s) => {
            state = s?.backend.name ?? 'none';
            s?.release();
          },
          () => {
            state = 'refused';
          },
        );
      await Promise.resolve();
      expect(state).toBe('waiting');
      // Served one by one on a (the request behind them gets b on the way, once a pump reaches
      // it): with nobody waiting, b would start the next request at once again.
      held!.release();
      for (const p of [...few, ...many]) (await p)?.release();
      expect(state).toBe('b');
      expect(f.scheduler.startsNow('b', 100)).toBe(true);
    });
  });

  it("the gateway's own event-loop delay comes out of every budget, and a refusal says so", () => {
    const { admission, teach, live, loop } = setup();
    teach();
    // 3,000 tokens of prefill ahead on each backend: 20 + 0.1 × 4000 = 420 ms, under 500.
    const release = pendingPrefill(live, ['a', 'b'], 3000);
    expect(codeOf(() => admission.admit(req({ promptTokens: 1000 })))).toBe('admitted');
    expect(admission.loopDelayMs()).toBe(0);
    // The loop is 100 ms late: the client waits that before the gateway sees its request, so
    // 420 ms here would be 520 ms to the client.
    loop.delayMs = 100;
    expect(admission.loopDelayMs()).toBe(100);
    const caught = thrownBy(() => admission.admit(req({ promptTokens: 1000 })));
    expect(caught).toMatchObject({ code: 'sla_unattainable', status: 429 });
    expect((caught as Error).message).toMatch(
      /target of 500 ms, less the 100 ms the gateway's own event loop/,
    );
    release();
    // With nothing ahead (120 ms) it fits the 400 ms left, and the queue guard plans with 400.
    const fits = admission.admit(req({ promptTokens: 1000 }));
    expect(fits.scheduled.ttftBudgetMs).toBe(400);
    expect(fits.scheduled.loopDelayMs).toBe(100);
    // A loop later than the target refuses it on an idle fleet too: a retry may find the loop
    // caught up, and the refusal relieves it.
    loop.delayMs = 600;
    expect(codeOf(() => admission.admit(req({ promptTokens: 1000 })))).toMatch(/^sla_unattainable:/);
  });

  it('sheddable classes are refused first: for a while after a protected refusal, every sheddable one is', () => {
    const { admission, teach, tick, live } = setup();
    teach();
    const batch = { className: 'batch', sheddable: true, ttftTargetMs: 30_000 };
    expect(codeOf(() => admission.admit(req(batch)))).toBe('admitted');
    // A protected request is refused for capacity…
    const release = pendingPrefill(live, ['a', 'b'], 4000);
    expect(codeOf(() => admission.admit(req({ promptTokens: 1000 })))).toMatch(/^sla_unattainable/);
    release();
    // …so a sheddable one that could be served is refused now,
    expect(codeOf(() => admission.admit(req(batch)))).toMatch(/^sla_unattainable/);
    // while protected requests that can be served still are,
    expect(codeOf(() => admission.admit(req()))).toBe('admitted');
    // and the window closes.
    tick(SHED_WINDOW_MS + 1);
    expect(codeOf(() => admission.admit(req(batch)))).toBe('admitted');
    // A scheduler refusal (queue_full, queue_timeout) of a protected class opens it too.
    admission.noteRefused({ sheddable: false, model: 'm' }, 'queue_timeout');
    expect(codeOf(() => admission.admit(req(batch)))).toMatch(/^sla_unattainable/);
    // Not one that asked not to wait (x-slagate-no-queue) and found no room at once.
    tick(SHED_WINDOW_MS + 1);
    admission.noteRefused({ sheddable: false, model: 'm', noQueue: true }, 'queue_full');
    expect(codeOf(() => admission.admit(req(batch)))).toBe('admitted');
    // Nor one that found room only where it would be late, and may not wait for a busy backend.
    admission.noteRefused({ sheddable: false, model: 'm', noQueue: true }, 'queue_timeout');
    expect(codeOf(() => admission.admit(req(batch)))).toBe('admitted');
  });

  it("a protected model's refusals shed the sheddable requests that would share its backends, not another model's", () => {
    const { admission, teach, backends } = setup(['a', 'b', 'c']);
    teach();
    // a serves the small model, b the large one, c both (its adapters, say).
    const [a, b, c] = backends.list();
    a!.learned(new Set(['small']));
    b!.learned(new Set(['large']));
    c!.learned(new Set(['small', 'large']));
    const batch = (model: string) =>
      req({ className: 'batch', sheddable: true, ttftTargetMs: 30_000, model });
    admission.noteRefused({ sheddable: false, model: 'large' }, 'queue_timeout');
    // c serves both: a sheddable request for the small model would compete for it.
    expect(codeOf(() => admission.admit(batch('small')))).toMatch(/^sla_unattainable/);
    expect(codeOf(() => admission.admit(batch('large')))).toMatch(/^sla_unattainable/);
    // Once c serves only the large model, the small model's backends share nothing with it.
    c!.learned(new Set(['large']));
    expect(codeOf(() => admission.admit(batch('small')))).toBe('admitted');
    expect(codeOf(() => admission.admit(batch('large')))).toMatch(/^sla_unattainable/);
    // Nor does a backend out of service that would serve both (ejected here; down by its probe,
    // or never reached at all, likewise): it takes nothing from either while it is out.
    c!.learned(new Set(['small', 'large']));
    expect(codeOf(() => admission.admit(batch('small')))).toMatch(/^sla_unattainable/);
    while (!c!.outlier.ejected()) c!.outlier.failure(() => true);
    expect(c!.inService).toBe(false);
    expect(codeOf(() => admission.admit(batch('small')))).toBe('admitted');
  });

  it("predicts no wait on an idle backend for a request that may not wait, however long the backlog ahead of the pump's bound", async () => {
    // Every queued request waits for `a` (ranked first, busy); `b` idles. The pump ranked 16 per
    // backend and stopped there: a request that may wait would wait behind the fleet's queue, but
    // one that may not is judged by a pump that reaches it (Scheduler.#mustReach), and starts on b.
    const aFirst = rankingFirst('a');
    // The scheduler on performance.now(), as the requests' arrival times are.
    const f = schedulerFixture(
      ['a', 'b'],
      schedulerSettings({ concurrency: { ...schedulerSettings().concurrency, initial: 1 } }),
      aFirst,
    );
    cleanups.push(() => f.close());
    const admission = new AdmissionController({
      backends: () => f.backends.list(),
      live: f.live,
      scheduler: f.scheduler,
    });
    // Targets no wait here reaches: nothing is refused for its wait.
    const slow = { ttftTargetMs: 60_000 };
    const held = await f.scheduler
      .ticket(admission.admit(req({ reqId: 'held', ...slow })).scheduled)
      .acquire(firstAttempt());
    expect(held!.backend.name).toBe('a');
    for (let i = 0; i < 40; i++)
      void f.scheduler
        .ticket(admission.admit(req({ reqId: `w${i}`, ...slow })).scheduled)
        .acquire(firstAttempt())
        .catch(() => {});
    expect(f.scheduler.view().queued).toBe(40);
    const hurry = admission.admit(req({ reqId: 'hurry', noQueue: true, ...slow }));
    expect(hurry.prediction.byBackend.get('b')?.waitMs).toBe(0);
    // One that may wait is predicted behind the queue there.
    expect(
      admission.admit(req({ reqId: 'patient', ...slow })).prediction.byBackend.get('b')?.waitMs,
    ).not.toBe(0);
    const slot = await f.scheduler.ticket(hurry.scheduled).acquire(firstAttempt());
    expect(slot?.backend.name).toBe('b');
  });

  it('a request that may not wait is judged on the backends that can start it now: none here, so it is let through to the queue_full it is owed, and sheds nothing', async () => {
    // The control loop's timer by hand: its period measures the rate slots free at.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    cleanups.push(() => vi.useRealTimers());
    const f = schedulerFixture(
      ['a', 'b'],
      schedulerSettings({
        concurrency: { ...schedulerSettings().concurrency, initial: 1, max: 1, intervalMs: 100 },
      }),
      undefined,
      { sharedClock: true },
    );
    cleanups.push(() => f.close());
    const admission = new AdmissionController({
      backends: () => f.backends.list(),
      live: f.live,
      scheduler: f.scheduler,
      now: () => f.now(),
    });
    f.teach();
    const at = (over: Partial<AdmissionRequest> = {}) =>
      req({ arrivedAt: f.now(), deadlineAt: f.now() + 60_000, ...over });
    const slow = { ttftTargetMs: 60_000 };
    // Ten slots freed in a second: the rate the queue's wait is predicted at.
    for (let i = 0; i < 10; i++) {
      const s = await f.scheduler
        .ticket(admission.admit(at({ reqId: `w${i}`, ...slow })).scheduled)
        .acquire(firstAttempt());
      f.tick(100);
      s!.release();
    }
    vi.advanceTimersByTime(100);
    expect(f.scheduler.view().releasesPerS).not.toBeNull();
    // Both backends busy, ten requests queued behind them.
    const held: (Slot | null)[] = [];
    for (const id of ['h1', 'h2'])
      held.push(
        await f.scheduler
          .ticket(admission.admit(at({ reqId: id, ...slow })).scheduled)
          .acquire(firstAttempt()),
      );
    for (let i = 0; i < 10; i++)
      void f.scheduler
        .ticket(admission.admit(at({ reqId: `q${i}`, ...slow })).scheduled)
        .acquire(firstAttempt())
        .catch(() => {});
    expect(f.scheduler.view().queued).toBe(10);
    f.tick(1);
    // One that may wait is predicted the queue's wait.
    expect(
      admission.admit(at({ reqId: 'patient', ...slow })).prediction.byBackend.get('a')?.waitMs,
    ).toBeGreaterThan(0);
    // One that may not, with the class's own target: no wait anywhere, so not judged late on one
    // (sla_unattainable); admitted, and refused by the scheduler as it is owed.
    const hurry = admission.admit(at({ reqId: 'hurry', noQueue: true }));
    for (const b of ['a', 'b']) expect(hurry.prediction.byBackend.get(b)?.waitMs).toBeNull();
    await expect(f.scheduler.ticket(hurry.scheduled).acquire(firstAttempt())).rejects.toMatchObject({
      code: 'queue_full',
    });
    // Its refusal, of whatever kind, opens no shedding window: a sheddable request is still let in.
    admission.noteRefused({ sheddable: false, model: 'm', noQueue: true }, 'queue_full');
    admission.noteRefused({ sheddable: false, model: 'm', noQueue: true }, 'sla_unattainable');
    expect(
      codeOf(() => admission.admit(at({ reqId: 'batch', className: 'batch', sheddable: true, ...slow }))),
    ).toBe('admitted');
    for (const h of held) h?.release();
  });

  it("keeps the predictor's error: median and P90 of |predicted − actual| / actual, and the bias", () => {
    const { admission } = setup();
    expect(admission.predictionError()).toEqual({ samples: 0, median: null, p90: null, bias: null });
    for (const [p, a] of [
      [110, 100],
      [90, 100],
      [100, 100],
      [150, 100],
    ] as const)
      admission.observe(p, a);
    admission.observe(null, 100); // nothing predicted: not counted
    const e = admission.predictionError();
    expect(e.samples).toBe(4);
    expect(e.median).toBeCloseTo(0.1, 9);
    expect(e.p90).toBeCloseTo(0.5, 9);
    expect(e.bias).toBeCloseTo(0.125, 9);
  });
});
