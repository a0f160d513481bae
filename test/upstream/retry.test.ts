// Several backends: retries before the commit point go to a different backend, within the attempt
// limit, the shared retry budget and the deadline; never after the commit point.
import http from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors/index.ts';
import type { BackendSet } from '../../src/upstream/backends.ts';
import { AttemptFailure } from '../../src/upstream/failure.ts';
import type { AcquireSlot } from '../../src/upstream/slot.ts';
import { openStream, streamToCome } from '../helpers/http.ts';
import {
  blackholeUrl,
  chatBody,
  DONE,
  dataEvents,
  deadUrl,
  destroy,
  FAST,
  frame,
  type Gateway,
  type GatewayOpts,
  gateway,
  hang,
  healthy,
  makeSet,
  post,
  roleChunk,
  type Script,
  sleep,
  slotOn,
  sseHead,
  status,
  tokenChunk,
  type Upstream,
  upstream,
} from './helpers.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function fleet(
  scripts: Script[][],
  gw: Partial<GatewayOpts> = {},
): Promise<{ ups: Upstream[]; set: BackendSet; gw: Gateway }> {
  const ups = await Promise.all(scripts.map((s) => upstream(...s)));
  const set = makeSet(ups.map((u) => u.url));
  const g = await gateway({ set, ...gw });
  cleanups.push(...ups.map((u) => u.close), () => set.close(), g.close);
  return { ups, set, gw: g };
}

