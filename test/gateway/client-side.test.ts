// The client's side of a request through the whole gateway: hanging up mid-stream, a healthy POST
// that must not be aborted early (fastify #4690), hanging up while waiting for a connection.
// Checklist items (research/reliability.md): 17, 18, 19. And how a client that left is judged
// against its SLA.
import type { ServerResponse } from 'node:http';
import { afterEach, expect, it } from 'vitest';
import { LoopLag } from '../helpers/loop-lag.ts';
import { stageReached } from '../helpers/stages.ts';
import {
  chat,
  chatStreamText,
  get,
  openStream,
  post,
  replicaAborts,
  replicaRequests,
  scripted,
  sseData,
  startTestGateway,
  type TestGateway,
  waitFor,
} from './harness.ts';

let t: TestGateway | null = null;
const after: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  await t?.close();
  t = null;
  for (const f of after.splice(0)) await f();
});

const CHAT = '/v1/chat/completions';
const long = (extra: Record<string, unknown> = {}) =>
  chat({ stream: true, max_tokens: 400, ignore_eos: true, ...extra });

it('17: a client that hangs up mid-stream → the engine drops the request within 100 ms; client_cancelled', async () => {
  t = await startTestGateway({ replicas: 1, timeScale: 0.2 });
  const replica = t.fleet!.replicas[0]!;
  const s = openStream(t.url, CHAT, long(), { 'x-request-id': 'gone-1' });
  const res = await s.response;
  await res.until((text) => sseData(text).length >= 5);
  expect(replica.stats().engine.running).toBe(1);
  // The moment the engine itself drops the request, taken inside its abort (the engine runs in
  // this process): the bound is on the gateway's reaction, not on how often a test polls.
  let abortedAt = Number.NaN;
  const abort = replica.engine.abort.bind(replica.engine);
  replica.engine.abort = (id) => {
    abortedAt = performance.now();
    return abort(id);
  };
  const lag = LoopLag.start();
  const closedAt = performance.now();
  res.close();
  await waitFor(() => replica.stats().engine.running === 0, 1000, 'engine request aborted');
  expect(abortedAt - closedAt).toBeLessThan(100 + lag.stop());
  expect(await replicaAborts(replica.url)).toBe(1);
  await waitFor(async () => (await t!.records()).length === 1, 1000, 'the record');
  expect(await t.recordOf('gone-1')).toMatchObject({
    outcome: 'client_cancelled',
    backend: 'r0',
    attempts: 1,
    sla_met: null,
    // The backend did not fail: the client left. Nothing to count against it, no failure to detail.
    failed_attempts: [],
    error: null,
  });
  expect(t.gw.runtime.lifecycle.active).toBe(0);
});

