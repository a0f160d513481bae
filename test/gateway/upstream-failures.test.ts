// Backend failures seen through the whole gateway (simulated replicas with injected faults):
// what the client gets, what the admission record says, and what happens to the backend.
// Checklist items (research/reliability.md): 1, 2, 3, 6, 9, 10, 11, 15.
import { afterEach, describe, expect, it } from 'vitest';
import { startFleet } from '../../src/sim/fleet.ts';
import { LoopLag } from '../helpers/loop-lag.ts';
import { deadUrl } from '../upstream/helpers.ts';
import {
  chat,
  chatStreamText,
  get,
  openStream,
  post,
  replicaAborts,
  type Script,
  scripted,
  sleep,
  sseData,
  startTestGateway,
  type TestGateway,
  waitFor,
} from './harness.ts';

let t: TestGateway | null = null;
afterEach(async () => {
  await t?.close();
  t = null;
});

const CHAT = '/v1/chat/completions';

interface AdminBackend {
  name: string;
  state: string;
  ejected: boolean;
  ejections: number;
  ejected_for_ms: number | null;
  available: boolean;
  local_inflight: number;
  inflight: { requests: number };
}

async function adminBackends(url: string): Promise<AdminBackend[]> {
  return (JSON.parse((await get(url, '/admin/state')).text) as { backends: AdminBackend[] }).backends;
}

/** Nothing left behind: no request in flight at the gateway or on any backend. */
async function expectQuiet(g: TestGateway): Promise<void> {
  await waitFor(
    async () =>
      g.gw.runtime.lifecycle.active === 0 &&
      (await adminBackends(g.url)).every((b) => b.local_inflight === 0 && b.inflight.requests === 0),
    2000,
    'no request in flight',
  );
}

describe('after the commit point (items 1, 2)', () => {
  it('1: a replica that dies mid-stream → one SSE error event, [DONE], failed_after_commit, no retry', async () => {
    t = await startTestGateway({ replicas: 1 });
    await t.fleet!.replicas[0]!.fault({ mode: 'drop', afterTokens: 3 });
    const res = await post(t.url, CHAT, chat({ stream: true, max_tokens: 20 }), { 'x-request-id': 'drop-1' });
    expect(res.status).toBe(200);
    const events = sseData(res.text);
    expect(events.at(-1)).toBe('[DONE]');
    const errors = events.filter((e) => e.startsWith('{"error"'));
    expect(errors).toHaveLength(1);
    expect(JSON.parse(errors[0]!)).toMatchObject({ error: { code: 'upstream_error' } });
    // The tokens before the failure were forwarded once: role chunk + 3 content chunks.
    expect(events.filter((e) => e.includes('"choices":[{')).length).toBe(4);
    const rec = await t.recordOf('drop-1');
    expect(rec).toMatchObject({ outcome: 'failed_after_commit', attempts: 1, backend: 'r0' });
    await expectQuiet(t);
  });

  it('2: 200 then an in-band error event → recorded as an upstream failure', async () => {
    t = await startTestGateway({ replicas: 2 });
    for (const r of t.fleet!.replicas)
      await r.fault({ mode: 'inband_error', afterTokens: 2, message: 'kv oops' });
    const res = await post(t.url, CHAT, chat({ stream: true, max_tokens: 20 }), {
      'x-request-id': 'inband-1',
    });
    expect(res.status).toBe(200);
    const events = sseData(res.text);
    expect(events.filter((e) => e.startsWith('{"error"'))).toHaveLength(1);
    expect(events.at(-1)).toBe('[DONE]');
    expect(res.text).not.toContain('kv oops');
    const rec = await t.recordOf('inband-1');
    expect(rec.outcome).toBe('failed_after_commit');
    expect(rec.attempts).toBe(1);
    expect(rec.sla_met).not.toBe(true);
  });
});

