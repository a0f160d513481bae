// The gateway's queue seen from outside: late dispatch under the per-backend limit, what is
// measured about the wait, and every way a waiting request can be refused or leave.
// Checklist items (research/reliability.md): 19, 32.
import { afterEach, describe, expect, it } from 'vitest';
import {
  chat,
  get,
  openStream,
  post,
  type Script,
  scripted,
  sseData,
  startTestGateway,
  type TestGateway,
  waitFor,
} from './harness.ts';

const CHAT = '/v1/chat/completions';
const cleanups: (() => Promise<void>)[] = [];
let t: TestGateway | null = null;
afterEach(async () => {
  await t?.close();
  t = null;
  for (const c of cleanups.splice(0).reverse()) await c();
});

const frame = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const chunk = (delta: object, finish: string | null) => ({
  id: 'chatcmpl-x',
  object: 'chat.completion.chunk',
  created: 1,
  model: 'm',
  choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
});

/**
 * A backend whose streams send their first token at once and finish only when released: a slot
 * held for exactly as long as a test wants. `open` counts the streams it has started.
 */
async function gated() {
  const pending: (() => void)[] = [];
  const script: Script = (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(frame(chunk({ role: 'assistant', content: '' }, null)));
    pending.push(() => {
      res.write(frame(chunk({ content: ' done' }, 'stop')));
      res.write(
        frame({
          ...chunk({}, null),
          choices: [],
          usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 },
        }),
      );
      res.end('data: [DONE]\n\n');
    });
  };
  const backend = await scripted(script);
  cleanups.push(backend.close);
  return {
    backend,
    open: () => pending.length,
    release: () => pending.shift()?.(),
  };
}

/** One backend with a limit of one request at a time (the closed loop held at 1). */
const oneAtATime = (extra: Record<string, unknown> = {}) => ({
  scheduler: { concurrency: { min: 1, max: 1, initial: 1 }, ...extra },
});

interface AdminState {
  scheduler: { queued: number; retries: number; queue_by_class: Record<string, number> };
  backends: { name: string; by_class: Record<string, { queue: { p50: number | null } }> | null }[];
}