describe('retries before the commit point (item 3)', () => {
  it('connection refused is retried on a different backend', async () => {
    const up = await upstream(healthy(2));
    const set = makeSet([await deadUrl(), up.url]);
    const gw = await gateway({ set });
    cleanups.push(up.close, () => set.close(), gw.close);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(res.headers['x-slagate-backend']).toBe('b1');
    expect(result).toMatchObject({ outcome: 'ok', backend: 'b1', attempts: 2 });
    expect(result.attemptLog.map((a) => [a.backend, a.reason])).toEqual([
      ['b0', 'connect_error'],
      ['b1', null],
    ]);
    expect(result.reachedEngine).toBe(true);
  });

  it('every backend refused a connection: no engine reached, 503 no_healthy_backend with Retry-After', async () => {
    const set = makeSet([await deadUrl(), await deadUrl()]);
    const gw = await gateway({ set });
    cleanups.push(() => set.close(), gw.close);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    // A fleet restarting: the client is told to come back, not that a backend failed its request.
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toBe('2');
    expect(JSON.parse(res.text).error.code).toBe('no_healthy_backend');
    expect(result).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'no_healthy_backend',
      attempts: 2,
    });
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['connect_error', 'connect_error']);
    expect(result.reachedEngine).toBe(false);
  });

  it('every backend dropped the connection attempt (hosts gone dark): no engine reached, 503 with Retry-After', async () => {
    // The first-token timer (400 ms) fires before the connect timeout (500 ms), as the defaults
    // order them; the request was never written to a connection, so it reached no engine.
    const set = makeSet([await blackholeUrl(cleanups), await blackholeUrl(cleanups)]);
    cleanups.push(() => set.close());
    const gw = await gateway({ set });
    cleanups.push(gw.close);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toBe('2');
    expect(JSON.parse(res.text).error.code).toBe('no_healthy_backend');
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['connect_timeout', 'connect_timeout']);
    expect(result.reachedEngine).toBe(false);
  });

  it('a backend that failed after reaching its engine, the rest refusing connections: 502, its failure', async () => {
    const up = await upstream(status(500));
    const set = makeSet([up.url, await deadUrl()]);
    const gw = await gateway({ set, cfg: { ...FAST, retries: 1 } });
    cleanups.push(up.close, () => set.close(), gw.close);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(502);
    expect(res.headers['retry-after']).toBeUndefined();
    const result = await gw.nextResult();
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['upstream_status', 'connect_error']);
    expect(result).toMatchObject({ reason: 'connect_error', reachedEngine: true });
  });

  it('a 503, a reset and a first-token timeout each move the request to another backend', async () => {
    const { ups, gw } = await fleet([[status(503)], [destroy], [hang()], [healthy(2)]], {
      cfg: { ...FAST, retries: 3 },
    });
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(dataEvents(res.text)).toHaveLength(4); // role, 2 tokens, [DONE]
    expect(result.attemptLog.map((a) => a.reason)).toEqual([
      'upstream_status',
      'upstream_reset',
      'first_token_timeout',
      null,
    ]);
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1, 1, 1]);
    // TTFT counts from the request's start, so it includes the failed attempts.
    expect(result.ttftMs).toBeGreaterThanOrEqual(FAST.firstTokenTimeoutMs - 10);
  });

  it('stops after `retries` extra attempts and answers 502', async () => {
    const { ups, gw } = await fleet([[status(500)], [status(500)], [status(500)]], {
      cfg: { ...FAST, retries: 1 },
    });
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(502);
    expect((await gw.nextResult()).attempts).toBe(2);
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1, 0]);
  });

  it('never retries after the first token was forwarded (item 5)', async () => {
    const { client, ready: clientReady } = streamToCome();
    const dies: Script = async (req, res) => {
      sseHead(res);
      res.write(roleChunk() + tokenChunk('once'));
      // Dies once the client has its token.
      await (await client).until((text) => text.includes('"once"'));
      req.socket.destroy();
    };
    const { ups, gw } = await fleet([[dies], [healthy(2)]]);
    const stream = await openStream(gw.url, '/v1/chat/completions', chatBody()).response;
    clientReady(stream);
    await stream.ended;
    const result = await gw.nextResult();
    expect(result).toMatchObject({ outcome: 'failed_after_commit', attempts: 1 });
    expect(ups[1]!.hits).toHaveLength(0);
    expect(stream.received().split('once')).toHaveLength(2);
  });

  it("the request deadline bounds the wait across attempts and is not the backend's fault", async () => {
    const { ups, set, gw } = await fleet([[hang()], [healthy(1)]], { deadlineMs: 150 });
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(504);
    expect(result).toMatchObject({ outcome: 'timeout', reason: 'deadline', attempts: 1 });
    expect(ups[1]!.hits).toHaveLength(0);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b0')!.breaker.stats.failures).toBe(0);
  });

  it('a retry held in the queue until the deadline is a 504 timeout, not the failure before it', async () => {
    const deadlineMs = 300;
    const { set, gw } = await fleet([[status(503)], [healthy(1)]], {
      deadlineMs,
      // The first attempt goes to b0; the retry waits for a slot until the deadline, as the
      // scheduler's guard holds one (it settles the wait with null there).
      acquire: ({ attempt, signal }) =>
        attempt === 0
          ? Promise.resolve(slotOn(set.get('b0')!))
          : new Promise((resolve) => {
              const t = setTimeout(() => resolve(null), deadlineMs);
              signal.onAbort(() => clearTimeout(t));
            }),
    });
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(504);
    expect(JSON.parse(res.text).error.code).toBe('first_token_timeout');
    expect(result).toMatchObject({ outcome: 'timeout', reason: 'deadline', attempts: 1 });
    // What failed before is still in the record.
    expect(result.attemptLog.map((a) => [a.backend, a.reason])).toEqual([['b0', 'upstream_status']]);
  });

  it('a body passed through may take longer than the first-token cap: its generation is in it', async () => {
    const slowBody: Script = async (_req, res) => {
      await sleep(600);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [] }));
    };
    const cfg = { ...FAST, firstTokenTimeoutMs: 200, passthroughTimeoutMs: 5_000 };
    const { ups, set, gw } = await fleet([[slowBody], [healthy(1)]], { cfg, deadlineMs: 5_000 });
    const res = await post(gw.url, chatBody({ stream: false }));
    expect(res.status).toBe(200);
    expect(await gw.nextResult()).toMatchObject({ outcome: 'ok', attempts: 1, backend: 'b0' });
    expect(ups[1]!.hits).toHaveLength(0);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
  });

  it('a body passed through whose backend hangs for the whole budget is that backend’s fault, though the deadline ends it too', async () => {
    // The deadline and the attempt's budget are the same 1 s (a passed-through body has its own).
    const cfg = { ...FAST, passthroughTimeoutMs: 1_000 };
    const { set, gw } = await fleet([[hang()], [healthy(1)]], { cfg, deadlineMs: cfg.passthroughTimeoutMs });
    const res = await post(gw.url, chatBody({ stream: false }));
    const result = await gw.nextResult();
    expect(res.status).toBe(504);
    expect(result).toMatchObject({ outcome: 'timeout', reason: 'first_token_timeout', attempts: 1 });
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
    expect(set.get('b0')!.breaker.stats.failures).toBe(1);
  });
});