describe('before the commit point (items 3, 6, 15)', () => {
  it('3: a crashed replica → retried on the other one; the record shows 2 attempts and that backend', async () => {
    // No probes: the crashed replica stays in rotation, so requests really hit it first.
    t = await startTestGateway({ replicas: 2, config: { upstream: { health_interval_ms: 60_000 } } });
    await t.fleet!.replicas[0]!.fault({ mode: 'crash' });
    const ids = ['crash-a', 'crash-b', 'crash-c', 'crash-d'];
    for (const id of ids) {
      const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': id });
      expect(res.status).toBe(200);
      expect(res.headers['x-slagate-backend']).toBe('r1');
    }
    const recs = await Promise.all(ids.map((id) => t!.recordOf(id)));
    expect(recs.every((r) => r.outcome === 'ok' && r.backend === 'r1')).toBe(true);
    // Round robin starts half of them on r0.
    expect(recs.filter((r) => r.attempts === 2).length).toBeGreaterThanOrEqual(1);
  });

  it('3: a replica answering 503 → retried on a different replica, never the same one twice', async () => {
    t = await startTestGateway({ replicas: 2 });
    await t.fleet!.replicas[1]!.fault({ mode: 'error', status: 503, message: 'secret-overload-detail' });
    const ids = ['e503-a', 'e503-b', 'e503-c'];
    for (const id of ids) {
      const res = await post(t.url, CHAT, chat(), { 'x-request-id': id });
      expect(res.status).toBe(200);
    }
    const recs = await Promise.all(ids.map((id) => t!.recordOf(id)));
    expect(recs.map((r) => r.backend)).toEqual(['r0', 'r0', 'r0']);
    expect(recs.some((r) => r.attempts === 2)).toBe(true);
    // Every replica down: the last failure is answered with the gateway's own envelope.
    await t.fleet!.replicas[0]!.fault({ mode: 'error', status: 503, message: 'secret-overload-detail' });
    const failed = await post(t.url, CHAT, chat(), { 'x-request-id': 'e503-all' });
    expect(failed.status).toBe(502);
    expect(JSON.parse(failed.text)).toMatchObject({ error: { code: 'upstream_error' } });
    expect(failed.text).not.toContain('secret-overload-detail');
    const all = await t.recordOf('e503-all');
    expect(all).toMatchObject({ outcome: 'failed_before_commit', attempts: 2 });
    // The log says what the client is not told: which status each backend answered.
    expect(all.error).toBe('upstream status 503');
    expect(all.failed_attempts.map((f) => f.status)).toEqual([503, 503]);
  });

  it('6: a replica that sends headers and then nothing → its first-token timeout follows the class, then a retry elsewhere', async () => {
    // Defaults everywhere (first_token_timeout_ms 60 s): the interactive class's 500 ms target and
    // the attempt's prediction set the attempt's timeout, not the 60 s cap.
    t = await startTestGateway({ replicas: 2, config: { upstream: { first_token_timeout_ms: 60_000 } } });
    await t.fleet!.replicas[0]!.fault({ mode: 'hang' });
    // Round robin: at least one of them lands on the hung replica first.
    const ids = ['hang-a', 'hang-b'];
    // The gateway runs in this process: a timer of its is late by as much as this loop stalled.
    const lag = LoopLag.start();
    for (const id of ids) {
      const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': id });
      expect(res.status).toBe(200);
    }
    const stalled = lag.stop();
    const recs = await Promise.all(ids.map((id) => t!.recordOf(id)));
    expect(recs.every((r) => r.outcome === 'ok' && r.backend === 'r1')).toBe(true);
    const retried = recs.filter((r) => r.attempts === 2);
    expect(retried.length).toBeGreaterThan(0);
    for (const r of retried) {
      expect(r.failed_attempts).toEqual([
        {
          backend: 'r0',
          reason: 'first_token_timeout',
          status: expect.toBeOneOf([null, 200]),
          detail: expect.stringMatching(/^no first token within \d+ ms$/),
        },
      ]);
      // It waited at least the class target on the hung replica (never less), and far less than 60 s:
      // the factor × a prediction of a few ms, or × the target without one (4 × 500 ms).
      expect(r.ttft_ms!).toBeGreaterThanOrEqual(500);
      expect(r.ttft_ms!).toBeLessThan(2_500 + stalled);
    }
  });

  it('6: every replica hangs → 504 first_token_timeout, outcome timeout, each upstream aborted', async () => {
    // Scripted backends that send headers and then nothing: each records when its request closed.
    const closed: number[] = [];
    const hang: Script = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
      res.on('close', () => closed.push(performance.now()));
    };
    const backends = [await scripted(hang), await scripted(hang)];
    // No prediction for these backends: each attempt waits factor (2) × the class target (100 ms).
    t = await startTestGateway({
      backends: backends.map((b, i) => ({ name: `h${i}`, url: b.url })),
      config: {
        sla: { default_class: 'fast', classes: { fast: { ttft_p99_ms: 100, tpot_p99_ms: 50, priority: 0 } } },
        upstream: { first_token_timeout_ms: 5_000, first_token_timeout_factor: 2 },
      },
    });
    try {
      const lag = LoopLag.start();
      const started = performance.now();
      const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'hang-all' });
      const took = performance.now() - started;
      const stalled = lag.stop();
      expect(res.status).toBe(504);
      expect(JSON.parse(res.text)).toMatchObject({ error: { code: 'first_token_timeout' } });
      // Two attempts of 200 ms each, then the answer at once (no backend is left to try).
      expect(took).toBeGreaterThanOrEqual(390);
      expect(took).toBeLessThan(1500 + stalled);
      expect(await t.recordOf('hang-all')).toMatchObject({ outcome: 'timeout', attempts: 2 });
      expect(backends.map((b) => b.hits.length)).toEqual([1, 1]);
      // Each hung attempt was aborted upstream when its timer fired, not left to the backend.
      await waitFor(() => closed.length === 2, 1000, 'both hung upstream requests closed');
      // At the first attempt's timer (200 ms), late by no more than this process's loop stalled.
      expect(closed[0]! - started).toBeLessThan(300 + stalled);
    } finally {
      await t.close();
      t = null;
      for (const b of backends) await b.close();
    }
  });

  it('the request deadline (first_token_timeout_ms from arrival) caps every attempt together', async () => {
    const hang: Script = (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
    };
    const backends = [await scripted(hang), await scripted(hang)];
    t = await startTestGateway({
      backends: backends.map((b, i) => ({ name: `h${i}`, url: b.url })),
      config: { upstream: { first_token_timeout_ms: 300 } },
    });
    try {
      const started = performance.now();
      const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'deadline' });
      const took = performance.now() - started;
      expect(res.status).toBe(504);
      expect(took).toBeGreaterThanOrEqual(290);
      expect(took).toBeLessThan(1_000);
      // The one attempt ran out with the deadline, its whole budget given to it: counted against its
      // backend, and no time left for another.
      expect(await t.recordOf('deadline')).toMatchObject({
        outcome: 'timeout',
        reason: 'first_token_timeout',
        attempts: 1,
      });
    } finally {
      await t.close();
      t = null;
      for (const b of backends) await b.close();
    }
  });

  it('a client that reuses its x-request-id on requests in flight together gets each served', async () => {
    // The backend acts as vLLM did from late 2024 up to 0.11: the header is the engine's request
    // id, and a request whose id is still running is refused with a 400.
    const running = new Map<string, () => void>();
    let secondArrived: () => void = () => {};
    const arrivedTwice = new Promise<void>((r) => {
      secondArrived = r;
    });
    const strict: Script = (req, res) => {
      const id = String(req.headers['x-request-id']);
      if (running.has(id)) {
        res.writeHead(400, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ object: 'error', message: `Request id ${id} already running.`, code: 400 }));
        return;
      }
      const finish = () => {
        running.delete(id);
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(chatStreamText(2));
      };
      running.set(id, finish);
      // Both stay running until both have arrived.
      if (running.size === 2) secondArrived();
      arrivedTwice.then(finish);
    };
    const backend = await scripted(strict);
    t = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }] });
    try {
      const [a, b] = await Promise.all([
        post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'reused' }),
        post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'reused' }),
      ]);
      expect([a.status, b.status]).toEqual([200, 200]);
      expect([a.headers['x-request-id'], b.headers['x-request-id']]).toEqual(['reused', 'reused']);
      // Each attempt sent its own id, led by the client's, so the backend's log still finds it.
      const sent = backend.hits.map((h) => String(h.headers['x-request-id']));
      expect(sent).toHaveLength(2);
      expect(new Set(sent).size).toBe(2);
      for (const id of sent) expect(id.startsWith('reused.')).toBe(true);
    } finally {
      await t.close();
      t = null;
      await backend.close();
    }
  });

  it('readyz is not ready until a backend has answered its health probe once', async () => {
    const dead = await deadUrl();
    // Probes every minute: the dead replica is never marked down in this test, only never confirmed.
    t = await startTestGateway({
      backends: [{ name: 'dead', url: dead }],
      config: { upstream: { health_interval_ms: 60_000 } },
    });
    const r = await get(t.url, '/readyz');
    expect(r.status).toBe(503);
    expect(JSON.parse(r.text)).toMatchObject({ status: 'not_ready', healthy_backends: 0 });
    await t.close();
    // A live one is confirmed by the probe at start, without waiting for the interval.
    t = await startTestGateway({ replicas: 1, config: { upstream: { health_interval_ms: 60_000 } } });
    await waitFor(async () => (await get(t!.url, '/readyz')).status === 200, 3000, 'readyz ready');
  });

  it('15: all replicas down → fast 503 no_healthy_backend with Retry-After, readyz not ready', async () => {
    t = await startTestGateway({ replicas: 2 });
    for (const r of t.fleet!.replicas) await r.fault({ mode: 'crash' });
    await waitFor(async () => (await get(t!.url, '/readyz')).status === 503, 3000, 'readyz not ready');
    expect(JSON.parse((await get(t.url, '/readyz')).text)).toMatchObject({ status: 'not_ready' });
    const started = performance.now();
    const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'down-1' });
    expect(performance.now() - started).toBeLessThan(500);
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(JSON.parse(res.text)).toMatchObject({ error: { code: 'no_healthy_backend' } });
    expect(await t.recordOf('down-1')).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'no_healthy_backend',
      attempts: 0,
    });
    // They come back: probes notice and traffic flows again.
    for (const r of t.fleet!.replicas) await r.reset();
    await waitFor(async () => (await get(t!.url, '/readyz')).status === 200, 3000, 'readyz ready');
    expect((await post(t.url, CHAT, chat())).status).toBe(200);
  });
});