describe('late dispatch and what is measured about the wait', () => {
  it('a request waits in the gateway while the backend is at its limit; its wait is measured everywhere', async () => {
    const g = await gated();
    t = await startTestGateway({ backends: [{ name: 'g0', url: g.backend.url }], config: oneAtATime() });
    const holder = await openStream(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'holder' })
      .response;
    await holder.until((s) => s.includes('"role"'));
    const waiting = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'waiter' });
    // It is queued at the gateway, not sent to the backend.
    await waitFor(
      async () => (JSON.parse((await get(t!.url, '/admin/state')).text) as AdminState).scheduler.queued === 1,
      2000,
      'queued',
    );
    expect(g.backend.hits).toHaveLength(1);
    const state = JSON.parse((await get(t.url, '/admin/state')).text) as AdminState;
    expect(state.scheduler.queue_by_class).toEqual({ interactive: 1 });
    const metricsWhile = (await get(t.url, '/metrics')).text;
    expect(metricsWhile).toMatch(/^slagate_queue_depth\{class="interactive"\} 1$/m);
    await new Promise((r) => setTimeout(r, 150));
    g.release();
    await holder.ended;
    await waitFor(() => g.open() === 1, 2000, 'the waiter dispatched');
    // None waits now: the class is left out, not listed at 0.
    const drained = JSON.parse((await get(t.url, '/admin/state')).text) as AdminState;
    expect(drained.scheduler.queue_by_class).toEqual({});
    g.release();
    const res = await waiting;
    expect(res.status).toBe(200);
    const rec = await t.recordOf('waiter');
    // Measured, never a placeholder: the header, the record and the metrics agree.
    expect(rec.queue_ms!).toBeGreaterThanOrEqual(140);
    expect(Number(res.headers['x-slagate-queue-ms'])).toBeCloseTo(rec.queue_ms!, 0);
    expect(rec.ttft_ms!).toBeGreaterThanOrEqual(rec.queue_ms!);
    const metrics = (await get(t.url, '/metrics')).text;
    const count = /^slagate_queue_wait_seconds_count\{class="interactive",backend="g0"\} (\d+)$/m.exec(
      metrics,
    );
    expect(Number(count?.[1])).toBe(2);
    expect(metrics).toMatch(/^slagate_backend_concurrency_limit\{backend="g0"\} 1$/m);
    // And the live windows' queue percentiles in /admin/state.
    const after = JSON.parse((await get(t.url, '/admin/state')).text) as AdminState;
    expect(after.backends[0]!.by_class!.interactive!.queue.p50).not.toBeNull();
  });

  it('a retry goes back through the queue and obeys the same limits as a first attempt', async () => {
    const g = await gated();
    const broken = await scripted((_req, res) => res.writeHead(503).end());
    cleanups.push(broken.close);
    t = await startTestGateway({
      backends: [
        { name: 'bad', url: broken.url },
        { name: 'g0', url: g.backend.url },
      ],
      config: oneAtATime({ policy: 'slagate' }),
    });
    // g0 is busy with a held stream; the next request fails on `bad` and must wait for g0.
    const holder = await openStream(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'holder2' })
      .response;
    await holder.until((s) => s.includes('"role"'));
    expect(g.open()).toBe(1);
    const retried = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'retried' });
    await waitFor(() => broken.hits.length === 1, 2000, 'the first attempt on the broken backend');
    // The 503 handled: the retry waits in the scheduler for a slot.
    await waitFor(
      async () =>
        (JSON.parse((await get(t!.url, '/admin/state')).text) as AdminState).scheduler.retries === 1,
      2000,
      'the retry waiting',
    );
    // Queued by now: from here to the release it waits, and that wait must be in its queue_ms.
    const queuedSeenAt = performance.now();
    await new Promise((r) => setTimeout(r, 150));
    // It did not go to g0 beside the held stream: g0 still serves one.
    expect(g.backend.hits).toHaveLength(1);
    const releasedAt = performance.now();
    g.release();
    await waitFor(() => g.open() === 1 && g.backend.hits.length === 2, 2000, 'the retry dispatched');
    g.release();
    expect((await retried).status).toBe(200);
    const rec = await t.recordOf('retried');
    expect(rec).toMatchObject({ outcome: 'ok', attempts: 2, backend: 'g0' });
    // The status the backend answered, which the reason alone does not say (500 or 503).
    expect(rec.failed_attempts).toEqual([
      { backend: 'bad', reason: 'upstream_status', status: 503, detail: 'upstream status 503' },
    ]);
    // The retry waited in the queue from before it was seen there until the release (the 150 ms
    // held and more): that wait is in queue_ms.
    expect(rec.queue_ms!).toBeGreaterThanOrEqual(releasedAt - queuedSeenAt);
  });
});

