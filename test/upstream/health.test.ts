// Backend health: passive ejection with its cap, the breaker's accounting and half-open trial,
// isolation of timeouts, active probes, and reload without dropped requests or leaked timers.
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { Backend } from '../../src/upstream/backend.ts';
import type { BackendEvent, BackendSetOptions } from '../../src/upstream/backends.ts';
import { BackendSet } from '../../src/upstream/backends.ts';
import { HealthProbe } from '../../src/upstream/health.ts';
import { DEFAULT_BACKEND_SET_OPTIONS } from '../../src/upstream/options.ts';
import { openStream } from '../helpers/http.ts';
import {
  chatBody,
  chatStream,
  FAST,
  type GatewayOpts,
  gateway,
  hang,
  healthy,
  makeSet,
  post,
  roleChunk,
  type Script,
  sleep,
  sseHead,
  status,
  tokenChunk,
  upstream,
} from './helpers.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  vi.useRealTimers();
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function fleet(
  scripts: Script[],
  over: Partial<BackendSetOptions> = {},
  gw: Partial<GatewayOpts> = {},
) {
  const ups = await Promise.all(scripts.map((s) => upstream(s)));
  const events: BackendEvent[] = [];
  const set = makeSet(
    ups.map((u) => u.url),
    { onEvent: (e) => events.push(e), ...over },
  );
  const g = await gateway({ set, ...gw });
  cleanups.push(...ups.map((u) => u.close), () => set.close(), g.close);
  return { ups, set, gw: g, events };
}

const outlier = (o: Partial<BackendSetOptions['outlier']>) => ({
  outlier: { ...DEFAULT_BACKEND_SET_OPTIONS.outlier, ...o },
});
const breaker = (o: Partial<BackendSetOptions['breaker']>) => ({
  breaker: { ...DEFAULT_BACKEND_SET_OPTIONS.breaker, ...o },
});

/**
 * Opened twice, with a failed (or inconclusive) trial between: half-open again, the next trial
 * succeeds and closes the breaker.
 */
async function closesOnTheNextTrial(b: Backend, url: string, events: BackendEvent[]): Promise<void> {
  await vi.waitFor(() => expect(b.state).toBe('half_open'), { timeout: 2_000, interval: 5 });
  expect((await post(url, chatBody())).status).toBe(200);
  expect(b.state).toBe('healthy');
  expect(events.map((e) => e.type).filter((t) => t.startsWith('breaker'))).toEqual([
    'breaker_open',
    'breaker_half_open',
    'breaker_open',
    'breaker_half_open',
    'breaker_close',
  ]);
}

describe('passive outlier ejection (item 9)', () => {
  it('ejects after N consecutive failures, but never more than the ejection cap', async () => {
    const { set, gw, events } = await fleet(
      [status(500), status(500), healthy(1)],
      outlier({ consecutiveFailures: 3, maxEjectionPercent: 34 }),
    );
    for (let i = 0; i < 5; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    const [b0, b1] = [set.get('b0')!, set.get('b1')!];
    expect(b0.state).toBe('ejected');
    expect(b0.outlier.remainingMs()).toBeGreaterThan(25_000);
    // b1 failed on every request too, but one ejected backend of three is the cap.
    expect(b1.outlier.consecutiveFailures).toBeGreaterThanOrEqual(3);
    expect(b1.state).toBe('healthy');
    expect(events.filter((e) => e.type === 'ejected')).toEqual([
      { type: 'ejected', backend: 'b0', durationMs: DEFAULT_BACKEND_SET_OPTIONS.outlier.baseEjectionMs },
    ]);
    // An ejected backend takes no traffic: requests now go b1 (fails) → b2.
    await post(gw.url, chatBody());
    expect(gw.results.at(-1)!.attemptLog.map((a) => a.backend)).toEqual(['b1', 'b2']);
  });

  it('never ejects the last backend in service: a failing replica serves better than none', async () => {
    const { ups, set, gw, events } = await fleet([status(500), status(500)], {
      ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 100 }),
      ...breaker({ volumeThreshold: 1000 }),
    });
    for (let i = 0; i < 4; i++) expect((await post(gw.url, chatBody())).status).toBe(502);
    const [b0, b1] = [set.get('b0')!, set.get('b1')!];
    // The cap would let both go; b0 went first, and b1 is all that is left in service.
    expect(events.filter((e) => e.type === 'ejected').map((e) => e.type === 'ejected' && e.backend)).toEqual([
      'b0',
    ]);
    expect(b0.state).toBe('ejected');
    expect(b1.state).toBe('healthy');
    expect(b1.outlier.consecutiveFailures).toBeGreaterThanOrEqual(2);
    // Requests still reach it.
    const hits = ups[1]!.hits.length;
    expect((await post(gw.url, chatBody())).status).toBe(502);
    expect(ups[1]!.hits.length).toBe(hits + 1);
  });
});

