// Re-probing a backend the fleet passes over: against loopback backends that answer a completion
// after a delay that grows with its prompt, and the real live state (memory store) whose TTFT
// fits the probes teach.
import type http from 'node:http';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createLiveState, type LiveState } from '../../src/state/index.ts';
import type { BackendSet } from '../../src/upstream/backends.ts';
import {
  MAX_SERIES,
  PROBE_SIZES,
  type ReprobeResult,
  Reprober,
  TICK_MS,
} from '../../src/upstream/reprobe.ts';
import { makeSet, type Script, sleep, upstream } from './helpers.ts';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A backend whose first token takes `baseMs` + `msPerToken` × the prompt's words (its tokens). */
function answering(baseMs: number, msPerToken: number): Script {
  return async (_req: http.IncomingMessage, res: http.ServerResponse, hit) => {
    const prompt = String(hit.body.prompt ?? '');
    const tokens = prompt.split(' ').length;
    await sleep(baseMs + msPerToken * tokens);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({ choices: [{ text: 'x' }], usage: { prompt_tokens: tokens, completion_tokens: 1 } }),
    );
  };
}

const MINUTE = 60_000;

async function setup(scripts: Script[], initialAfterMs = 10_000) {
  let afterMs = initialAfterMs;
  let clock = 1_000_000;
  const ups = await Promise.all(scripts.map((s) => upstream(s)));
  const set: BackendSet = makeSet(ups.map((u) => u.url));
  const live: LiveState = createLiveState(
    { store: 'memory' },
    {
      backends: set.list().map((b) => ({ name: b.name, url: b.url })),
      scrape: false,
      now: () => clock,
    },
  );
  const probes: ReprobeResult[] = [];
  let settled: (() => void) | null = null;
  const reprober = new Reprober({
    backends: () => set.list(),
    live,
    target: () => ({ model: 'm', maxModelLen: 8192 }),
    afterMs: () => afterMs,
    // Longer than any test: a probe ends by its answer or by the reprober, never by this.
    timeoutMs: () => 60_000,
    onProbe: (r) => {
      probes.push(r);
      settled?.();
    },
    now: () => clock,
  });
  cleanups.push(
    ...ups.map((u) => u.close),
    () => set.close(),
    () => live.close(),
    () => reprober.stop(),
  );
  /** Teaches `backend` first tokens of `baseMs` + `msPerToken` × tokens, at prompts of 100–2,000 tokens. */
  const teach = (backend: string, baseMs: number, msPerToken: number, n = 20) => {
    for (let i = 0; i < n; i++) {
      const tokens = n === 1 ? 500 : 100 + Math.round((1900 * i) / (n - 1));
      live.recordFirstToken({
        backend,
        backendTtftMs: baseMs + msPerToken * tokens,
        uncachedPromptTokens: tokens,
        prefillAheadTokens: 0,
        loadAtDispatch: 0,
      });
    }
  };
  /** The timer's next tick, and the probe it sent (null: it sent none), once its answer is learnt. */
  const tickAndWait = async (): Promise<ReprobeResult | null> => {
    clock += TICK_MS;
    const before = probes.length;
    const load = () => set.list().reduce((n, b) => n + live.load(b.name), 0);
    const leased = load();
    const done = new Promise<void>((resolve) => {
      settled = resolve;
    });
    reprober.tick();
    // A probe holds a lease from its send (taken within the tick) to its answer.
    if (load() === leased) return null;
    await done;
    return probes[before] ?? null;
  };
  return {
    ups,
    set,
    live,
    probes,
    teach,
    tickAndWait,
    advance: (ms: number) => {
      clock += ms;
    },
    /**
     * b0 ran three times slower than b1 (their fits say so), both are looked at, and ten minutes
     * later b1 is sent work while b0 is not: b0 is passed over.
     */
    passOver: async () => {
      teach('b0', 120, 0.15);
      teach('b1', 40, 0.05);
      await tickAndWait();
      clock += 10 * MINUTE;
      teach('b1', 40, 0.05, 2);
    },
    /** A reload of upstream.reprobe_after_ms. */
    setAfterMs: (ms: number) => {
      afterMs = ms;
    },
  };
}