describe('refusals while queued (item 32)', () => {
  it('queue full → an immediate 429 queue_full with Retry-After, never sent upstream', async () => {
    const g = await gated();
    t = await startTestGateway({
      backends: [{ name: 'g0', url: g.backend.url }],
      config: oneAtATime({ max_queue: 1 }),
    });
    const holder = await openStream(t.url, CHAT, chat({ stream: true })).response;
    await holder.until((s) => s.includes('"role"'));
    // The one slot stays held until after the refusal: a 429 queue_full answered meanwhile did
    // not wait for it.
    const queued = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'in-queue' });
    await waitFor(
      async () => (JSON.parse((await get(t!.url, '/admin/state')).text) as AdminState).scheduler.queued === 1,
      2000,
      'queued',
    );
    const full = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'full' });
    expect(full.status).toBe(429);
    expect(Number(full.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(JSON.parse(full.text)).toMatchObject({ error: { code: 'queue_full', type: 'rate_limit_error' } });
    expect(await t.recordOf('full')).toMatchObject({
      outcome: 'refused',
      decision: 'refused',
      reason: 'queue_full',
      backend: null,
    });
    g.release();
    await waitFor(() => g.open() === 1, 2000, 'the queued one dispatched');
    g.release();
    expect((await queued).status).toBe(200);
    expect(g.backend.hits).toHaveLength(2);
  });

  it('still queued at its latest start → 429 queue_timeout, not served late', async () => {
    const g = await gated();
    t = await startTestGateway({
      backends: [{ name: 'g0', url: g.backend.url }],
      config: {
        ...oneAtATime(),
        sla: {
          default_class: 'quick',
          classes: { quick: { ttft_p99_ms: 300, tpot_p99_ms: 50, priority: 0 } },
        },
      },
    });
    const holder = await openStream(t.url, CHAT, chat({ stream: true })).response;
    await holder.until((s) => s.includes('"role"'));
    const t0 = performance.now();
    const late = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'late' });
    const waited = performance.now() - t0;
    expect(late.status).toBe(429);
    expect(late.headers['retry-after']).toBeDefined();
    expect(JSON.parse(late.text)).toMatchObject({ error: { code: 'queue_timeout' } });
    // No prediction for this backend yet: its latest start is the arrival plus the whole target.
    expect(waited).toBeGreaterThanOrEqual(290);
    expect(waited).toBeLessThan(1000);
    const rec = await t.recordOf('late');
    expect(rec).toMatchObject({
      outcome: 'refused',
      decision: 'refused',
      reason: 'queue_timeout',
      attempts: 0,
    });
    expect(rec.queue_ms!).toBeGreaterThanOrEqual(290);
    expect(g.backend.hits).toHaveLength(1);
    g.release();
  });

  it('x-slagate-no-queue: 1 refuses at once instead of waiting, and does nothing when there is room', async () => {
    const g = await gated();
    t = await startTestGateway({ backends: [{ name: 'g0', url: g.backend.url }], config: oneAtATime() });
    const first = await openStream(t.url, CHAT, chat({ stream: true }), { 'x-slagate-no-queue': '1' })
      .response;
    await first.until((s) => s.includes('"role"'));
    expect(first.status).toBe(200);
    const refused = await post(t.url, CHAT, chat({ stream: true }), {
      'x-slagate-no-queue': '1',
      'x-request-id': 'nq',
    });
    expect(refused.status).toBe(429);
    expect(JSON.parse(refused.text).error).toMatchObject({
      code: 'queue_full',
      message: expect.stringContaining('x-slagate-no-queue'),
    });
    expect((await t.recordOf('nq')).reason).toBe('queue_full');
    g.release();
  });

  it('19: a client that leaves while queued is out of the queue at once, never dispatched, client_cancelled', async () => {
    const g = await gated();
    t = await startTestGateway({ backends: [{ name: 'g0', url: g.backend.url }], config: oneAtATime() });
    const holder = await openStream(t.url, CHAT, chat({ stream: true })).response;
    await holder.until((s) => s.includes('"role"'));
    const leaving = openStream(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'leaver' });
    await waitFor(
      async () => (JSON.parse((await get(t!.url, '/admin/state')).text) as AdminState).scheduler.queued === 1,
      2000,
      'queued',
    );
    leaving.abort();
    await waitFor(
      async () => (JSON.parse((await get(t!.url, '/admin/state')).text) as AdminState).scheduler.queued === 0,
      2000,
      'left the queue',
    );
    g.release();
    await holder.ended;
    // A later request gets the slot; the one that left never reached the backend.
    const next = post(t.url, CHAT, chat({ stream: true }));
    await waitFor(() => g.open() === 1, 2000, 'next dispatched');
    g.release();
    expect((await next).status).toBe(200);
    expect(g.backend.hits).toHaveLength(2);
    const rec = await t.recordOf('leaver');
    expect(rec).toMatchObject({ outcome: 'client_cancelled', backend: null, attempts: 0 });
  });
});

describe('upstream.forward_priority', () => {
  it("sends the class priority as vLLM's priority field when on, nothing when off", async () => {
    const seen: unknown[] = [];
    const b = await scripted((req, res, hit) => {
      seen.push((JSON.parse(hit.body) as { priority?: unknown }).priority);
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(`${frame(chunk({ role: 'assistant', content: '' }, 'stop'))}data: [DONE]\n\n`);
      void req;
    });
    cleanups.push(b.close);
    for (const forward of [true, false]) {
      t = await startTestGateway({
        backends: [{ name: 'p0', url: b.url }],
        config: { upstream: { forward_priority: forward } },
      });
      const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-slagate-class': 'batch' });
      expect(sseData(res.text).at(-1)).toBe('[DONE]');
      await t.close();
      t = null;
    }
    // batch is priority 2 in the default classes.
    expect(seen).toEqual([2, undefined]);
  });
});