// The gateway sends only models it serves: a 404 says that backend lacks the model, unless every
// backend does.
describe('a 404 status from a backend', () => {
  const missing = status(404, '{"object":"error","message":"The model `m` does not exist.","code":404}');

  it("is that backend's when another serves the request: retried there, and the first blamed", async () => {
    const { ups, set, gw } = await fleet([[missing], [healthy(2)]]);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(dataEvents(res.text)).toHaveLength(4); // role, 2 tokens, [DONE]
    expect(result).toMatchObject({ outcome: 'ok', backend: 'b1', attempts: 2 });
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['upstream_not_found', null]);
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1]);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
    expect(set.get('b1')!.outlier.consecutiveFailures).toBe(0);
  });

  it("is the request's when a second backend answers 404 too: relayed as model_not_found, nobody blamed", async () => {
    const { set, gw } = await fleet([[missing], [missing], [healthy(1)]]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(404);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'model_not_found',
      message: 'The model `m` does not exist.',
    });
    expect(await gw.nextResult()).toMatchObject({ reason: 'upstream_rejected', attempts: 2 });
    for (const name of ['b0', 'b1']) expect(set.get(name)!.outlier.consecutiveFailures).toBe(0);
  });
});

// vLLM answers 501 for a feature the request asks for and the server lacks: the same on every
// replica started alike, so it is the request's once a second backend agrees, never a failure that
// opens breakers.
describe('a 501 status from a backend', () => {
  const unsupported = status(
    501,
    '{"error":{"message":"beam search is not supported with prompt embeds","type":"NotImplementedError","param":null,"code":501}}',
  );

  it("is the request's when a second backend answers 501 too: relayed as not_implemented, nobody blamed", async () => {
    const { ups, set, gw } = await fleet([[unsupported], [unsupported], [healthy(1)]]);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(501);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'not_implemented',
      type: 'not_implemented_error',
      message: 'beam search is not supported with prompt embeds',
    });
    expect(result).toMatchObject({ reason: 'upstream_rejected', attempts: 2, status: 501 });
    expect(result.attemptLog.map((a) => a.reason)).toEqual([
      'upstream_not_implemented',
      'upstream_not_implemented',
    ]);
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1, 0]);
    for (const name of ['b0', 'b1']) {
      expect(set.get(name)!.outlier.consecutiveFailures).toBe(0);
      expect(set.get(name)!.breaker.stats.failures).toBe(0);
    }
  });

  it("is that backend's when another serves the request: retried there, and the first blamed", async () => {
    const { set, gw } = await fleet([[unsupported], [healthy(2)]]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(200);
    expect(await gw.nextResult()).toMatchObject({ outcome: 'ok', backend: 'b1', attempts: 2 });
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
  });
});

// Some vLLM releases answer a request they cannot serve with an error body and status 200, as JSON
// even when the request asked for a stream (vllm#21704).
describe('a 200 with a JSON body to a request sent as a stream', () => {
  const json =
    (body: string): Script =>
    (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(body);
    };
  const errorBody = json(
    '{"object":"error","message":"The model does not support Chat Completions API","type":"BadRequestError","param":null,"code":400}',
  );

  it('is an in-band rejection: relayed once a second backend answers alike, nobody blamed', async () => {
    const { ups, set, gw } = await fleet([[errorBody], [errorBody], [healthy(1)]]);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'invalid_request',
      message: 'The model does not support Chat Completions API',
    });
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['in_band_rejection', 'in_band_rejection']);
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1, 0]);
    for (const name of ['b0', 'b1']) expect(set.get(name)!.breaker.stats.failures).toBe(0);
  });

  it('that is no error (a backend that ignored `stream`) is a protocol error of that backend', async () => {
    const whole = json(
      '{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}',
    );
    const { set, gw } = await fleet([[whole], [healthy(1)]]);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(result).toMatchObject({ outcome: 'ok', backend: 'b1', attempts: 2 });
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['protocol_error', null]);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
  });
});

