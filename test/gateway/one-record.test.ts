// Exactly one admission record per request, with an outcome from the fixed set, on every path a
// request can take through the gateway: served, each refusal, each upstream failure, the client
// leaving, a timeout, and shutdown. Checklist item 35.
import { createHash } from 'node:crypto';
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import http from 'node:http';
import { afterEach, expect, it } from 'vitest';
import type { FaultSpec } from '../../src/sim/faults.ts';
import type { SimReplica } from '../../src/sim/replica.ts';
import { OUTCOMES } from '../../src/telemetry/outcome.ts';
import { STAGE_CHANNEL, type StageMark } from '../../src/telemetry/stages.ts';
import { stageReached } from '../helpers/stages.ts';
import {
  breakPolicy,
  chat,
  MODEL,
  openStream,
  post,
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
const KEY = 'the-key';
const auth = { authorization: `Bearer ${KEY}` };

it('35: every path writes exactly one record with a known outcome', async () => {
  t = await startTestGateway({
    replicas: 2,
    timeScale: 0.2,
    config: {
      server: { body_limit_bytes: 2048, shutdown_grace_ms: 300 },
      tenants: [{ name: 'team', api_key_sha256: createHash('sha256').update(KEY).digest('hex') }],
      upstream: { first_token_timeout_ms: 200 },
    },
  });
  const [r0, r1] = t.fleet!.replicas as [SimReplica, SimReplica];
  const sent: string[] = [];
  const id = (name: string) => {
    sent.push(name);
    return { ...auth, 'x-request-id': name };
  };
  const both = async (spec: FaultSpec) => {
    await r0.fault(spec);
    await r1.fault(spec);
  };

  // ok, streamed and not, chat and completions
  expect((await post(t.url, CHAT, chat({ stream: true }), id('ok-stream'))).status).toBe(200);
  expect((await post(t.url, CHAT, chat(), id('ok-whole'))).status).toBe(200);
  const completion = { model: MODEL, prompt: 'Hi', max_tokens: 3 };
  expect((await post(t.url, '/v1/completions', completion, id('ok-completion'))).status).toBe(200);
  // refusals
  expect((await post(t.url, CHAT, chat(), { 'x-request-id': sent[sent.push('no-key') - 1] })).status).toBe(
    401,
  );
  expect((await post(t.url, CHAT, '{"model":', id('bad-json'))).status).toBe(400);
  expect((await post(t.url, CHAT, chat({ model: 'nope' }), id('no-model'))).status).toBe(404);
  expect((await post(t.url, '/v1/embeddings', chat(), id('no-route'))).status).toBe(404);
  const big = chat({ messages: [{ role: 'user', content: 'x'.repeat(4000) }] });
  expect((await post(t.url, CHAT, big, id('too-big'))).status).toBe(413);
  // upstream failure before the commit point (every replica errors), and a timeout (every replica hangs)
  await both({ mode: 'error', status: 500 });
  expect((await post(t.url, CHAT, chat({ stream: true }), id('fail-before'))).status).toBe(502);
  await both({ mode: 'hang' });
  expect((await post(t.url, CHAT, chat({ stream: true }), id('timeout'))).status).toBe(504);
  // upstream failure after the commit point
  await both({ mode: 'drop', afterTokens: 2 });
  expect((await post(t.url, CHAT, chat({ stream: true, max_tokens: 10 }), id('fail-after'))).status).toBe(
    200,
  );
  await both({ mode: 'reset' });
  // the client leaves mid-stream, and before the first token
  const gone = await openStream(
    t.url,
    CHAT,
    chat({ stream: true, max_tokens: 300, ignore_eos: true }),
    id('gone'),
  ).response;
  await gone.until((text) => sseData(text).length >= 2);
  gone.close();
  await r0.fault({ mode: 'hang' });
  await r1.fault({ mode: 'hang' });
  const dispatched = stageReached('gone-early', 'dispatched');
  const early = openStream(t.url, CHAT, chat({ stream: true }), id('gone-early'));
  await dispatched;
  early.abort();
  await waitFor(() => t!.gw.runtime.lifecycle.active === 0, 2000, 'cancelled requests ended');
  await both({ mode: 'reset' });

  // shutdown: one stream in flight (cut at the grace period), one new request refused
  const inflight = await openStream(
    t.url,
    CHAT,
    chat({ stream: true, max_tokens: 2000, ignore_eos: true }),
    id('cut-by-shutdown'),
  ).response;
  await inflight.until((text) => sseData(text).length >= 2);
  const closing = t.gw.close();
  const refused = await post(t.url, CHAT, chat(), id('during-shutdown'));
  expect(refused.status).toBe(503);
  expect(refused.headers['retry-after']).toMatch(/^\d+$/);
  expect(await closing).toEqual({ cut: 1, logsFlushed: true });
  await inflight.ended;

  const records = await t.records();
  const perId = new Map<string, number>();
  for (const r of records) perId.set(r.req_id, (perId.get(r.req_id) ?? 0) + 1);
  expect(Object.fromEntries(perId)).toEqual(Object.fromEntries(sent.map((s) => [s, 1])));
  for (const r of records) expect(OUTCOMES).toContain(r.outcome);
  const outcome = Object.fromEntries(records.map((r) => [r.req_id, [r.outcome, r.reason]]));
  expect(outcome).toEqual({
    'ok-stream': ['ok', 'ok'],
    'ok-whole': ['ok', 'ok'],
    'ok-completion': ['ok', 'ok'],
    'no-key': ['refused', 'invalid_api_key'],
    'bad-json': ['refused', 'invalid_request'],
    'no-model': ['refused', 'model_not_found'],
    'no-route': ['refused', 'route_not_found'],
    'too-big': ['refused', 'body_too_large'],
    'fail-before': ['failed_before_commit', 'upstream_error'],
    timeout: ['timeout', 'first_token_timeout'],
    'fail-after': ['failed_after_commit', 'upstream_error'],
    gone: ['client_cancelled', 'client_cancelled'],
    'gone-early': ['client_cancelled', 'client_cancelled'],
    'cut-by-shutdown': ['failed_after_commit', 'shutting_down'],
    'during-shutdown': ['refused', 'shutting_down'],
  });
});

it('a client that leaves mid-upload ends with no admission decision: decision null, not admitted', async () => {
  t = await startTestGateway({ replicas: 1 });
  const body = JSON.stringify(chat());
  const req = http.request(`${t.url}${CHAT}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'content-length': body.length,
      'x-request-id': 'mid-upload',
    },
  });
  req.on('error', () => {});
  // Half the body; gone once the gateway has begun the request's record.
  const received = new Promise<void>((resolve) => {
    const onMark = (m: unknown) => {
      const mark = m as StageMark;
      if (mark.reqId !== 'mid-upload' || mark.stage !== 'received') return;
      unsubscribe(STAGE_CHANNEL, onMark);
      resolve();
    };
    subscribe(STAGE_CHANNEL, onMark);
  });
  req.write(body.slice(0, body.length >> 1));
  await received;
  req.destroy();
  await waitFor(async () => (await t!.records()).length === 1, 2000, 'its record');
  // The class is the one its head settled (the default here): counted to it, not to none.
  const rec = await t.recordOf('mid-upload');
  expect(rec).toMatchObject({
    outcome: 'client_cancelled',
    decision: null,
    reason: 'client_cancelled',
    attempts: 0,
    class: 'interactive',
  });
  const metrics = await (await fetch(`${t.url}/metrics`)).text();
  expect(metrics).toMatch(
    /slagate_admission_total\{class="interactive",decision="none",reason="client_cancelled"\} 1/,
  );
  expect(metrics).not.toMatch(/decision="admitted",reason="client_cancelled"/);
});

it('35: a gateway bug after the hand-off still answers the client and writes one record', async () => {
  // The bug is logged at error level; keep the test output clean.
  t = await startTestGateway({ replicas: 1, config: { logging: { level: 'fatal' } } });
  const rt = t.gw.runtime;
  const restore = breakPolicy(t.gw);
  const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'bug-1' });
  expect(res.status).toBe(500);
  expect(JSON.parse(res.text)).toMatchObject({ error: { code: 'internal_error' } });
  expect(res.text).not.toContain('policy bug');
  expect(await t.recordOf('bug-1')).toMatchObject({
    outcome: 'failed_before_commit',
    reason: 'internal_error',
  });
  expect(rt.lifecycle.active).toBe(0);
  restore();
  expect((await post(t.url, CHAT, chat())).status).toBe(200);
});

it('35: POST /v1/models is a /v1 route with the wrong method: 405 and one record', async () => {
  t = await startTestGateway({ replicas: 1 });
  const res = await post(t.url, '/v1/models', {}, { 'x-request-id': 'post-models' });
  expect(res.status).toBe(405);
  expect(await t.recordOf('post-models')).toMatchObject({ outcome: 'refused', reason: 'method_not_allowed' });
});

it('35: a concurrent batch (streams, whole bodies, cancels, refusals) gets one record per request', async () => {
  t = await startTestGateway({ replicas: 2, timeScale: 0.1 });
  const jobs: Promise<unknown>[] = [];
  const ids: string[] = [];
  for (let i = 0; i < 40; i++) {
    const reqId = `batch-${i}`;
    ids.push(reqId);
    const headers = { 'x-request-id': reqId };
    if (i % 10 === 9) {
      // hangs up once the stream has started
      jobs.push(
        openStream(
          t.url,
          CHAT,
          chat({ stream: true, max_tokens: 200, ignore_eos: true }),
          headers,
        ).response.then(async (s) => {
          await s.until((text) => sseData(text).length >= 2);
          s.close();
        }),
      );
    } else if (i % 10 === 7) {
      jobs.push(post(t.url, CHAT, chat({ model: 'nope' }), headers));
    } else {
      jobs.push(post(t.url, CHAT, chat({ stream: i % 2 === 0, max_tokens: 16 }), headers));
    }
  }
  await Promise.all(jobs);
  await waitFor(async () => (await t!.records()).length >= 40, 3000, 'forty records');
  await sleep(50);
  const records = await t.records();
  expect(records.map((r) => r.req_id).sort()).toEqual([...ids].sort());
  const count = (o: string) => records.filter((r) => r.outcome === o).length;
  expect([count('ok'), count('refused'), count('client_cancelled')]).toEqual([32, 4, 4]);
  expect(t.gw.runtime.lifecycle.active).toBe(0);
});