it('18: a healthy POST is never aborted early: a long stream and a long non-streamed request complete', async () => {
  t = await startTestGateway({ replicas: 1, timeScale: 0.2 });
  const started = performance.now();
  const streamed = await post(
    t.url,
    CHAT,
    long({ max_tokens: 150, stream_options: { include_usage: true } }),
    {
      'x-request-id': 'healthy-stream',
    },
  );
  // Long enough that an abort "a few ms after the body was read" would have cut it.
  expect(performance.now() - started).toBeGreaterThan(100);
  const events = sseData(streamed.text);
  expect(events.at(-1)).toBe('[DONE]');
  const usage = JSON.parse(events.at(-2)!) as { usage: { completion_tokens: number } };
  expect(usage.usage.completion_tokens).toBe(150);
  const whole = await post(t.url, CHAT, chat({ max_tokens: 150, ignore_eos: true }), {
    'x-request-id': 'healthy-whole',
  });
  expect(whole.status).toBe(200);
  expect((JSON.parse(whole.text) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(
    150,
  );
  expect(await t.recordOf('healthy-stream')).toMatchObject({ outcome: 'ok', completion_tokens: 150 });
  expect(await t.recordOf('healthy-whole')).toMatchObject({ outcome: 'ok', completion_tokens: 150 });
  expect(await replicaAborts(t.fleet!.urls[0]!)).toBe(0);
});

it('19: a client that hangs up while its request waits for a connection → never dispatched', async () => {
  // One connection to the one replica: a second request waits in the pool until the first ends.
  t = await startTestGateway({
    replicas: 1,
    timeScale: 0.2,
    config: {
      upstream: { max_connections_per_backend: 1 },
      scheduler: { concurrency: { min: 1, max: 1, initial: 1 } },
    },
  });
  const replicaUrl = t.fleet!.urls[0]!;
  const first = openStream(t.url, CHAT, long({ max_tokens: 150 }), { 'x-request-id': 'holder' });
  const holder = await first.response;
  await holder.until((text) => sseData(text).length >= 2);
  const admitted = stageReached('waiter', 'admitted');
  const second = openStream(t.url, CHAT, chat({ stream: true, max_tokens: 5 }), { 'x-request-id': 'waiter' });
  await admitted;
  // Still waiting: nothing has been sent to it, not even headers (held until the first token).
  expect(t.gw.runtime.lifecycle.active).toBe(2);
  second.abort();
  // Its record is written as it leaves: no attempt, no backend.
  await waitFor(
    async () => (await t!.records()).some((r) => r.req_id === 'waiter'),
    3000,
    "the waiter's record",
  );
  expect(await t.recordOf('waiter')).toMatchObject({
    outcome: 'client_cancelled',
    sla_met: null,
    attempts: 0,
    backend: null,
  });
  await holder.ended;
  expect(sseData(holder.received()).at(-1)).toBe('[DONE]');
  // The replica finished exactly one request (the holder): the waiter never reached it.
  expect(await replicaRequests(replicaUrl)).toBe(1);
  expect(await replicaAborts(replicaUrl)).toBe(0);
  expect(await t.recordOf('holder')).toMatchObject({ outcome: 'ok' });
});

it('a client that leaves once its TTFT target has passed is judged a miss; one that leaves sooner is not judged', async () => {
  // The backend answers only when the test says: each request's response is held by its id.
  const held = new Map<string, ServerResponse>();
  const backend = await scripted((_req, res, hit) => {
    // Sent upstream as `<id>.<suffix>` (src/upstream/relay.ts upstreamRequestId).
    held.set(String(hit.headers['x-request-id']).split('.')[0]!, res);
  });
  after.push(() => {
    for (const res of held.values()) res.destroy();
    return backend.close();
  });
  const TARGET = 200;
  t = await startTestGateway({
    backends: [{ name: 'b0', url: backend.url }],
    config: {
      sla: {
        default_class: 'fast',
        // `patient`: the early leaver's, whose target no slow machine reaches before it leaves.
        classes: {
          fast: { ttft_p99_ms: TARGET, tpot_p99_ms: 50, priority: 0 },
          patient: { ttft_p99_ms: 60_000, tpot_p99_ms: 50, priority: 0 },
        },
      },
    },
  });
  const body = chat({ stream: true, max_tokens: 5 });
  // Waits until more than the target has gone by since the request was sent: that passing is the
  // event each case is about.
  const pastTarget = (sentAt: number) =>
    waitFor(() => performance.now() - sentAt > TARGET + 50, 2000, 'the TTFT target passed');

  // Left early, before any token: told nothing of what the fleet would have done.
  const early = openStream(t.url, CHAT, body, { 'x-request-id': 'early', 'x-slagate-class': 'patient' });
  await waitFor(() => held.has('early'), 2000, 'early dispatched');
  early.abort();
  await waitFor(async () => (await t!.records()).length === 1, 2000, 'its record');

  // Waited past the target with no first token, then gave up: what the SLA is about.
  let sentAt = performance.now();
  const gaveUp = openStream(t.url, CHAT, body, { 'x-request-id': 'gave-up' });
  await waitFor(() => held.has('gave-up'), 2000, 'gave-up dispatched');
  await pastTarget(sentAt);
  gaveUp.abort();
  await waitFor(async () => (await t!.records()).length === 2, 2000, 'its record');

  // Got its first token late, then left mid-stream.
  sentAt = performance.now();
  const late = openStream(t.url, CHAT, body, { 'x-request-id': 'late' });
  await waitFor(() => held.has('late'), 2000, 'late dispatched');
  await pastTarget(sentAt);
  const res = held.get('late')!;
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.write(chatStreamText(5).split('\n\n').slice(0, 2).join('\n\n') + '\n\n');
  const stream = await late.response;
  await stream.until((text) => sseData(text).length >= 2);
  stream.close();
  await waitFor(async () => (await t!.records()).length === 3, 2000, 'its record');

  // A non-streamed request of a shape passed through whole (chat's echo): no first token is seen, so
  // a client that leaves after the target says nothing of when it came.
  sentAt = performance.now();
  const whole = openStream(t.url, CHAT, chat({ max_tokens: 5, echo: true }), {
    'x-request-id': 'passed-through',
  });
  await waitFor(() => held.has('passed-through'), 2000, 'passed-through dispatched');
  await pastTarget(sentAt);
  whole.abort();
  await waitFor(async () => (await t!.records()).length === 4, 2000, 'its record');
  expect(await t.recordOf('passed-through')).toMatchObject({
    outcome: 'client_cancelled',
    ttft_ms: null,
    sla_met: null,
  });

  const cancelled = { outcome: 'client_cancelled', class: 'fast', ttft_target_ms: TARGET };
  const rEarly = await t.recordOf('early');
  expect(rEarly).toMatchObject({
    ...cancelled,
    class: 'patient',
    ttft_target_ms: 60_000,
    ttft_ms: null,
    sla_met: null,
  });
  expect(rEarly.e2e_ms!).toBeLessThan(60_000);
  const rGaveUp = await t.recordOf('gave-up');
  expect(rGaveUp).toMatchObject({ ...cancelled, ttft_ms: null, sla_met: false });
  expect(rGaveUp.e2e_ms!).toBeGreaterThan(TARGET);
  const rLate = await t.recordOf('late');
  expect(rLate).toMatchObject({ ...cancelled, sla_met: false });
  expect(rLate.ttft_ms!).toBeGreaterThan(TARGET);

  // The metrics count the same: two judged, none met.
  const metrics = (await get(t.url, '/metrics')).text;
  expect(metrics).toMatch(/^slagate_sla_judged_total\{class="fast"\} 2$/m);
  expect(metrics).toMatch(/^slagate_sla_met_total\{class="fast"\} 0$/m);
});