// vLLM raises some of a request's own errors only after its 200 head, as one in-band error with
// code 400, and gives the same code to some engine errors: a second backend tells them apart.
describe('an in-band error naming a 4xx before the first token', () => {
  const rejects =
    (error: Record<string, unknown>): Script =>
    (_req, res) => {
      sseHead(res);
      res.end(frame(error) + DONE);
    };
  const badGrammar = { error: { message: 'grammar does not compile', type: 'BadRequestError', code: 400 } };

  it("is the request's when a second backend rejects it alike: relayed as a 400, nobody blamed", async () => {
    const flat = {
      object: 'error',
      message: 'grammar does not compile here',
      type: 'BadRequestError',
      code: 400,
    };
    const { ups, set, gw } = await fleet([[rejects(badGrammar)], [rejects(flat)], [healthy(1)]]);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    // The client is told the last rejection.
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'invalid_request',
      message: 'grammar does not compile here',
    });
    expect(result).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'upstream_rejected',
      attempts: 2,
      status: 400,
      upstreamMessage: 'grammar does not compile here',
    });
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['in_band_rejection', 'in_band_rejection']);
    // Confirmed by a second backend: surely the client's error (not judged against the SLA).
    expect(result.clientError).toBe(true);
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1, 0]);
    for (const name of ['b0', 'b1']) {
      expect(set.get(name)!.outlier.consecutiveFailures).toBe(0);
      expect(set.get(name)!.breaker.stats.failures).toBe(0);
    }
  });

  it('is settled by a second backend answering with a 4xx status too, blaming nobody', async () => {
    const { set, gw } = await fleet([
      [rejects(badGrammar)],
      [status(400, '{"error":{"message":"bad grammar","type":"BadRequestError","code":400}}')],
    ]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text).error.message).toBe('bad grammar');
    // A 4xx status: the frontend's own validation, surely the client's.
    expect(await gw.nextResult()).toMatchObject({
      reason: 'upstream_rejected',
      attempts: 2,
      clientError: true,
    });
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b1')!.outlier.consecutiveFailures).toBe(0);
  });

  it("is the first backend's when another gives a first token: blamed then", async () => {
    const { set, gw } = await fleet([[rejects(badGrammar)], [healthy(2)]]);
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(dataEvents(res.text)).toHaveLength(4); // role, 2 tokens, [DONE]
    expect(result).toMatchObject({ outcome: 'ok', backend: 'b1', attempts: 2 });
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
    expect(set.get('b1')!.outlier.consecutiveFailures).toBe(0);
  });

  it('with no second backend to ask, reaches the client as the backend said it, blaming nobody', async () => {
    const notFound = { error: { message: 'no such lora adapter', type: 'NotFoundError', code: 404 } };
    const { set, gw } = await fleet([[rejects(notFound)]]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(404);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'model_not_found',
      message: 'no such lora adapter',
    });
    expect(await gw.nextResult()).toMatchObject({ reason: 'upstream_rejected', attempts: 1 });
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
  });

  it('after a different rejection (a 501), is relayed but not surely the client’s either', async () => {
    const unsupported = status(501, '{"error":{"message":"no beam search here","code":501}}');
    const { gw } = await fleet([[unsupported], [rejects(badGrammar)], [healthy(1)]]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(400);
    expect(await gw.nextResult()).toMatchObject({
      reason: 'upstream_rejected',
      attempts: 2,
      clientError: false,
    });
  });

  it('unconfirmed by a second backend, is relayed but not surely the client’s (vLLM labels some engine failures 400)', async () => {
    const { gw } = await fleet([[rejects(badGrammar)]]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(400);
    expect(await gw.nextResult()).toMatchObject({
      reason: 'upstream_rejected',
      attempts: 1,
      clientError: false,
    });
  });

  it('a 200 body passed through whole that carries one is settled the same way', async () => {
    const body: Script = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(badGrammar));
    };
    const { ups, gw } = await fleet([[body], [body]]);
    const res = await post(gw.url, chatBody({ stream: false }));
    expect(res.status).toBe(400);
    expect(await gw.nextResult()).toMatchObject({ reason: 'upstream_rejected', attempts: 2 });
    expect(ups.map((u) => u.hits.length)).toEqual([1, 1]);
  });

  it('blames the backend that rejected as soon as another gives a first token, not when its stream ends', async () => {
    let finish!: () => void;
    const held = new Promise<void>((r) => {
      finish = r;
    });
    const slow: Script = async (_req, res) => {
      sseHead(res);
      res.write(roleChunk() + tokenChunk('a'));
      await held;
      res.end(tokenChunk('b', 'stop') + DONE);
    };
    const { set, gw } = await fleet([[rejects(badGrammar)], [slow]]);
    const blamedAtFirstToken = await new Promise<number>((resolve, reject) => {
      const req = http.request(`${gw.url}/v1/chat/completions`, { method: 'POST' }, (res) => {
        res.once('data', () => {
          resolve(set.get('b0')!.outlier.consecutiveFailures);
          finish();
        });
        res.resume();
      });
      req.on('error', reject);
      req.end(JSON.stringify(chatBody()));
    });
    expect(blamedAtFirstToken).toBe(1);
    expect(await gw.nextResult()).toMatchObject({ outcome: 'ok', backend: 'b1' });
  });

  it('is what the client gets when the next backend fails otherwise, and nobody is blamed for it', async () => {
    const { set, gw } = await fleet([[rejects(badGrammar)], [status(500)]], { cfg: { ...FAST, retries: 1 } });
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text).error.message).toBe('grammar does not compile');
    const result = await gw.nextResult();
    // The result names the backend tried last, as for every ending; the attempt log, which rejected.
    expect(result).toMatchObject({ reason: 'upstream_rejected', attempts: 2, backend: 'b1' });
    expect(result.attemptLog.map((a) => a.reason)).toEqual(['in_band_rejection', 'upstream_status']);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b1')!.outlier.consecutiveFailures).toBe(1);
    // A retry that cannot reach its backend at all, and no backend left: the same answer.
    const up = await upstream(rejects(badGrammar));
    const alone = makeSet([up.url, await deadUrl()]);
    const g = await gateway({ set: alone });
    cleanups.push(up.close, () => alone.close(), g.close);
    const refused = await post(g.url, chatBody());
    expect(refused.status).toBe(400);
    expect((await g.nextResult()).attemptLog.map((a) => a.reason)).toEqual([
      'in_band_rejection',
      'connect_error',
    ]);
  });

  it('gives way to a refusal of its retry: the rejection may have been the backend’s, and a retry would tell', async () => {
    let backends: BackendSet | null = null;
    // The first slot is b0's; the retry is refused while it waits, as an overloaded queue would.
    const refuseRetry: AcquireSlot = async ({ attempt }) => {
      if (attempt > 0) throw new GatewayError('queue_timeout', 'queued too long');
      return slotOn(backends!.get('b0')!);
    };
    const { ups, set, gw } = await fleet([[rejects(badGrammar)], [healthy(1)]], { acquire: refuseRetry });
    backends = set;
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(429);
    expect(res.headers['retry-after']).toMatch(/^\d+$/);
    expect(JSON.parse(res.text).error.code).toBe('queue_timeout');
    expect(await gw.nextResult()).toMatchObject({ outcome: 'failed_before_commit', attempts: 1 });
    expect(ups[1]!.hits).toHaveLength(0);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
  });

  it('is not counted against a backend already retired (its name may belong to its replacement)', async () => {
    const { ups, set, gw } = await fleet([[rejects(badGrammar)], [healthy(1)]]);
    expect((await post(gw.url, chatBody())).status).toBe(200);
    const b0 = set.get('b0')!;
    expect(b0.outlier.consecutiveFailures).toBe(1);
    await set.update([{ name: 'b1', url: ups[1]!.url }]);
    b0.blame(new AttemptFailure('upstream_status', 'late'));
    expect(b0.outlier.consecutiveFailures).toBe(1);
  });

  it('one naming a 5xx is still the backend’s in-band error, and so is any after the first token', async () => {
    const engineDead = { error: { message: 'engine dead', type: 'InternalServerError', code: 500 } };
    const { set, gw } = await fleet([[rejects(engineDead)], [rejects(engineDead)], [rejects(engineDead)]]);
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(502);
    const result = await gw.nextResult();
    expect(result.attemptLog.map((a) => a.reason)).toEqual([
      'in_band_error',
      'in_band_error',
      'in_band_error',
    ]);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
    const late: Script = (_req, res) => {
      sseHead(res);
      res.end(roleChunk() + tokenChunk('a') + frame(badGrammar) + DONE);
    };
    const after = await fleet([[late], [healthy(1)]]);
    const streamed = await post(after.gw.url, chatBody());
    expect(streamed.status).toBe(200);
    expect(await after.gw.nextResult()).toMatchObject({
      outcome: 'failed_after_commit',
      reason: 'in_band_error',
      attempts: 1,
    });
  });
});