describe('Reprober', () => {
  it('times a backend the fleet passes over until its fit predicts what it is now', async () => {
    // b0 ran three times slower than it answers now; b1 is served and learns.
    const t = await setup([answering(40, 0.05), answering(40, 0.05)]);
    t.teach('b0', 120, 0.15);
    t.teach('b1', 40, 0.05);
    t.advance(100); // past the fits' least time between two solves
    const before = t.live.predictTtftMs('b0', 512)!;
    expect(before).toBeGreaterThan(150);
    expect(await t.tickAndWait()).toBeNull(); // nothing passed over yet: the first look
    t.advance(10 * MINUTE);
    t.teach('b1', 40, 0.05, 2);
    const first = await t.tickAndWait();
    expect(first?.backend).toBe('b0');
    expect(t.ups[1]!.hits.length).toBe(0);
    const body = t.ups[0]!.hits[0]!.body;
    expect(body).toMatchObject({ model: 'm', max_tokens: 1, stream: false });
    // The series runs one probe a tick, in turn through the sizes, until it settles.
    let last = first!;
    while (last.more) {
      const next = await t.tickAndWait();
      expect(next).not.toBeNull();
      last = next!;
    }
    const sizes = t.ups[0]!.hits.map((h) => String(h.body.prompt).split(' ').length - 1);
    expect(sizes.slice(0, 3)).toEqual([...PROBE_SIZES]);
    expect(t.probes.length).toBeLessThan(MAX_SERIES);
    // Settled: the last round was predicted within a quarter, and the fit now says what b0 is.
    for (const p of t.probes.slice(-PROBE_SIZES.length))
      expect(Math.abs(p.predictedMs - p.ttftMs) / p.ttftMs).toBeLessThanOrEqual(0.25);
    const after = t.live.predictTtftMs('b0', 512)!;
    expect(after).toBeLessThan(before * 0.6);
    // The series is over: nothing more until reprobe_after_ms has passed again, and only if the
    // fleet was sent work since (its traffic stopped: no probing on and on).
    expect(await t.tickAndWait()).toBeNull();
    t.advance(10_000);
    expect(await t.tickAndWait()).toBeNull();
    t.teach('b1', 40, 0.05, 1);
    expect((await t.tickAndWait())?.backend).toBe('b0');
  });

  it('ends the series at its first round for a backend as slow as its fit says', async () => {
    const t = await setup([answering(120, 0.15), answering(40, 0.05)]);
    await t.passOver();
    const round: ReprobeResult[] = [];
    for (let i = 0; i < PROBE_SIZES.length; i++) round.push((await t.tickAndWait())!);
    expect(round.map((r) => r.backend)).toEqual(['b0', 'b0', 'b0']);
    expect(round.map((r) => r.more)).toEqual([true, true, false]);
    expect(await t.tickAndWait()).toBeNull();
  });

  it('leaves alone a backend that is sent work, one not passed over, and every backend at 0', async () => {
    const t = await setup([answering(40, 0.05), answering(40, 0.05)]);
    t.teach('b0', 120, 0.15);
    t.teach('b1', 40, 0.05);
    await t.tickAndWait();
    // Nobody learnt anything for ten minutes (low traffic): nothing is passed over.
    t.advance(10 * MINUTE);
    expect(await t.tickAndWait()).toBeNull();
    // b0 has a request in flight (another instance's, say): not idle.
    t.teach('b1', 40, 0.05, 2);
    const lease = t.live.lease('b0', { promptTokens: 10, expectedOutputTokens: 1 });
    expect(await t.tickAndWait()).toBeNull();
    lease.end();
    // b0 learnt from a request of its own since: not passed over.
    t.teach('b0', 40, 0.05, 1);
    expect(await t.tickAndWait()).toBeNull();
    t.advance(10_000);
    t.teach('b1', 40, 0.05, 1);
    expect((await t.tickAndWait())?.backend).toBe('b0');
    expect(t.ups[1]!.hits.length).toBe(0);
  });

  it('stops a series once the backend is sent work, and learns nothing from a probe that shared it', async () => {
    let shared: (() => void) | null = null;
    const b0: Script = async (req, res, hit) => {
      // The third probe: a request is sent to b0 while it runs.
      if (hit.index === 2) shared?.();
      await answering(40, 0.05)(req, res, hit);
    };
    const t = await setup([b0, answering(40, 0.05)]);
    await t.passOver();
    expect((await t.tickAndWait())?.more).toBe(true);
    // A request of b0's own ended between two ticks: the series is over at the next one.
    t.teach('b0', 40, 0.05, 1);
    expect(await t.tickAndWait()).toBeNull();
    expect(t.ups[0]!.hits.length).toBe(1);
    // A new series once it is passed over again; its third probe shares b0 with a request.
    t.advance(10_000);
    t.teach('b1', 40, 0.05, 1);
    expect((await t.tickAndWait())?.more).toBe(true);
    let lease: { end(): void } | null = null;
    const arrived = new Promise<void>((resolve) => {
      shared = () => {
        lease = t.live.lease('b0', { promptTokens: 10, expectedOutputTokens: 1 });
        resolve();
      };
    });
    const learnt = t.probes.length;
    const before = t.live.samplesTaught('b0');
    void t.tickAndWait(); // its answer is not learnt: nothing reports it
    await arrived;
    // The probe's lease ends once its answer is in: the test's own lease is left.
    await vi.waitFor(() => expect(t.live.load('b0')).toBe(1));
    expect(t.probes.length).toBe(learnt);
    expect(t.live.samplesTaught('b0')).toBe(before);
    lease!.end();
  });

  it('applies a reload of reprobe_after_ms at once: 0 ends a running series', async () => {
    let release: (() => void) | null = null;
    const b0: Script = async (req, res, hit) => {
      // The second probe waits until the test lets it answer.
      if (hit.index === 1) await new Promise<void>((resolve) => (release = resolve));
      await answering(40, 0.05)(req, res, hit);
    };
    const t = await setup([b0, answering(40, 0.05)]);
    await t.passOver();
    expect((await t.tickAndWait())?.more).toBe(true);
    const learnt = t.live.samplesTaught('b0');
    void t.tickAndWait(); // the second probe, held by b0
    await t.ups[0]!.arrived(1);
    t.setAfterMs(0);
    expect(await t.tickAndWait()).toBeNull(); // it aborted the probe in flight
    await t.ups[0]!.hits[1]!.closed;
    release!();
    expect(t.live.samplesTaught('b0')).toBe(learnt);
    expect(t.live.load('b0')).toBe(0);
    // Back on: a new series only once the backend is passed over again, a whole period after.
    t.setAfterMs(10_000);
    t.teach('b1', 40, 0.05, 1);
    expect(await t.tickAndWait()).toBeNull();
    t.advance(10_000);
    t.teach('b1', 40, 0.05, 1);
    const next = await t.tickAndWait();
    expect(next?.backend).toBe('b0');
    expect(String(t.ups[0]!.hits[2]!.body.prompt).split(' ').length - 1).toBe(PROBE_SIZES[0]);
  });

  it('sends nothing with reprobe_after_ms at 0, nor to a backend out of service', async () => {
    const off = await setup([answering(40, 0.05), answering(40, 0.05)], 0);
    await off.passOver();
    expect(await off.tickAndWait()).toBeNull();

    const t = await setup([answering(40, 0.05), answering(40, 0.05)]);
    await t.passOver();
    t.set.get('b0')!.breaker.open();
    expect(await t.tickAndWait()).toBeNull();
    expect(t.ups[0]!.hits.length).toBe(0);
  });
});