describe('an ejection ends when the rest of the fleet leaves service, and is told when it runs out', () => {
  it('the last backend in service failing its probes brings the ejected one back at once: unejected, and requests reach it', async () => {
    let health1 = 200;
    // b0 answers its probes but fails its requests; b1 serves them until its probe fails.
    const b0: Script = (req, res, hit) => {
      if (req.url === '/health') res.writeHead(200).end();
      else status(500)(req, res, hit);
    };
    const b1: Script = (req, res, hit) => {
      if (req.url === '/health') res.writeHead(health1).end();
      else healthy(1)(req, res, hit);
    };
    const { ups, set, gw, events } = await fleet([b0, b1], {
      ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 50 }),
      ...breaker({ volumeThreshold: 1000 }),
      health: { intervalMs: 30, timeoutMs: 200, path: '/health', unhealthyThreshold: 1, healthyThreshold: 1 },
    });
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    expect(set.get('b0')!.state).toBe('ejected');
    health1 = 503;
    await vi.waitFor(() => expect(set.get('b1')!.state).toBe('down'), { timeout: 2_000, interval: 5 });
    // A replica that fails some requests serves better than none.
    expect(set.get('b0')!.state).toBe('healthy');
    const told = events.filter((e) => e.type === 'probe_down' || e.type === 'unejected');
    expect(told).toEqual([
      { type: 'probe_down', backend: 'b1' },
      { type: 'unejected', backend: 'b0' },
    ]);
    const hits = ups[0]!.hits.length;
    expect((await post(gw.url, chatBody())).status).toBe(502);
    expect(ups[0]!.hits.length).toBe(hits + 1);
  });

  it('an ejection that ended early is told once, not again when it would have run out; one that runs out is told then', async () => {
    const { set, gw, events } = await fleet(
      [status(500), healthy(1)],
      outlier({ consecutiveFailures: 2, maxEjectionPercent: 50, baseEjectionMs: 60 }),
    );
    const unejected = () => events.filter((e) => e.type === 'unejected');
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    const b0 = set.get('b0')!;
    expect(b0.state).toBe('ejected');
    // Its first ejection ends early (an engine restart): told at once...
    set.engineRestarted('b0');
    expect(unejected()).toHaveLength(1);
    // ...and not again when it would have run out (60 ms).
    await sleep(150);
    expect(unejected()).toHaveLength(1);
    // Ejected again, for 2 × 60 ms: told when that runs out, and in service again.
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    expect(b0.state).toBe('ejected');
    await vi.waitFor(() => expect(unejected()).toHaveLength(2), { timeout: 2_000, interval: 5 });
    expect(b0.state).toBe('healthy');
  });
});

describe('an ejection ends when the rest of the fleet leaves service (the probe coming back)', () => {
  it('an ejected backend whose probe was down when the last other went is brought back when its probe passes again', async () => {
    const health = [200, 200];
    const script =
      (i: number, serve: Script): Script =>
      (req, res, hit) => {
        if (req.url === '/health') res.writeHead(health[i]!).end();
        else serve(req, res, hit);
      };
    const { set, gw, events } = await fleet([script(0, status(500)), script(1, healthy(1))], {
      ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 50 }),
      ...breaker({ volumeThreshold: 1000 }),
      health: { intervalMs: 30, timeoutMs: 200, path: '/health', unhealthyThreshold: 1, healthyThreshold: 1 },
    });
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    const [b0, b1] = [set.get('b0')!, set.get('b1')!];
    expect(b0.state).toBe('ejected');
    // b0's probe fails (b1 still serves), then b1's: nothing is in service, and b0 is down.
    health[0] = 503;
    await vi.waitFor(() => expect(b0.probe!.up).toBe(false), { timeout: 2_000, interval: 5 });
    health[1] = 503;
    await vi.waitFor(() => expect(b1.state).toBe('down'), { timeout: 2_000, interval: 5 });
    expect(b0.outlier.ejected()).toBe(true);
    // b0's probe passes again: the one backend that can serve is back at once, not after its ejection.
    health[0] = 200;
    await vi.waitFor(() => expect(b0.state).toBe('healthy'), { timeout: 2_000, interval: 5 });
    expect(events.filter((e) => e.type === 'unejected')).toEqual([{ type: 'unejected', backend: 'b0' }]);
  });
});