describe('a body passed through whose connection is reset before its head', () => {
  it('counts as having reached the engine: its retry needs a retry left (vLLM sends that head after the generation)', async () => {
    const { ups, gw } = await fleet([[destroy], [healthy(1)]], { cfg: { ...FAST, retries: 0 } });
    const res = await post(gw.url, chatBody({ stream: false }));
    expect(res.status).toBe(502);
    expect(await gw.nextResult()).toMatchObject({ attempts: 1 });
    expect(ups[1]!.hits).toHaveLength(0);
    // A stream reset the same way has its one free retry: retried without one.
    const streamed = await post(gw.url, chatBody());
    expect(streamed.status).toBe(200);
    expect(await gw.nextResult()).toMatchObject({ attempts: 2 });
  });
});

describe('a request every backend resets before its head (one that crashes a server as it is prepared)', () => {
  it('has one free retry, then needs a retry left: it is not carried to every replica', async () => {
    const five = () => [[destroy], [destroy], [destroy], [destroy], [destroy]];
    const none = await fleet(five(), { cfg: { ...FAST, retries: 0 } });
    expect((await post(none.gw.url, chatBody())).status).toBe(502);
    // It may have reached an engine (and crashed it): not a request the tenant is refunded for.
    expect(await none.gw.nextResult()).toMatchObject({ attempts: 2, reachedEngine: true });
    expect(none.ups.reduce((n, u) => n + u.hits.length, 0)).toBe(2);
    const one = await fleet(five(), { cfg: { ...FAST, retries: 1 } });
    expect((await post(one.gw.url, chatBody())).status).toBe(502);
    const result = await one.gw.nextResult();
    expect(result).toMatchObject({ attempts: 3 });
    expect(result.attemptLog.map((a) => a.reason)).toEqual([
      'upstream_reset',
      'upstream_reset',
      'upstream_reset',
    ]);
    expect(one.ups.reduce((n, u) => n + u.hits.length, 0)).toBe(3);
  });
});

