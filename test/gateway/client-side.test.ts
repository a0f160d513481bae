// The client's side of a request through the whole gateway: hanging up mid-stream, a healthy POST
// that must not be aborted early (fastify #4690), hanging up while waiting for a connection.
// Checklist items (research/reliability.md): 17, 18, 19.
import { afterEach, expect, it } from 'vitest';
import { LoopLag } from '../helpers/loop-lag.ts';
import {
  chat,
  openStream,
  post,
  replicaAborts,
  replicaRequests,
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
  const second = openStream(t.url, CHAT, chat({ stream: true, max_tokens: 5 }), { 'x-request-id': 'waiter' });
  await sleep(50);
  // Still waiting: nothing has been sent to it, not even headers (held until the first token).
  expect(t.gw.runtime.lifecycle.active).toBe(2);
  second.abort();
  await holder.ended;
  expect(sseData(holder.received()).at(-1)).toBe('[DONE]');
  await sleep(100);
  // The replica finished exactly one request (the holder): the waiter never reached it.
  expect(await replicaRequests(replicaUrl)).toBe(1);
  expect(await replicaAborts(replicaUrl)).toBe(0);
  expect(await t.recordOf('waiter')).toMatchObject({ outcome: 'client_cancelled', sla_met: null });
  expect(await t.recordOf('holder')).toMatchObject({ outcome: 'ok' });
});