/**
 * b0 fails every request (the test gateway takes b0, then b1, whatever the model) and is not
 * ejected, the last in service for 'm'; once b1 lists 'm' too, it may go, and is ejected.
 */
async function keptUntilAnotherServesM(url: string, b0: Backend, b1: Backend, events: BackendEvent[]) {
  for (let i = 0; i < 4; i++) expect((await post(url, chatBody())).status).toBe(200);
  expect(b0.outlier.consecutiveFailures).toBeGreaterThanOrEqual(2);
  expect(b0.state).toBe('healthy');
  expect(events.filter((e) => e.type === 'ejected')).toEqual([]);
  b1.learned(new Set(['m', 'other']));
  for (let i = 0; i < 2; i++) expect((await post(url, chatBody())).status).toBe(200);
  expect(b0.state).toBe('ejected');
}

describe('the last backend in service is counted per model', () => {
  it("does not eject the one backend that lists a model, though another model's backend is in service", async () => {
    const { set, gw, events } = await fleet([status(500), healthy(1)], {
      ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 100 }),
      ...breaker({ volumeThreshold: 1000 }),
    });
    const [b0, b1] = [set.get('b0')!, set.get('b1')!];
    b0.learned(new Set(['m']));
    b1.learned(new Set(['other']));
    await keptUntilAnotherServesM(gw.url, b0, b1, events);
  });

  it('a backend whose list is unknown is taken to serve every model another lists: not ejected while it is the last in service for one', async () => {
    const { set, gw, events } = await fleet([status(500), healthy(1), healthy(1)], {
      ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 100 }),
      ...breaker({ volumeThreshold: 1000 }),
    });
    const [b0, b1, b2] = [set.get('b0')!, set.get('b1')!, set.get('b2')!];
    // b0 never listed its models; b1 serves another model; b2, the one that lists 'm', is out.
    b1.learned(new Set(['other']));
    b2.learned(new Set(['m']));
    while (!b2.outlier.ejected()) b2.outlier.failure(() => true);
    await keptUntilAnotherServesM(gw.url, b0, b1, events);
  });

  it("ends an ejection when the model's last other backend leaves service, though another model's backend is still in", async () => {
    const health = [200, 200, 200];
    const script =
      (i: number, serve: Script): Script =>
      (req, res, hit) => {
        if (req.url === '/health') res.writeHead(health[i]!).end();
        else serve(req, res, hit);
      };
    const { set, gw, events } = await fleet(
      [script(0, status(500)), script(1, healthy(1)), script(2, healthy(1))],
      {
        ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 100 }),
        ...breaker({ volumeThreshold: 1000 }),
        health: {
          intervalMs: 30,
          timeoutMs: 200,
          path: '/health',
          unhealthyThreshold: 1,
          healthyThreshold: 1,
        },
      },
    );
    const [b0, b1, b2] = [set.get('b0')!, set.get('b1')!, set.get('b2')!];
    b0.learned(new Set(['m']));
    b1.learned(new Set(['m']));
    b2.learned(new Set(['other']));
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    expect(b0.state).toBe('ejected');
    // b1, the other backend of 'm', fails its probe; b2 (another model) stays in service.
    health[1] = 503;
    await vi.waitFor(() => expect(b1.state).toBe('down'), { timeout: 2_000, interval: 5 });
    expect(b2.state).toBe('healthy');
    expect(b0.state).toBe('healthy');
    const told = events.filter((e) => e.type === 'probe_down' || e.type === 'unejected');
    expect(told).toEqual([
      { type: 'probe_down', backend: 'b1' },
      { type: 'unejected', backend: 'b0' },
    ]);
  });

  it("ends an ejection when the model's other backend drops it from its list", async () => {
    const { set, gw, events } = await fleet([status(500), healthy(1)], {
      ...outlier({ consecutiveFailures: 2, maxEjectionPercent: 100 }),
      ...breaker({ volumeThreshold: 1000 }),
    });
    const [b0, b1] = [set.get('b0')!, set.get('b1')!];
    b0.learned(new Set(['m']));
    b1.learned(new Set(['m', 'other']));
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    expect(b0.state).toBe('ejected');
    const from = events.length;
    b1.learned(new Set(['other']));
    expect(b0.state).toBe('healthy');
    expect(events.slice(from)).toEqual([
      { type: 'models', backend: 'b1', models: ['other'] },
      { type: 'unejected', backend: 'b0' },
    ]);
  });
});