describe('a body passed through that is too large', () => {
  it('is not retried and not counted against the backend: it would be as large anywhere', async () => {
    const big: Script = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'x', object: 'chat.completion', pad: 'x'.repeat(4096) }));
    };
    const { ups, set, gw } = await fleet([[big], [big]], { cfg: { ...FAST, maxBodyBytes: 1024 } });
    const res = await post(gw.url, chatBody({ stream: false }));
    const result = await gw.nextResult();
    expect(res.status).toBe(502);
    // Told what to change, as an assembled answer's client is, not that the backend failed.
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'upstream_error',
      message: expect.stringContaining('The answer grew past 1024 bytes; stream it'),
    });
    expect(result).toMatchObject({ attempts: 1, reason: 'response_too_large' });
    expect(result.attemptLog.map((a) => [a.backend, a.reason])).toEqual([['b0', 'response_too_large']]);
    expect(ups[1]!.hits).toHaveLength(0);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b0')!.breaker.stats.failures).toBe(0);
  });
});

describe('a non-streamed answer assembled from a stream that grows too large', () => {
  it('is cut at the body bound with a 502 that says so, not held in memory whole', async () => {
    const { ups, set, gw } = await fleet([[healthy(60)], [healthy(60)]], {
      cfg: { ...FAST, maxBodyBytes: 100 },
      nonStreamMode: 'assemble',
    });
    const res = await post(gw.url, chatBody({ stream: false }));
    const result = await gw.nextResult();
    expect(res.status).toBe(502);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'upstream_error',
      message:
        'The answer grew past 100 characters; stream it, or lower max_tokens or the logprobs it asks for.',
    });
    expect(result).toMatchObject({ attempts: 1, reason: 'response_too_large' });
    // The backend sent a healthy stream: the size is the request's, not its fault.
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b0')!.breaker.stats.failures).toBe(0);
    expect(ups[1]!.hits).toHaveLength(0);
    // Under the bound the same stream is assembled whole.
    const roomy = await fleet([[healthy(60)]], {
      cfg: { ...FAST, maxBodyBytes: 1000 },
      nonStreamMode: 'assemble',
    });
    const whole = await post(roomy.gw.url, chatBody({ stream: false }));
    expect(whole.status).toBe(200);
    expect(JSON.parse(whole.text).choices[0].message.content).toBe(
      Array.from({ length: 60 }, (_, i) => `t${i}`).join(''),
    );
  });
});

