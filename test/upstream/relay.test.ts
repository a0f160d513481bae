// One backend per test: the commit point, what the client sees and what the result records.
import { afterEach, describe, expect, it } from 'vitest';
import type { BackendSet } from '../../src/upstream/backends.ts';
import type { AcquireSlot } from '../../src/upstream/slot.ts';
import { openStream, streamToCome } from '../helpers/http.ts';
import {
  chatBody,
  chatStream,
  closedWithin,
  DONE,
  dataEvents,
  FAST,
  frame,
  type Gateway,
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
  usageChunk,
} from './helpers.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(...scripts: Script[]): Promise<{ up: Upstream; set: BackendSet; gw: Gateway }> {
  const up = await upstream(...scripts);
  const set = makeSet([up.url]);
  const gw = await gateway({ set });
  cleanups.push(up.close, () => set.close(), gw.close);
  return { up, set, gw };
}

describe('streaming relay', () => {
  it('relays a healthy stream byte for byte and measures it', async () => {
    // Role chunk + 4 token chunks (then usage and [DONE]). Each token chunk is written only once the
    // client has the previous one, and GAP_MS after that: the gateway stamps an event before it
    // relays it, so every gap it measures is at least GAP_MS, however loaded the machine.
    const GAP_MS = 5;
    const frames = chatStream(4);
    const { client, ready: clientReady } = streamToCome();
    const { up, gw } = await setup(async (_req, res) => {
      sseHead(res);
      for (const [i, f] of frames.entries()) {
        if (i >= 1 && i <= 4) {
          await (await client).until((text) => text.includes(frames[i - 1]!));
          const received = performance.now();
          while (performance.now() - received < GAP_MS) await sleep(1);
        }
        res.write(f);
      }
      res.end();
    });
    const stream = await openStream(
      gw.url,
      '/v1/chat/completions',
      chatBody({ stream_options: { include_usage: true } }),
    ).response;
    clientReady(stream);
    expect(await stream.ended).toEqual({ complete: true });
    const result = await gw.nextResult();
    expect(stream.status).toBe(200);
    expect(stream.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(stream.headers['x-slagate-backend']).toBe('b0');
    expect(stream.headers['x-request-id']).toBe('req-1');
    expect(stream.received()).toBe(frames.join(''));
    expect(up.hits[0]!.body.stream_options).toEqual({ include_usage: true });
    expect(result).toMatchObject({
      outcome: 'ok',
      reason: null,
      backend: 'b0',
      attempts: 1,
      status: 200,
      promptTokens: 7,
      completionTokens: 4,
    });
    // One gap per pair of consecutive token events, each at least the scripted GAP_MS.
    expect(result.itlMs).toHaveLength(4);
    for (const gap of result.itlMs) expect(gap).toBeGreaterThanOrEqual(GAP_MS);
    expect(result.ttftMs).toBeGreaterThanOrEqual(0);
    expect(result.e2eMs).toBeGreaterThanOrEqual(result.ttftMs! + 4 * GAP_MS);
    // TPOT: first to last token event over completion_tokens − 1.
    const span = result.itlMs.reduce((a, b) => a + b, 0);
    expect(result.tpotMs).toBeCloseTo(span / 3, 5);
    expect(result.tpotMs!).toBeGreaterThanOrEqual((4 * GAP_MS) / 3);
  });

  it('always asks upstream for usage but forwards the usage chunk only when the client asked', async () => {
    const { up, gw } = await setup(healthy(2));
    const res = await post(
      gw.url,
      chatBody({ stream_options: { include_usage: false, continuous_usage_stats: true } }),
    );
    const result = await gw.nextResult();
    // A client that declined usage gets none, continuous_usage_stats included (vLLM ties it to include_usage).
    expect(up.hits[0]!.body.stream_options).toEqual({ include_usage: true, continuous_usage_stats: false });
    expect(res.text).not.toContain('"usage"');
    expect(dataEvents(res.text)).toHaveLength(4); // role, 2 tokens, [DONE]
    expect(result.completionTokens).toBe(2);
    expect(result.promptTokens).toBe(7);
  });

  it('writes nothing before the first token: keep-alive comments before it are not forwarded', async () => {
    const { gw } = await setup(async (_req, res) => {
      sseHead(res);
      res.write(': ping\n\n');
      await sleep(30);
      for (const f of chatStream(1)) res.write(f);
      res.end();
    });
    const res = await post(gw.url, chatBody());
    expect(res.text.startsWith(roleChunk())).toBe(true);
  });

  it('relays events split across packets at every offset, with CRLF and multi-byte text (item 21)', async () => {
    const text = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'é€𝄞' } }] })}\r\n\r\n`;
    const bytes = Buffer.from(roleChunk() + text + usageChunk(3, 2) + DONE);
    const { gw } = await setup(async (_req, res) => {
      sseHead(res);
      for (let i = 0; i < bytes.length; i += 7) {
        res.write(bytes.subarray(i, i + 7));
        await sleep(0);
      }
      res.end();
    });
    const res = await post(gw.url, chatBody({ stream_options: { include_usage: true } }));
    expect(res.text).toBe(bytes.toString('utf8'));
    expect((await gw.nextResult()).outcome).toBe('ok');
  });

  it('an in-band error before the first token is a failure, not a stream (item 2)', async () => {
    const { gw } = await setup((_req, res) => {
      sseHead(res);
      res.end(
        frame({ error: { message: 'engine dead secret', type: 'InternalServerError', code: 500 } }) + DONE,
      );
    });
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(502);
    expect(JSON.parse(res.text)).toEqual({
      error: {
        message: 'The backend failed before the response started',
        type: 'upstream_error',
        param: null,
        code: 'upstream_error',
      },
    });
    expect(result).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'in_band_error',
      committed: false,
    });
    // The engine's own words are kept for the log, and never told to the client.
    expect(result.attemptLog.map((a) => a.detail)).toEqual([
      'upstream sent an error event naming 500: engine dead secret',
    ]);
    expect(res.text).not.toContain('engine dead');
  });

  it('an in-band error after the first token ends the stream with one error event and [DONE] (item 2)', async () => {
    const { set, gw } = await setup((_req, res) => {
      sseHead(res);
      res.end(roleChunk() + tokenChunk('a') + frame({ object: 'error', message: 'oops', code: 500 }) + DONE);
    });
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    const events = dataEvents(res.text);
    expect(res.status).toBe(200);
    expect(events).toHaveLength(4);
    expect(JSON.parse(events[2]!).error.code).toBe('upstream_error');
    expect(events[3]).toBe('[DONE]');
    expect(res.text).not.toContain('oops');
    expect(result).toMatchObject({ outcome: 'failed_after_commit', reason: 'in_band_error', status: 200 });
    expect(result.attemptLog.map((a) => a.detail)).toEqual(['upstream sent an error event naming 500: oops']);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(1);
  });

  it('a backend dying mid-stream gives one error event then [DONE] and a closed client (item 1)', async () => {
    const { client, ready: clientReady } = streamToCome();
    const { gw } = await setup(async (req, res) => {
      sseHead(res);
      res.write(roleChunk() + tokenChunk('a'));
      // Dies once its token is relayed: mid-stream, after the commit point.
      await (await client).until((text) => text.includes('"a"'));
      req.socket.destroy();
    });
    const stream = await openStream(gw.url, '/v1/chat/completions', chatBody()).response;
    clientReady(stream);
    await stream.ended;
    const result = await gw.nextResult();
    const events = dataEvents(stream.received());
    expect(events.slice(-2).map((e) => (e === '[DONE]' ? e : JSON.parse(e).error.type))).toEqual([
      'upstream_error',
      '[DONE]',
    ]);
    expect(events.filter((e) => e.includes('"error"'))).toHaveLength(1);
    expect(result).toMatchObject({ outcome: 'failed_after_commit', reason: 'upstream_reset', attempts: 1 });
  });

  it('a stream that ends without [DONE] after commit is a failure', async () => {
    const { gw } = await setup((_req, res) => {
      sseHead(res);
      res.end(roleChunk() + tokenChunk('a'));
    });
    const res = await post(gw.url, chatBody());
    expect(dataEvents(res.text).at(-1)).toBe('[DONE]');
    expect(await gw.nextResult()).toMatchObject({ outcome: 'failed_after_commit', reason: 'protocol_error' });
  });

  it("an oversized upstream event is an error, not a buffer that grows (item 22), and not the backend's fault", async () => {
    const { set, gw } = await setup(async (_req, res) => {
      sseHead(res);
      res.write(roleChunk());
      const blob = 'x'.repeat(16 * 1024);
      res.write('data: ');
      for (let i = 0; i < 64 && !res.destroyed; i++) {
        res.write(blob);
        await sleep(0);
      }
      res.end();
    });
    const res = await post(gw.url, chatBody());
    expect(res.text.length).toBeLessThan(4096);
    expect(dataEvents(res.text).at(-1)).toBe('[DONE]');
    // The client is told what is too large and what to change, not that the backend failed.
    expect(JSON.parse(dataEvents(res.text).at(-2)!).error).toMatchObject({
      code: 'upstream_error',
      message: expect.stringContaining('An event of the answer grew past 65536 bytes'),
    });
    expect(await gw.nextResult()).toMatchObject({
      outcome: 'failed_after_commit',
      reason: 'response_too_large',
    });
    // The size is the request's (an echoed prompt's logprobs, say): another backend would send it as large.
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b0')!.breaker.stats.failures).toBe(0);
  });

  it('an oversized first event is a 502 that says what is too large, not that the backend failed', async () => {
    const { gw } = await setup(async (_req, res) => {
      sseHead(res);
      res.write(`data: {"pad":"${'x'.repeat(80 * 1024)}"}\n\n`);
      res.end();
    });
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(502);
    expect(JSON.parse(res.text).error).toMatchObject({
      code: 'upstream_error',
      message: expect.stringContaining('An event of the answer grew past 65536 bytes'),
    });
    expect(await gw.nextResult()).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'response_too_large',
      attempts: 1,
    });
  });

  it('headers then no token: the first-token timeout fires and aborts the upstream (item 6)', async () => {
    const { up, gw } = await setup(hang());
    const t0 = performance.now();
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(504);
    expect(JSON.parse(res.text).error.code).toBe('first_token_timeout');
    expect(result).toMatchObject({ outcome: 'timeout', reason: 'first_token_timeout', ttftMs: null });
    expect(performance.now() - t0).toBeGreaterThanOrEqual(390);
    expect(await closedWithin(up.hits[0]!)).not.toBeNull();
  });

  it('keep-alive comments do not reset the first-token timer (item 7)', async () => {
    const { gw } = await setup(hang(50));
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(504);
    expect((await gw.nextResult()).reason).toBe('first_token_timeout');
  });

  it('keep-alive comments after the first token do not reset the idle timer (item 7)', async () => {
    const { up, gw } = await setup((_req, res) => {
      sseHead(res);
      res.write(roleChunk());
      const t = setInterval(() => res.write(': keep-alive\n\n'), 50);
      res.on('close', () => clearInterval(t));
    });
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.text).toContain(': keep-alive');
    expect(dataEvents(res.text).at(-1)).toBe('[DONE]');
    expect(result).toMatchObject({ outcome: 'failed_after_commit', reason: 'idle_timeout' });
    expect(await closedWithin(up.hits[0]!)).not.toBeNull();
  });

  it('an upstream that sends [DONE] but never ends its response is dropped after a second, not idle_timeout_ms', async () => {
    const held: Script = (_req, res, hit) => {
      sseHead(res);
      for (const f of chatStream(3)) {
        res.write(f);
        hit.bytesWritten += f.length;
      }
      // Never ends: the response stays open after [DONE].
    };
    const up = await upstream(held);
    const set = makeSet([up.url]);
    const gw = await gateway({ set, cfg: { ...FAST, idleTimeoutMs: 30_000 } });
    cleanups.push(up.close, () => set.close(), gw.close);
    const sentAt = performance.now();
    const res = await post(gw.url, chatBody({ stream_options: { include_usage: true } }));
    expect(res.text).toBe(chatStream(3).join(''));
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<null>((resolve) => {
      timer = setTimeout(() => resolve(null), 5_000);
    });
    const result = await Promise.race([gw.nextResult(), late]);
    clearTimeout(timer);
    // The attempt ended (its slot and the drain with it) long before the 30 s idle timeout.
    expect(result).toMatchObject({ outcome: 'ok', committed: true, completionTokens: 3 });
    const closedAt = await closedWithin(up.hits[0]!, 5_000);
    expect(closedAt).not.toBeNull();
    expect(closedAt! - sentAt).toBeGreaterThanOrEqual(1_000);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
  });

  it('a healthy stream longer than every timeout combined completes (item 8)', async () => {
    // 30 frames 100 ms apart: 3 s against 0.4 s first-token, idle and stall timeouts.
    const { gw } = await setup(healthy(27, 100));
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(dataEvents(res.text)).toHaveLength(29);
    expect(result.outcome).toBe('ok');
    expect(result.e2eMs).toBeGreaterThan(2500);
  });
});

describe('a stream of several sequences', () => {
  const choiceChunk = (index: number, delta: Record<string, unknown>, usage?: number) =>
    frame({
      id: 'chatcmpl-1',
      object: 'chat.completion.chunk',
      model: 'm',
      choices: [{ index, delta, logprobs: null, finish_reason: null }],
      // continuous_usage_stats: vLLM counts the chunk's own choice's tokens there.
      ...(usage === undefined
        ? {}
        : { usage: { prompt_tokens: 7, completion_tokens: usage, total_tokens: 7 + usage } }),
    });

  it("closes each choice's span at its end, an end chunk with no text (EOS) included", async () => {
    const { client, ready: clientReady } = streamToCome();
    const endsEmpty: Script = async (_req, res) => {
      sseHead(res);
      res.write(
        choiceChunk(0, { role: 'assistant', content: '' }) +
          choiceChunk(1, { role: 'assistant', content: '' }),
      );
      res.write(choiceChunk(0, { content: 'a' }) + choiceChunk(1, { content: 'b' }));
      // The ends leave 60 ms after the client has the texts: the gateway read the texts before
      // relaying them, so it reads the ends at least 60 ms later, however loaded the machine.
      await (await client).until((text) => text.includes('"b"'));
      const received = performance.now();
      while (performance.now() - received < 60) await sleep(5);
      const end = (index: number) =>
        frame({
          id: 'chatcmpl-1',
          object: 'chat.completion.chunk',
          model: 'm',
          choices: [
            { index, delta: { content: '' }, logprobs: null, finish_reason: 'stop', stop_reason: null },
          ],
        });
      res.write(end(0) + end(1));
      res.write(usageChunk(7, 4));
      res.end(DONE);
    };
    const up = await upstream(endsEmpty);
    const set = makeSet([up.url]);
    const gw = await gateway({ set });
    cleanups.push(up.close, () => set.close(), gw.close);
    const stream = await openStream(
      gw.url,
      '/v1/chat/completions',
      chatBody({ n: 2, stream_options: { include_usage: true } }),
    ).response;
    clientReady(stream);
    expect(await stream.ended).toEqual({ complete: true });
    const result = await gw.nextResult();
    // Each choice: its text, then its (empty) end at least 60 ms later; 4 tokens, 2 after the
    // firsts: TPOT (60 + 60) / 2 at least.
    expect(result.completionTokens).toBe(4);
    expect(result.tpotMs).toBeGreaterThanOrEqual(60);
  });

  it("cut before its final usage, counts what it relayed of every choice, not one choice's running count", async () => {
    const cutShort: Script = (_req, res) => {
      sseHead(res);
      res.write(
        choiceChunk(0, { role: 'assistant', content: '' }) +
          choiceChunk(1, { role: 'assistant', content: '' }),
      );
      for (let k = 1; k <= 3; k++) {
        res.write(choiceChunk(0, { content: `a${k}` }, k));
        res.write(choiceChunk(1, { content: `b${k}` }, k));
      }
      // The stream ends before its final chunk (no choices, the whole count) and its [DONE].
      res.end();
    };
    const up = await upstream(cutShort);
    const set = makeSet([up.url]);
    const gw = await gateway({ set });
    cleanups.push(up.close, () => set.close(), gw.close);
    await post(
      gw.url,
      chatBody({ n: 2, stream_options: { include_usage: true, continuous_usage_stats: true } }),
    );
    const result = await gw.nextResult();
    expect(result.committed).toBe(true);
    // Six content events over two choices, not the last chunk's 3.
    expect(result.completionTokens).toBe(6);
  });
});

describe('upstream errors reaching the client', () => {
  it('a 500 body never reaches the client (item 30)', async () => {
    const { gw } = await setup(status(500));
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(502);
    expect(res.text).not.toContain('secret');
    expect(res.text).not.toContain('InternalServerError');
    expect(await gw.nextResult()).toMatchObject({ reason: 'upstream_status', errorCode: 'upstream_error' });
  });

  it("a 400 is relayed with its status and the backend's message in the gateway's envelope, not retried", async () => {
    const { up, set, gw } = await setup(
      status(
        400,
        '{"error":{"message":"maximum context length is 10 tokens secret","type":"BadRequestError","param":"x-internal"}}',
      ),
    );
    const res = await post(gw.url, chatBody());
    const result = await gw.nextResult();
    expect(res.status).toBe(400);
    // The message tells the client what to fix (DESIGN section 4); the rest of the body stays out.
    expect(JSON.parse(res.text).error).toEqual({
      message: 'maximum context length is 10 tokens secret',
      code: 'invalid_request',
      type: 'invalid_request_error',
      param: null,
    });
    expect(res.text).not.toContain('BadRequestError');
    expect(res.text).not.toContain('x-internal');
    expect(result).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'upstream_rejected',
      attempts: 1,
      upstreamMessage: 'maximum context length is 10 tokens secret',
    });
    expect(up.hits).toHaveLength(1);
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
  });

  it("a 400 naming one of the request's own fields keeps that param; the client is told which to fix", async () => {
    const { gw } = await setup(
      status(
        400,
        '{"error":{"message":"bad stream options","type":"BadRequestError","param":"stream_options"}}',
      ),
    );
    const res = await post(gw.url, chatBody({ stream_options: { include_usage: 'yes' } }));
    expect(res.status).toBe(400);
    expect(JSON.parse(res.text).error).toMatchObject({ code: 'invalid_request', param: 'stream_options' });
    await gw.nextResult();
  });

  it('tells the slot of its first token, and not of a relayed 4xx (the TTFT fit learns from it)', async () => {
    const up = await upstream(status(400, '{"object":"error","message":"bad"}'), healthy(3));
    const set = makeSet([up.url]);
    // The slot a scheduler would grant, counting what it is told.
    const told: string[] = [];
    const acquire: AcquireSlot = async ({ excluded }) => {
      const b = set.list().find((x) => x.available && !excluded.has(x.name));
      if (b === undefined) return null;
      return { ...slotOn(b), prefillDone: () => told.push(`first token ${up.hits.length}`) };
    };
    const gw = await gateway({ set, acquire });
    cleanups.push(up.close, () => set.close(), gw.close);
    expect((await post(gw.url, chatBody({ stream: true }))).status).toBe(400);
    await gw.nextResult();
    expect(told).toEqual([]);
    expect((await post(gw.url, chatBody({ stream: true }))).status).toBe(200);
    await gw.nextResult();
    expect(told).toEqual(['first token 2']);
  });

  it('a 404 from the backend becomes model_not_found', async () => {
    const { gw } = await setup(status(404, '{"object":"error","message":"The model `x` does not exist."}'));
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(404);
    expect(JSON.parse(res.text).error.code).toBe('model_not_found');
  });
});

describe('non-streaming', () => {
  const completion = {
    id: 'cmpl-1',
    object: 'chat.completion',
    choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 5, completion_tokens: 9, total_tokens: 14 },
  };

  it('passes a body through unchanged, with token counts and no TTFT or TPOT (none is observable)', async () => {
    const body = JSON.stringify(completion);
    const { up, gw } = await setup(status(200, body));
    const res = await post(gw.url, chatBody({ stream: false }));
    const result = await gw.nextResult();
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toBe('application/json');
    expect(res.text).toBe(body);
    expect(up.hits[0]!.body.stream).toBe(false);
    expect(up.hits[0]!.body.stream_options).toBeUndefined();
    expect(result).toMatchObject({
      outcome: 'ok',
      promptTokens: 5,
      completionTokens: 9,
      ttftMs: null,
      tpotMs: null,
    });
    expect(result.e2eMs).toBeGreaterThan(0);
  });

  it('the first-token budget covers headers and body: a slow body times out', async () => {
    const { gw } = await setup(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":');
      await sleep(1_000);
      res.end('"x"}');
    });
    const res = await post(gw.url, chatBody({ stream: false }));
    expect(res.status).toBe(504);
    expect((await gw.nextResult()).reason).toBe('first_token_timeout');
  });

  it('a 200 carrying an error body is an upstream failure', async () => {
    const { gw } = await setup(status(200, '{"object":"error","message":"x"}'));
    const res = await post(gw.url, chatBody({ stream: false }));
    expect(res.status).toBe(502);
    expect((await gw.nextResult()).reason).toBe('in_band_error');
  });
});

describe('upstream request headers (item 29)', () => {
  it('sends only the allowlist: no client credentials, internal or hop-by-hop headers', async () => {
    const { up, gw } = await setup(healthy(1));
    await post(gw.url, chatBody(), {
      authorization: 'Bearer client-secret',
      'x-slagate-class': 'batch',
      'x-request-id': 'abc-123',
      te: 'trailers',
      'proxy-authorization': 'x',
    });
    const h = up.hits[0]!.headers;
    expect(h['x-request-id']).toMatch(/^abc-123\.[0-9a-f]{16}$/);
    expect(h['content-type']).toBe('application/json');
    expect(h.accept).toBe('text/event-stream');
    expect(h.authorization).toBeUndefined();
    expect(h['proxy-authorization']).toBeUndefined();
    expect(h.te).toBeUndefined();
    expect(Object.keys(h).filter((k) => k.startsWith('x-slagate'))).toEqual([]);
  });
});