describe('outlier detection: failures after an answer began', () => {
  it('a backend that fails every stream after its first token is ejected, each stream counted in a streak of its own', async () => {
    // b0 sends a first token, then resets the stream; b1 serves.
    const b0: Script = (_req, res) => {
      sseHead(res);
      res.write(roleChunk() + tokenChunk('a'), () => res.destroy());
    };
    const { set, gw, events } = await fleet([b0, healthy(1)], {
      ...outlier({ consecutiveFailures: 3, maxEjectionPercent: 50 }),
      ...breaker({ volumeThreshold: 1000 }),
    });
    for (let i = 0; i < 3; i++) {
      const stream = await openStream(gw.url, '/v1/chat/completions', chatBody()).response;
      await stream.ended;
    }
    expect(set.get('b0')!.state).toBe('ejected');
    expect(events.filter((e) => e.type === 'ejected').map((e) => e.backend)).toEqual(['b0']);
  });
});

describe('outlier detection counts an answer when it begins', () => {
  it('a stream still running when later requests fail has broken their streak: no ejection', async () => {
    let release: () => void = () => {};
    const released = new Promise<void>((r) => {
      release = r;
    });
    let n = 0;
    // b0: two failures, then a stream that holds after its first token, then a failure.
    const b0: Script = async (req, res, hit) => {
      const k = n++;
      if (k === 2) {
        sseHead(res);
        res.write(roleChunk() + tokenChunk('a'));
        await released;
        res.end(tokenChunk('b', 'stop') + 'data: [DONE]\n\n');
        return;
      }
      status(500)(req, res, hit);
    };
    const { set, gw, events } = await fleet([b0, healthy(1)], {
      ...outlier({ consecutiveFailures: 3, maxEjectionPercent: 50 }),
      ...breaker({ volumeThreshold: 1000 }),
    });
    for (let i = 0; i < 2; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    const held = await openStream(gw.url, '/v1/chat/completions', chatBody()).response;
    await held.until((text) => text.includes('"content":"a"'));
    expect((await post(gw.url, chatBody())).status).toBe(200);
    const b = set.get('b0')!;
    expect(b.outlier.consecutiveFailures).toBe(1);
    expect(b.state).toBe('healthy');
    expect(events.filter((e) => e.type === 'ejected')).toEqual([]);
    release();
    expect(await held.ended).toEqual({ complete: true });
  });
});

describe('an engine restart', () => {
  it('ends an ejection for errors the backend answered with, which a passing probe leaves to run', async () => {
    const { ups, set, gw, events } = await fleet(
      [status(500), healthy(1)],
      outlier({ consecutiveFailures: 2, maxEjectionPercent: 50 }),
    );
    for (let i = 0; i < 3; i++) expect((await post(gw.url, chatBody())).status).toBe(200);
    const b0 = set.get('b0')!;
    expect(b0.state).toBe('ejected');
    // Its failures were answers (500s), not failures to reach it: a probe passing changes nothing.
    expect(b0.outlier.probePassed()).toBe(false);
    expect(b0.state).toBe('ejected');
    // A restart of the other backend, which is not ejected, is told and ends nothing; a name the
    // set does not hold is not told at all.
    const told = () => events.filter((e) => e.type === 'engine_restarted' || e.type === 'unejected');
    set.engineRestarted('b1');
    set.engineRestarted('gone');
    expect(told()).toEqual([{ type: 'engine_restarted', backend: 'b1' }]);
    set.engineRestarted('b0');
    expect(told().slice(1)).toEqual([
      { type: 'engine_restarted', backend: 'b0' },
      { type: 'unejected', backend: 'b0' },
    ]);
    expect(b0.state).toBe('healthy');
    // Back in rotation: the next request reaches it first (it still answers 500, and is retried).
    const hits = ups[0]!.hits.length;
    await post(gw.url, chatBody());
    expect(ups[0]!.hits.length).toBe(hits + 1);
    expect(b0.outlier.consecutiveFailures).toBe(1);
    // Another restart: the streak was the old process's. Nothing was ejected, so nothing is told.
    set.engineRestarted('b0');
    expect(b0.outlier.consecutiveFailures).toBe(0);
    expect(told().slice(3)).toEqual([{ type: 'engine_restarted', backend: 'b0' }]);
  });
});

describe('breaker', () => {
  it("the gateway's own refusals, 4xx, 429 and deadline cuts neither open it nor eject (items 10, 11)", async () => {
    let mode = 'reject';
    const script: Script = (req, res, hit) => {
      if (mode === 'reject') return status(400)(req, res, hit);
      if (mode === 'busy') return status(429)(req, res, hit);
      return hang()(req, res, hit);
    };
    const { set, gw } = await fleet(
      [script],
      { ...outlier({ consecutiveFailures: 2 }), ...breaker({ volumeThreshold: 2 }) },
      { deadlineMs: 60 },
    );
    for (const m of ['reject', 'busy', 'hang']) {
      mode = m;
      for (let i = 0; i < 4; i++) await post(gw.url, chatBody());
    }
    expect(gw.results.map((r) => r.reason)).toEqual([
      ...Array(4).fill('upstream_rejected'),
      ...Array(4).fill('upstream_busy'),
      ...Array(4).fill('deadline'),
    ]);
    const b = set.get('b0')!;
    expect(b.breaker.stats.failures).toBe(0);
    expect(b.state).toBe('healthy');
    expect(b.outlier.consecutiveFailures).toBe(0);
  });

  it('opens on failures; half-open lets exactly one trial through and reopens when it fails (item 12)', async () => {
    let ok = false;
    // The next request to reach the backend calls onHit and waits for `hold` (both used once).
    let onHit = () => {};
    let hold = Promise.resolve();
    const script: Script = async (req, res, hit) => {
      const held = hold;
      hold = Promise.resolve();
      onHit();
      onHit = () => {};
      await held;
      await sleep(100);
      return ok ? healthy(1)(req, res, hit) : status(500)(req, res, hit);
    };
    const { ups, set, gw, events } = await fleet([script], {
      ...outlier({ consecutiveFailures: 1000 }),
      ...breaker({ volumeThreshold: 3, resetTimeoutMs: 300 }),
    });
    const b = set.get('b0')!;
    for (let i = 0; i < 3; i++) expect((await post(gw.url, chatBody())).status).toBe(502);
    expect(b.state).toBe('open');
    expect((await post(gw.url, chatBody())).status).toBe(503);
    expect(ups[0]!.hits).toHaveLength(3);

    // Half-open after its 300 ms reset.
    await vi.waitFor(() => expect(b.state).toBe('half_open'), { timeout: 2_000, interval: 5 });
    // The trial reaches the backend and is held there; a second request meanwhile is refused.
    let release = () => {};
    hold = new Promise<void>((r) => {
      release = r;
    });
    const reached = new Promise<void>((r) => {
      onHit = r;
    });
    const trialDone = post(gw.url, chatBody());
    await reached;
    expect(ups[0]!.hits).toHaveLength(4);
    const second = await post(gw.url, chatBody());
    release();
    const trial = await trialDone;
    expect(ups[0]!.hits).toHaveLength(4);
    expect(second.status).toBe(503);
    expect(trial.status).toBe(502);
    expect(b.state).toBe('open');
    expect((await post(gw.url, chatBody())).status).toBe(503);
    expect(ups[0]!.hits).toHaveLength(4);

    ok = true;
    await closesOnTheNextTrial(b, gw.url, events);
  });
});

describe('a half-open trial that says nothing about the backend', () => {
  it("reopens the breaker when the trial ends before its first token for the client's sake, not the backend's", async () => {
    let mode: 'fail' | 'hang' | 'ok' = 'fail';
    let onHit = () => {};
    const script: Script = (req, res, hit) => {
      onHit();
      if (mode === 'hang') return hang()(req, res, hit);
      return mode === 'ok' ? healthy(1)(req, res, hit) : status(500)(req, res, hit);
    };
    const { set, gw, events } = await fleet([script], {
      ...outlier({ consecutiveFailures: 1000 }),
      ...breaker({ volumeThreshold: 3, resetTimeoutMs: 300 }),
    });
    const b = set.get('b0')!;
    for (let i = 0; i < 3; i++) {
      expect((await post(gw.url, chatBody())).status).toBe(502);
      expect(await gw.nextResult()).toMatchObject({ outcome: 'failed_before_commit' });
    }
    expect(b.state).toBe('open');
    await vi.waitFor(() => expect(b.state).toBe('half_open'), { timeout: 2_000, interval: 5 });
    // The trial reaches a backend that has not answered yet, and its client leaves.
    mode = 'hang';
    const reached = new Promise<void>((r) => {
      onHit = r;
    });
    const trial = openStream(gw.url, '/v1/chat/completions', chatBody());
    await reached;
    trial.abort();
    expect(await gw.nextResult()).toMatchObject({ outcome: 'client_cancelled' });
    // Nothing was learnt about the backend: not closed on it, open again until the next trial.
    expect(b.state).toBe('open');
    mode = 'ok';
    await closesOnTheNextTrial(b, gw.url, events);
  });
});

describe('a call that began before the breaker opened', () => {
  it("cancelled by its client during another call's trial, does not throw the trial away", async () => {
    let mode: 'fail' | 'hold' | 'ok' = 'fail';
    let onHit = () => {};
    let release = () => {};
    const script: Script = async (req, res, hit) => {
      onHit();
      if (JSON.stringify(hit.body).includes('old')) return hang()(req, res, hit);
      if (mode === 'hold') {
        await new Promise<void>((r) => {
          release = r;
        });
        return healthy(1)(req, res, hit);
      }
      return mode === 'ok' ? healthy(1)(req, res, hit) : status(500)(req, res, hit);
    };
    const { set, gw, events } = await fleet([script], {
      ...outlier({ consecutiveFailures: 1000 }),
      ...breaker({ volumeThreshold: 3, resetTimeoutMs: 300 }),
    });
    const b = set.get('b0')!;
    // An old call, still waiting for its first token when the breaker opens.
    let reached = new Promise<void>((r) => {
      onHit = r;
    });
    const old = openStream(
      gw.url,
      '/v1/chat/completions',
      chatBody({ messages: [{ role: 'user', content: 'old' }] }),
    );
    await reached;
    // Failures until it opens (the old call counts in the breaker's volume).
    while (b.state !== 'open') expect((await post(gw.url, chatBody())).status).toBe(502);
    await vi.waitFor(() => expect(b.state).toBe('half_open'), { timeout: 2_000, interval: 5 });
    // The trial reaches the backend and is held there; meanwhile the old call's client leaves.
    mode = 'hold';
    reached = new Promise<void>((r) => {
      onHit = r;
    });
    const trial = post(gw.url, chatBody());
    await reached;
    old.abort();
    // Let the old call's end reach the breaker before the trial answers.
    await vi.waitFor(() => expect(gw.active()).toBe(1), { timeout: 2_000, interval: 5 });
    release();
    expect((await trial).status).toBe(200);
    // The trial's answer decided: closed, not opened again by the old call's cancel.
    expect(b.state).toBe('healthy');
    expect(events.map((e) => e.type).filter((t) => t.startsWith('breaker'))).toEqual([
      'breaker_open',
      'breaker_half_open',
      'breaker_close',
    ]);
  });
});

describe('a trial left over from an earlier half-open period', () => {
  it('cancelled by its client during the next period, does not reopen the breaker on the new trial', async () => {
    let mode: 'fail' | 'hold' = 'fail';
    let onHit = () => {};
    const held: (() => void)[] = [];
    let killOld = () => {};
    const script: Script = async (req, res, hit) => {
      onHit();
      if (JSON.stringify(hit.body).includes('old')) {
        // Waits, then its connection dies before any answer: a failure the backend is blamed for.
        await new Promise<void>((r) => {
          killOld = r;
        });
        res.destroy();
        return;
      }
      if (mode === 'hold') {
        await new Promise<void>((r) => held.push(r));
        return healthy(1)(req, res, hit);
      }
      return status(500)(req, res, hit);
    };
    const { set, gw } = await fleet([script], {
      ...outlier({ consecutiveFailures: 1000 }),
      ...breaker({ volumeThreshold: 3, resetTimeoutMs: 300 }),
    });
    const b = set.get('b0')!;
    const reaching = () =>
      new Promise<void>((r) => {
        onHit = r;
      });
    // A call that began before the breaker opened.
    let reached = reaching();
    const old = post(gw.url, chatBody({ messages: [{ role: 'user', content: 'old' }] }));
    await reached;
    while (b.state !== 'open') expect((await post(gw.url, chatBody())).status).toBe(502);
    await vi.waitFor(() => expect(b.state).toBe('half_open'), { timeout: 2_000, interval: 5 });
    // The first period's trial reaches the backend and is held there.
    mode = 'hold';
    reached = reaching();
    const first = openStream(gw.url, '/v1/chat/completions', chatBody());
    await reached;
    // The old call fails meanwhile: the breaker opens again, then half-opens for a new trial.
    killOld();
    await old;
    await vi.waitFor(() => expect(b.state).toBe('open'), { timeout: 2_000, interval: 5 });
    await vi.waitFor(() => expect(b.state).toBe('half_open'), { timeout: 2_000, interval: 5 });
    reached = reaching();
    const second = post(gw.url, chatBody());
    await reached;
    // The first trial's client leaves: a call of an earlier period, it says nothing of this one.
    first.abort();
    await vi.waitFor(() => expect(gw.active()).toBe(1), { timeout: 2_000, interval: 5 });
    expect(b.state).not.toBe('open');
    held[1]!();
    expect((await second).status).toBe(200);
    expect(b.state).toBe('healthy');
    held[0]!();
  });
});

describe('isolation (item 13)', () => {
  it("one request's first-token timeout does not abort another stream on the same backend", async () => {
    const script: Script = async (req, res, hit) => {
      if (JSON.stringify(hit.body).includes('hang')) return hang()(req, res, hit);
      sseHead(res);
      for (const f of chatStream(10)) {
        await sleep(60);
        res.write(f);
      }
      res.end();
    };
    const { gw } = await fleet([script], {}, { cfg: { ...FAST, retries: 0 } });
    const [slow, hung] = await Promise.all([
      post(gw.url, chatBody()),
      post(gw.url, chatBody({ messages: [{ role: 'user', content: 'hang' }] })),
    ]);
    expect(hung.status).toBe(504);
    expect(slow.status).toBe(200);
    expect(slow.text).toBe(
      chatStream(10)
        .filter((f) => !f.includes('"usage"'))
        .join(''),
    );
  });
});

describe('active health probes', () => {
  it('mark a backend down after failed probes and up again after a good one', async () => {
    let healthStatus = 200;
    const script: Script = (req, res, hit) => {
      if (req.url === '/health') {
        res.writeHead(healthStatus).end();
        return;
      }
      return healthy(1)(req, res, hit);
    };
    const { set, gw, events } = await fleet([script], {
      health: { intervalMs: 40, timeoutMs: 200, path: '/health', unhealthyThreshold: 2, healthyThreshold: 1 },
    });
    const b = set.get('b0')!;
    // Its first probe answered (a backend starts healthy, so its state alone would not say so).
    await vi.waitFor(() => expect(b.healthConfirmed).toBe(true), { timeout: 1_000, interval: 10 });
    expect(b.state).toBe('healthy');
    healthStatus = 503;
    await vi.waitFor(() => expect(b.state).toBe('down'), { timeout: 1_000, interval: 10 });
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(503);
    healthStatus = 200;
    await vi.waitFor(() => expect(b.state).toBe('healthy'), { timeout: 1_000, interval: 10 });
    expect((await post(gw.url, chatBody())).status).toBe(200);
    // Its first good probe is told once (the gateway asks an unheard backend its models then).
    expect(events.map((e) => e.type).filter((t) => t.startsWith('probe'))).toEqual([
      'probe_confirmed',
      'probe_down',
      'probe_up',
    ]);
  });

  it('a probe that times out says nothing of a backend that began an answer since the probe before; one that answers nothing is taken out', async () => {
    const probes: number[] = [];
    const server = await upstream((req) => {
      if (req.url === '/health') probes.push(performance.now());
    });
    cleanups.push(server.close);
    let answeredAt: number | null = null;
    const changes: boolean[] = [];
    const probe = new HealthProbe(
      server.url,
      // The first probe has no probe before it and counts: a second failure would take it out.
      { intervalMs: 20, timeoutMs: 40, path: '/health', unhealthyThreshold: 2, healthyThreshold: 1 },
      (up) => changes.push(up),
      () => {},
      () => answeredAt,
    );
    cleanups.push(() => probe.stop());
    // Serving: an answer began after every probe's start (the one before it).
    answeredAt = Number.POSITIVE_INFINITY;
    probe.start();
    await vi.waitFor(() => expect(probes.length).toBeGreaterThanOrEqual(5), { timeout: 2_000, interval: 5 });
    expect(probe.up).toBe(true);
    expect(changes).toEqual([]);
    // Nothing answered since: the next timeout counts.
    answeredAt = null;
    await vi.waitFor(() => expect(probe.up).toBe(false), { timeout: 2_000, interval: 5 });
    expect(changes).toEqual([false]);
  });

  it('a probe that hangs counts as failed after its timeout', async () => {
    const { set } = await fleet([(req) => void req], {
      health: { intervalMs: 20, timeoutMs: 50, path: '/health', unhealthyThreshold: 1, healthyThreshold: 1 },
    });
    await vi.waitFor(() => expect(set.get('b0')!.state).toBe('down'), { timeout: 1_000, interval: 10 });
  });
});

describe('reload', () => {
  it('removing a backend lets its in-flight stream finish, then takes it out of service', async () => {
    const { ups, set, gw } = await fleet([healthy(5, 40)]);
    const inFlight = post(gw.url, chatBody());
    await vi.waitFor(() => expect(ups[0]!.hits).toHaveLength(1));
    const drained = set.update([]);
    expect(set.list()).toEqual([]);
    const res = await inFlight;
    await drained;
    expect(res.status).toBe(200);
    expect(gw.results[0]!.outcome).toBe('ok');
    expect((await post(gw.url, chatBody())).status).toBe(503);
  });

  it('keeps a backend (and its health state) when only its weight changes; replaces it when its URL does', async () => {
    const { ups, set } = await fleet([healthy(1)]);
    const b0 = set.get('b0')!;
    b0.breaker.open();
    await set.update([{ name: 'b0', url: ups[0]!.url, weight: 3 }]);
    expect(set.get('b0')).toBe(b0);
    expect(b0.weight).toBe(3);
    expect(b0.state).toBe('open');
    const other = await upstream(healthy(1));
    cleanups.push(other.close);
    await set.update([{ name: 'b0', url: other.url }]);
    expect(set.get('b0')).not.toBe(b0);
    expect(set.get('b0')!.state).toBe('healthy');
    expect(b0.state).toBe('removed');
  });

  it('removing backends shuts their breakers and probes down: no timer is left (item 14)', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval'] });
    const before = vi.getTimerCount();
    const opts: BackendSetOptions = {
      ...DEFAULT_BACKEND_SET_OPTIONS,
      health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: 1_000 },
    };
    const urls = ['http://127.0.0.1:9', 'http://127.0.0.1:10', 'http://127.0.0.1:11'];
    const set = new BackendSet(
      opts,
      urls.map((url, i) => ({ name: `b${i}`, url })),
    );
    const breakers = set.list().map((b) => b.breaker);
    for (const b of breakers) b.open(); // each open breaker holds a reset timer
    // One shared bucket clock, one probe timer and one reset timer per backend.
    expect(vi.getTimerCount() - before).toBe(1 + 3 + 3);

    await set.update([{ name: 'b0', url: urls[0]! }]);
    expect(vi.getTimerCount() - before).toBe(1 + 1 + 1);
    expect(breakers.map((b) => b.isShutdown)).toEqual([false, true, true]);

    await set.close();
    expect(vi.getTimerCount()).toBe(before);
    expect(breakers.every((b) => b.isShutdown)).toBe(true);
  });
});

describe('breaker events', () => {
  it('reach the listeners after the backend has followed: on a close, the half-open trial is let go', async () => {
    const up = await upstream(healthy(1));
    cleanups.push(() => up.close());
    // What a listener (the scheduler's pump) finds when each event arrives.
    const seen: { type: string; available: boolean }[] = [];
    let set: BackendSet | null = null;
    set = makeSet([up.url], {
      onEvent: (e) => {
        const b = set?.get('b0');
        if (b !== undefined && e.type.startsWith('breaker'))
          seen.push({ type: e.type, available: b.available });
      },
      breaker: { ...DEFAULT_BACKEND_SET_OPTIONS.breaker, resetTimeoutMs: 20 },
    });
    cleanups.push(() => set!.close());
    const b = set.get('b0')!;
    b.breaker.open();
    await vi.waitFor(() => expect(b.breaker.halfOpen).toBe(true), { timeout: 2_000, interval: 5 });
    expect(b.takeTrial()).not.toBeNull();
    expect(b.available).toBe(false);
    // The trial succeeded: the breaker closes, and the pump that event starts may use the backend.
    b.breaker.close();
    expect(seen.at(-1)).toEqual({ type: 'breaker_close', available: true });
  });
});