describe('a non-streamed answer whose stream fails after its first token', () => {
  it('gets the error envelope, never event bytes under a bare 200, when a token and the error arrive in one read', async () => {
    const tokenThenError: Script = (_req, res) => {
      sseHead(res);
      // One write: the role and token events and the in-band error that follows them.
      res.end(
        roleChunk() +
          tokenChunk('Hello') +
          frame({ error: { message: 'engine died', type: 'InternalServerError', code: 500 } }),
      );
    };
    const notJson: Script = (_req, res) => {
      sseHead(res);
      res.end(`${roleChunk()}${tokenChunk('Hello')}data: {not json\n\n`);
    };
    for (const script of [tokenThenError, notJson]) {
      const { gw } = await fleet([[script]], { nonStreamMode: 'assemble' });
      const res = await post(gw.url, chatBody({ stream: false }));
      const result = await gw.nextResult();
      expect(res.status).toBe(502);
      expect(res.headers['content-type']).toMatch(/^application\/json/);
      expect(res.text).not.toContain('data:');
      expect(JSON.parse(res.text).error.code).toBe('upstream_error');
      expect(result.outcome).not.toBe('ok');
      // The result says what was sent: the 502, not the 200 a stream would have had.
      expect(result).toMatchObject({ outcome: 'failed_after_commit', status: 502 });
    }
  });
});

describe('fleet-wide failure (item 4)', () => {
  it('the retry budget caps retries at max(3, 20% of active requests)', async () => {
    const slow500: Script = async (_req, res) => {
      await sleep(60);
      res.writeHead(500).end();
    };
    const { ups, gw } = await fleet([[slow500], [slow500], [slow500], [slow500], [slow500], [slow500]], {
      cfg: { ...FAST, retries: 5 },
    });
    const n = 10;
    const responses = await Promise.all(Array.from({ length: n }, () => post(gw.url, chatBody())));
    expect(responses.every((r) => r.status === 502)).toBe(true);
    const results = await Promise.all(Array.from({ length: n }, () => gw.nextResult()));
    const hits = ups.reduce((s, u) => s + u.hits.length, 0);
    // Without a budget: 10 × 6 = 60 upstream requests. With it, at most 3 retries are in flight at
    // any moment, so at most 3 requests keep retrying and the rest stop after their first attempt.
    expect(hits).toBeLessThanOrEqual(n + 3 * 5);
    expect(
      results.filter((r) => r.reason === 'upstream_status' && r.attempts === 1).length,
    ).toBeGreaterThanOrEqual(n - 3);
    expect(gw.budget.retrying).toBe(0);
    expect(gw.active()).toBe(0);
  });
});

describe('no backend left (item 15)', () => {
  it('answers 503 no_healthy_backend with Retry-After at once when the router has nothing', async () => {
    let asked = 0;
    const { ups, gw } = await fleet([[healthy(1)]], {
      acquire: async () => {
        asked++;
        return null;
      },
    });
    const res = await post(gw.url, chatBody());
    // Answered on the first "nothing": the router was not asked again.
    expect(asked).toBe(1);
    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toBe('2');
    expect(res.headers['x-request-id']).toBe('req-1');
    expect(JSON.parse(res.text).error.code).toBe('no_healthy_backend');
    expect(await gw.nextResult()).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'no_healthy_backend',
      attempts: 0,
      status: 503,
    });
    expect(ups[0]!.hits).toHaveLength(0);
  });

  it('skips a backend offered on a stale view while its breaker is open, without counting an attempt', async () => {
    let backends: BackendSet | null = null;
    // Offers backends in order whatever their state, as a slot granted just before a breaker opened.
    const stale: AcquireSlot = async ({ excluded }) => {
      const b = backends!.list().find((x) => !excluded.has(x.name));
      return b === undefined ? null : slotOn(b);
    };
    const { ups, set, gw } = await fleet([[healthy(1)], [healthy(1)]], { acquire: stale });
    backends = set;
    set.get('b0')!.breaker.open();
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(200);
    expect(await gw.nextResult()).toMatchObject({ backend: 'b1', attempts: 1 });
    expect(ups[0]!.hits).toHaveLength(0);
  });
});