describe('what counts against a backend (items 9, 10, 11)', () => {
  const ejecting = { upstream: { outlier: { consecutive_failures: 2, max_ejection_percent: 50 } } };

  it('9: consecutive 5xx eject a replica; traffic then goes only to the others', async () => {
    t = await startTestGateway({ replicas: 2, config: ejecting });
    await t.fleet!.replicas[0]!.fault({ mode: 'error', status: 500 });
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    const [r0, r1] = await adminBackends(t.url);
    expect(r0!.available).toBe(false);
    expect(r0!.state).toBe('ejected');
    // Its first ejection, the default base of 30 s, under way; r1 never ejected.
    expect(r0!.ejections).toBe(1);
    expect(r0!.ejected_for_ms).toBeGreaterThan(25_000);
    expect(r0!.ejected_for_ms).toBeLessThanOrEqual(30_000);
    expect(r1).toMatchObject({ name: 'r1', ejected: false, ejections: 0, ejected_for_ms: null });
    const metrics = (await get(t.url, '/metrics')).text;
    expect(metrics).toContain('slagate_backend_ejections_total{backend="r0"} 1\n');
    expect(metrics).toContain('slagate_backend_ejections_total{backend="r1"} 0\n');
    const before = (await t.records()).length;
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    const after = (await t.records()).slice(before);
    expect(after.every((r) => r.attempts === 1 && r.backend === 'r1')).toBe(true);
  });

  it('9: ejection respects max_ejection_percent, which binds before the last-in-service rule', async () => {
    // 4 replicas at 50%: the cap allows 2 ejected, while "never the last in service" alone would
    // allow 3. Every replica fails every request, and each gets far more than 2 failures in a row.
    t = await startTestGateway({ replicas: 4, config: ejecting });
    for (const r of t.fleet!.replicas) await r.fault({ mode: 'error', status: 500 });
    for (let i = 0; i < 8; i++) expect((await post(t.url, CHAT, chat())).status).toBe(502);
    const recs = await t.records();
    for (const name of ['r0', 'r1', 'r2', 'r3']) {
      const failures = recs.flatMap((r) => r.failed_attempts).filter((f) => f.backend === name);
      expect(failures.length).toBeGreaterThanOrEqual(2);
    }
    const states = await adminBackends(t.url);
    expect(states.filter((b) => b.state === 'ejected').length).toBe(2);
    expect(states.filter((b) => b.available).length).toBe(2);
  });

  it('every backend busy (429) is a 503 with Retry-After for the client, not a backend failure', async () => {
    t = await startTestGateway({ replicas: 2 });
    for (const r of t.fleet!.replicas) await r.fault({ mode: 'error', status: 429 });
    const res = await post(t.url, CHAT, chat(), { 'x-request-id': 'all-busy' });
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toMatch(/^[1-9]\d*$/);
    expect(JSON.parse(res.text)).toMatchObject({ error: { code: 'no_healthy_backend' } });
    expect(JSON.parse(res.text).error.message).toContain('busy');
    const rec = await t.recordOf('all-busy');
    expect(rec).toMatchObject({ outcome: 'failed_before_commit', reason: 'no_healthy_backend', attempts: 2 });
    expect(rec.failed_attempts.map((f) => f.reason)).toEqual(['upstream_busy', 'upstream_busy']);
    // A backend's 500 on the last attempt is still a backend failure: 502.
    await t.fleet!.replicas[1]!.fault({ mode: 'error', status: 500 });
    await t.fleet!.replicas[0]!.fault({ mode: 'error', status: 500 });
    expect((await post(t.url, CHAT, chat())).status).toBe(502);
  });

  it('10: refusals (gateway 4xx, backend 429 busy, relayed 400) never eject a replica', async () => {
    // Settings under which two real failures of r0 eject it and open its breaker (the control at
    // the end shows they do), and r1 to take the traffic r0 refuses, so r0 is not the last in service.
    t = await startTestGateway({
      replicas: 2,
      config: {
        upstream: {
          outlier: { consecutive_failures: 2, max_ejection_percent: 50, base_ejection_ms: 30_000 },
          breaker: { volume_threshold: 2, reset_timeout_ms: 30_000 },
        },
      },
    });
    const r0State = async () => (await adminBackends(t!.url)).find((b) => b.name === 'r0')!;
    // The gateway's own refusals: unknown model, bad body.
    for (let i = 0; i < 3; i++) {
      expect((await post(t.url, CHAT, chat({ model: 'nope' }))).status).toBe(404);
      expect((await post(t.url, CHAT, { messages: [] })).status).toBe(400);
    }
    const r0 = t.fleet!.replicas[0]!;
    // The backend's "too busy": retried on r1.
    await r0.fault({ mode: 'error', status: 429 });
    for (let i = 0; i < 6; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    const busy = (await t.records())
      .flatMap((r) => r.failed_attempts)
      .filter((f) => f.backend === 'r0' && f.reason === 'upstream_busy');
    expect(await r0State()).toMatchObject({ available: true, state: 'healthy' });
    expect(busy.length).toBeGreaterThanOrEqual(3);
    // Its validation errors: relayed to the client, no retry.
    await r0.fault({ mode: 'error', status: 400 });
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++) statuses.push((await post(t.url, CHAT, chat())).status);
    expect(await r0State()).toMatchObject({ available: true, state: 'healthy' });
    expect(statuses.filter((s) => s === 400).length).toBeGreaterThanOrEqual(3);
    expect(statuses.every((s) => s === 200 || s === 400)).toBe(true);
    await r0.reset();
    // r0 still takes traffic.
    const before = (await t.records()).length;
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    expect((await t.records()).slice(before).some((r) => r.backend === 'r0')).toBe(true);
    // Control: as many real failures (500) do take r0 out of service under these settings.
    await r0.fault({ mode: 'error', status: 500 });
    for (let i = 0; i < 6; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    expect((await r0State()).available).toBe(false);
  });

  it('11: client cancels are not failures: no ejection, no breaker opening, outcome client_cancelled', async () => {
    t = await startTestGateway({
      replicas: 1,
      timeScale: 0.2,
      config: { ...ejecting, upstream: { ...ejecting.upstream, breaker: { volume_threshold: 2 } } },
    });
    for (let i = 0; i < 4; i++) {
      const s = openStream(t.url, CHAT, chat({ stream: true, max_tokens: 200, ignore_eos: true }), {
        'x-request-id': `cancel-${i}`,
      });
      const res = await s.response;
      await res.until((text) => sseData(text).length >= 3);
      res.close();
      await res.ended;
    }
    await waitFor(async () => (await t!.records()).length === 4, 2000, 'four records');
    for (let i = 0; i < 4; i++) {
      expect(await t.recordOf(`cancel-${i}`)).toMatchObject({ outcome: 'client_cancelled', sla_met: null });
    }
    const [state] = await adminBackends(t.url);
    expect(state).toMatchObject({ available: true, state: 'healthy' });
    await waitFor(async () => (await replicaAborts(t!.fleet!.urls[0]!)) === 4, 2000, 'four aborts');
    await sleep(20);
    expect((await post(t.url, CHAT, chat())).status).toBe(200);
  });
});

describe('failures that never reached the engine, and coming back (found when tried as a new user would)', () => {
  it('a replica resetting every connection before answering loses no request of a burst of 12 streams', async () => {
    // Accepts the connection and resets it before any response: the request cannot have reached
    // an engine, so every one is retried on the other replica, whatever the retry budget says.
    const resetter = await scripted((req) => req.socket.destroy());
    const fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.1 });
    t = await startTestGateway({
      backends: [
        { name: 'reset', url: resetter.url },
        { name: 'ok', url: fleet.urls[0]! },
      ],
      config: { upstream: { retries: 0 } },
    });
    try {
      const ids = Array.from({ length: 12 }, (_, i) => `burst-${i}`);
      const responses = await Promise.all(
        ids.map((id) => post(t!.url, CHAT, chat({ stream: true }), { 'x-request-id': id })),
      );
      expect(responses.map((r) => r.status)).toEqual(ids.map(() => 200));
      const recs = await Promise.all(ids.map((id) => t!.recordOf(id)));
      expect(recs.every((r) => r.outcome === 'ok' && r.backend === 'ok')).toBe(true);
      // Several went to the resetting replica first and were retried: no retries were configured
      // and the budget would allow 3 at most, so this is the rule for pre-engine failures at work.
      const retried = recs.filter((r) => r.attempts === 2);
      expect(retried.length).toBeGreaterThan(3);
      for (const r of retried)
        expect(r.failed_attempts).toEqual([
          { backend: 'reset', reason: 'upstream_reset', status: null, detail: expect.any(String) },
        ]);
    } finally {
      await t.close();
      t = null;
      await fleet.close();
      await resetter.close();
    }
  });

  it('a replica ejected for refusing connections is back in service at its first passing probe', async () => {
    t = await startTestGateway({
      replicas: 2,
      config: {
        upstream: {
          outlier: { consecutive_failures: 3, base_ejection_ms: 30_000, max_ejection_percent: 50 },
        },
      },
    });
    const r0 = t.fleet!.replicas[0]!;
    await r0.fault({ mode: 'refuse' });
    // Sent together, so that three reach r0 (and are refused there) within one probe interval:
    // two failed probes take it out of service first, and sent one by one on a busy machine, too
    // few had reached it by then for an ejection.
    const statuses = await Promise.all(Array.from({ length: 8 }, () => post(t!.url, CHAT, chat())));
    expect(statuses.map((r) => r.status)).toEqual(statuses.map(() => 200));
    // Ejected (its state may say 'down' first: the active probe fails too).
    await waitFor(
      async () => (await adminBackends(t!.url)).find((b) => b.name === 'r0')!.ejected,
      2000,
      'r0 ejected',
    );
    // It comes back: within a few probe intervals (100 ms here), not the 30 s ejection.
    const back = performance.now();
    await r0.reset();
    await waitFor(
      async () => {
        const r = (await adminBackends(t!.url)).find((b) => b.name === 'r0')!;
        return r.available && !r.ejected;
      },
      2000,
      'r0 back',
    );
    expect(performance.now() - back).toBeLessThan(2000);
    const before = (await t.records()).length;
    for (let i = 0; i < 6; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    expect((await t.records()).slice(before).some((r) => r.backend === 'r0')).toBe(true);
  });

  it('an ejection for errors the replica answered with (5xx) is not ended by its passing /health', async () => {
    t = await startTestGateway({
      replicas: 2,
      config: {
        upstream: {
          outlier: { consecutive_failures: 2, base_ejection_ms: 30_000, max_ejection_percent: 50 },
        },
      },
    });
    await t.fleet!.replicas[0]!.fault({ mode: 'error', status: 500 });
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    expect((await adminBackends(t.url)).find((b) => b.name === 'r0')!.state).toBe('ejected');
    // Several probe intervals pass, every probe answers 200: still ejected.
    await new Promise((r) => setTimeout(r, 500));
    expect((await adminBackends(t.url)).find((b) => b.name === 'r0')!.state).toBe('ejected');
  });

  it('a replica ejected for its errors, then crashed and restarted, is back in service once its restart is seen', async () => {
    t = await startTestGateway({
      replicas: 2,
      config: {
        upstream: {
          metrics_scrape_interval_ms: 50,
          outlier: { consecutive_failures: 2, base_ejection_ms: 30_000, max_ejection_percent: 50 },
        },
      },
    });
    const r0 = t.fleet!.replicas[0]!;
    // Served first, so that its counters are above 0 when the gateway scrapes them.
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    await waitFor(() => (t!.gw.runtime.live.telemetry('r0')?.prefixQueries ?? 0) > 0, 2000, 'r0 scraped');
    await r0.fault({ mode: 'error', status: 500 });
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    expect((await adminBackends(t.url)).find((b) => b.name === 'r0')!.state).toBe('ejected');
    // The process dies and a new one listens 300 ms later: a cold cache, counters from 0, no fault.
    // Back within a scrape and a probe or two of that, not the 30 s ejection.
    await r0.fault({ mode: 'crash', durationMs: 300 });
    await waitFor(
      async () => {
        const r = (await adminBackends(t!.url)).find((b) => b.name === 'r0')!;
        return r.available && !r.ejected;
      },
      5000,
      'r0 back',
    );
    // The new process has no fault: the old one's 500s went with it.
    expect(r0.stats().fault).toBeNull();
    // One ejection, one restart, both counted for the operator.
    const metrics = (await get(t.url, '/metrics')).text;
    expect(metrics).toContain('slagate_backend_ejections_total{backend="r0"} 1\n');
    expect(metrics).toContain('slagate_backend_engine_restarts_total{backend="r0"} 1\n');
    expect(metrics).toContain('slagate_backend_engine_restarts_total{backend="r1"} 0\n');
    const before = (await t.records()).length;
    for (let i = 0; i < 4; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    const served = (await t.records()).slice(before);
    expect(served.some((r) => r.backend === 'r0' && r.attempts === 1)).toBe(true);
  });
});

it('a replica that served nothing, crashed and restarted, is seen restarting by its process start time', async () => {
  t = await startTestGateway({ replicas: 2, config: { upstream: { metrics_scrape_interval_ms: 50 } } });
  const r0 = t.fleet!.replicas[0]!;
  await waitFor(() => t!.gw.runtime.live.telemetry('r0')?.scrapedAt != null, 2000, 'r0 scraped');
  // Its counters are at 0 and stay there: only the later start time tells the new process.
  expect(t.gw.runtime.live.telemetry('r0')?.prefixQueries).toBe(0);
  await r0.fault({ mode: 'crash', durationMs: 300 });
  await waitFor(
    async () =>
      (await get(t!.url, '/metrics')).text.includes(
        'slagate_backend_engine_restarts_total{backend="r0"} 1\n',
      ),
    5000,
    'r0 restart counted',
  );
  expect((await get(t.url, '/metrics')).text).toContain(
    'slagate_backend_engine_restarts_total{backend="r1"} 0\n',
  );
});

describe("the predictor's error", () => {
  it('is learnt from requests served by their first attempt only: a retry waited through a failure no prediction covers', async () => {
    const broken = await scripted((_req, res) => res.writeHead(503).end());
    const fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.1 });
    try {
      t = await startTestGateway({
        backends: [
          { name: 'bad', url: broken.url },
          { name: 'good', url: fleet.urls[0]! },
        ],
        config: { router: { policy: 'round_robin' } },
      });
      // Round robin: about half go to `bad` first, answered 503, and are retried on `good`.
      for (let i = 0; i < 12; i++) {
        const res = await post(t.url, CHAT, chat({ max_tokens: 8 }), { 'x-request-id': `p-${i}` });
        expect(res.status, res.text).toBe(200);
      }
      const recs = await t.records();
      const predicted = recs.filter((r) => r.outcome === 'ok' && r.predicted_ttft_ms !== null);
      const first = predicted.filter((r) => r.attempts === 1).length;
      // Both kinds had a prediction (once `good` had its fit).
      expect(first).toBeGreaterThan(0);
      expect(predicted.filter((r) => r.attempts === 2).length).toBeGreaterThan(0);
      const state = JSON.parse((await get(t.url, '/admin/state')).text) as {
        admission: { prediction_error: { samples: number } };
      };
      expect(state.admission.prediction_error.samples).toBe(first);
    } finally {
      await t?.close();
      t = null;
      await fleet.close();
      await broken.close();
    }
  });
});
