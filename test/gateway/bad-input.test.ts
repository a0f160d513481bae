// Bad input and hostile clients at the gateway's front door, and what never passes through it in
// either direction. Checklist items (research/reliability.md): 26, 27, 28, 29, 30.
import { createHash } from 'node:crypto';
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { once } from 'node:events';
import http from 'node:http';
import { connect } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { getProfile } from '../../src/sim/profiles.ts';
import { SimReplica } from '../../src/sim/replica.ts';
import { STAGE_CHANNEL, type StageMark } from '../../src/telemetry/stages.ts';
import { collect } from '../helpers/http.ts';
import {
  chat,
  chatStreamText,
  get,
  type Hit,
  MODEL,
  post,
  replicaRequests,
  type Script,
  scripted,
  send,
  sleep,
  startTestGateway,
  type TestGateway,
} from './harness.ts';

const CHAT = '/v1/chat/completions';
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function gateway(opts: Parameters<typeof startTestGateway>[0]): Promise<TestGateway> {
  const t = await startTestGateway(opts);
  cleanups.push(() => t.close());
  return t;
}

async function backend(script: Script): Promise<{ url: string; hits: Hit[] }> {
  const b = await scripted(script);
  cleanups.push(() => b.close());
  return b;
}

const healthyStream: Script = (_req, res) => {
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'x-upstream-secret': 'upstream-header-secret',
    server: 'uvicorn',
  });
  res.end(chatStreamText(3));
};

const errorOf = (text: string) =>
  (JSON.parse(text) as { error: { code: string; type: string; message: string } }).error;

/** Resolves when the gateway marks request `reqId` at `stage` (its stage channel). */
function stageMark(reqId: string, stage: StageMark['stage']): Promise<void> {
  return new Promise<void>((resolve) => {
    const onMark = (m: unknown) => {
      if ((m as StageMark).reqId !== reqId || (m as StageMark).stage !== stage) return;
      unsubscribe(STAGE_CHANNEL, onMark);
      resolve();
    };
    subscribe(STAGE_CHANNEL, onMark);
  });
}

/** A raw socket to the gateway that gathers what it reads; `until` resolves once that matches `re`. */
async function readingSocket(url: string) {
  const socket = await rawSocket(url);
  let text = '';
  const waiters: (() => void)[] = [];
  socket.on('data', (c: Buffer) => {
    text += c.toString('latin1');
    for (const w of waiters.splice(0)) w();
  });
  const until = async (re: RegExp) => {
    while (!re.test(text)) await new Promise<void>((r) => waiters.push(r));
  };
  return { socket, until, text: () => text };
}

/** A connected raw socket to the gateway at `url`. */
async function rawSocket(url: string) {
  const socket = connect(Number(new URL(url).port), '127.0.0.1');
  await once(socket, 'connect');
  return socket;
}

describe('26: body limits and prototype poisoning', () => {
  it('an oversized body → 413 body_too_large, refused, never proxied', async () => {
    const t = await gateway({ replicas: 1, config: { server: { body_limit_bytes: 4096 } } });
    const res = await post(t.url, CHAT, chat({ messages: [{ role: 'user', content: 'x'.repeat(8000) }] }), {
      'x-request-id': 'big-1',
    });
    expect(res.status).toBe(413);
    // The message names the limit: the client learns how far to cut.
    expect(errorOf(res.text)).toMatchObject({
      code: 'body_too_large',
      message: expect.stringContaining('4096 bytes'),
    });
    expect(await t.recordOf('big-1')).toMatchObject({ outcome: 'refused', reason: 'body_too_large' });
    expect(await replicaRequests(t.fleet!.urls[0]!)).toBe(0);
  });

  it('__proto__ / constructor.prototype keys, bad JSON, a non-object body → 400', async () => {
    const t = await gateway({ replicas: 1 });
    const bodies = [
      `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"__proto__":{"admin":true}}`,
      `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"constructor":{"prototype":{"x":1}}}`,
      '{"model":',
      '[1,2,3]',
      `{"model":"${MODEL}","messages":"not a list"}`,
      `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"max_tokens":-3}`,
    ];
    for (const [i, body] of bodies.entries()) {
      const res = await post(t.url, CHAT, body, { 'x-request-id': `poison-${i}` });
      expect(res.status, body).toBe(400);
      expect(errorOf(res.text)).toMatchObject({ code: 'invalid_request', type: 'invalid_request_error' });
      expect(await t.recordOf(`poison-${i}`)).toMatchObject({
        outcome: 'refused',
        reason: 'invalid_request',
      });
    }
    expect(({} as Record<string, unknown>).admin).toBeUndefined();
    expect(await replicaRequests(t.fleet!.urls[0]!)).toBe(0);
  });

  it('a body nested thousands deep → 400 on the body, before admission; 128 levels still pass', async () => {
    const t = await gateway({ replicas: 1 });
    const nest = (depth: number) => `${'['.repeat(depth)}${']'.repeat(depth)}`;
    const deep = 5_000;
    // Where the gateway stringifies again: a content part and a tool definition (the canonical
    // prompt); and a field it does not read (carried upstream as the client's bytes, or
    // re-serialised when those are not plain UTF-8).
    const bodies = [
      `{"model":"${MODEL}","messages":[{"role":"user","content":[{"type":"image","x":${nest(deep)}}]}]}`,
      `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":${nest(deep)}}}]}`,
      `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"extra":${nest(deep)}}`,
    ];
    for (const [i, body] of bodies.entries()) {
      const res = await post(t.url, CHAT, body, { 'x-request-id': `deep-${i}` });
      expect(res.status, body.slice(0, 120)).toBe(400);
      expect(errorOf(res.text)).toMatchObject({ code: 'invalid_request', type: 'invalid_request_error' });
      expect(JSON.parse(res.text).error.param).toBe('body');
      expect(await t.recordOf(`deep-${i}`)).toMatchObject({ outcome: 'refused', reason: 'invalid_request' });
    }
    expect(await replicaRequests(t.fleet!.urls[0]!)).toBe(0);
    // The body is depth 1, `extra` 2, its arrays 3 to 128: served.
    const ok = await post(
      t.url,
      CHAT,
      `{"model":"${MODEL}","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"extra":${nest(127)}}`,
      { 'x-request-id': 'deep-ok' },
    );
    expect(ok.status).toBe(200);
  });
});

describe('26: the front door reads the body as fastify did', () => {
  it('a body that is not application/json → 400 on content-type; any case and parameters pass', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const body = JSON.stringify(chat({ stream: true }));
    const plain = await post(t.url, CHAT, body, { 'content-type': 'text/plain', 'x-request-id': 'ct-plain' });
    expect(plain.status).toBe(400);
    expect(errorOf(plain.text)).toMatchObject({ code: 'invalid_request', param: 'content-type' });
    expect(plain.headers['x-request-id']).toBe('ct-plain');
    expect(await t.recordOf('ct-plain')).toMatchObject({ outcome: 'refused', reason: 'invalid_request' });
    // application/json-seq is another media type, not JSON with a suffix.
    const seq = await post(t.url, CHAT, body, { 'content-type': 'application/json-seq' });
    expect(seq.status).toBe(400);
    const upper = await post(t.url, `${CHAT}?trace=1`, body, {
      'content-type': 'Application/JSON ; charset=utf-8',
    });
    expect(upper.status).toBe(200);
    expect(b.hits).toHaveLength(1);
    expect(JSON.parse(b.hits[0]!.body)).toMatchObject({ model: MODEL, stream: true });
    // A compressed body is refused for its encoding, not taken for bytes that are not UTF-8;
    // `identity` is no encoding.
    const gzipped = await post(t.url, CHAT, body, { 'content-encoding': 'gzip' });
    expect(gzipped.status).toBe(400);
    expect(errorOf(gzipped.text)).toMatchObject({ code: 'invalid_request', param: 'content-encoding' });
    expect(errorOf(gzipped.text).message).toContain("Content-Encoding 'gzip' is not supported");
    expect((await post(t.url, CHAT, body, { 'content-encoding': 'identity' })).status).toBe(200);
    expect(b.hits).toHaveLength(2);
  });

  it('no body at all → 400 invalid_request from intake; a chunked body over the limit → 413', async () => {
    const t = await gateway({ replicas: 1, config: { server: { body_limit_bytes: 4096 } } });
    const empty = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const req = http.request(`${t.url}${CHAT}`, {
        method: 'POST',
        agent: false,
        headers: { 'x-request-id': 'no-body' },
      });
      req.on('response', (res) => collect(res).then(resolve, reject));
      req.on('error', reject);
      req.end();
    });
    expect(empty.status).toBe(400);
    expect(errorOf(empty.text)).toMatchObject({ code: 'invalid_request', param: 'body' });
    expect(await t.recordOf('no-body')).toMatchObject({ outcome: 'refused', reason: 'invalid_request' });
    // No content-length: the limit is found while reading, and the answer comes before the end.
    const big = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const req = http.request(`${t.url}${CHAT}`, {
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'x-request-id': 'big-chunked' },
      });
      req.on('response', (res) => collect(res).then(resolve, reject));
      req.on('error', reject);
      req.write(`{"model":"${MODEL}","messages":[{"role":"user","content":"`);
      req.write('x'.repeat(8192));
    });
    expect(big.status).toBe(413);
    expect(errorOf(big.text)).toMatchObject({
      code: 'body_too_large',
      message: expect.stringContaining('4096 bytes'),
    });
    expect(await t.recordOf('big-chunked')).toMatchObject({ outcome: 'refused', reason: 'body_too_large' });
    expect(await replicaRequests(t.fleet!.urls[0]!)).toBe(0);
  });

  it('a refused body ends its keep-alive connection, a served request keeps it; encoded paths route', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({
      backends: [{ name: 'b0', url: b.url }],
      config: { server: { body_limit_bytes: 4096 } },
    });
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    cleanups.push(async () => agent.destroy());
    const viaAgent = (method: string, path: string, body: string | undefined, id: string) =>
      new Promise<{ status: number; connection: string | undefined }>((resolve, reject) => {
        const req = http.request(`${t.url}${path}`, {
          method,
          agent,
          headers: { 'content-type': 'application/json', 'x-request-id': id },
        });
        req.on('response', (res) =>
          collect(res).then((r) => resolve({ status: r.status, connection: r.headers.connection }), reject),
        );
        req.on('error', reject);
        req.end(body);
      });
    const good = JSON.stringify(chat({ stream: true }));
    expect(await viaAgent('POST', CHAT, good, 'ka-ok')).toEqual({ status: 200, connection: 'keep-alive' });
    expect(await viaAgent('POST', CHAT, '{"model":', 'ka-bad')).toEqual({ status: 400, connection: 'close' });
    const big = JSON.stringify(chat({ messages: [{ role: 'user', content: 'x'.repeat(8000) }] }));
    expect(await viaAgent('POST', CHAT, big, 'ka-big')).toEqual({ status: 413, connection: 'close' });
    // The router reads a percent-encoded path decoded, and so does the front door.
    expect((await viaAgent('POST', '/v1/chat/%63ompletions', good, 'enc-chat')).status).toBe(200);
    expect(
      (await send(t.url, 'GET', '/v1/%6dodels', undefined, { 'x-request-id': 'enc-models' })).status,
    ).toBe(200);
    expect(await t.recordOf('enc-chat')).toMatchObject({ outcome: 'ok' });
    expect(await t.recordOf('ka-big')).toMatchObject({ outcome: 'refused', reason: 'body_too_large' });
    // Listing models, however spelt, is not an inference request: no record.
    await post(t.url, CHAT, good, { 'x-request-id': 'after-models' });
    await t.recordOf('after-models');
    expect((await t.records()).map((r) => r.req_id)).not.toContain('enc-models');
    expect(b.hits).toHaveLength(3);
    // A request target in absolute form (as a client behind a forward proxy may send it) routes by
    // its path, as fastify's routes do.
    const socket = await rawSocket(t.url);
    const reply: Buffer[] = [];
    socket.on('data', (c: Buffer) => reply.push(c));
    // Written, not ended: a client that half-closes before its answer has left (client_cancelled).
    socket.write(
      `POST http://gw.example:80${CHAT} HTTP/1.1\r\nhost: gw.example\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(good)}\r\nx-request-id: abs-chat\r\nconnection: close\r\n\r\n${good}`,
    );
    await once(socket, 'close');
    expect(Buffer.concat(reply).toString('latin1')).toMatch(/^HTTP\/1\.1 200 /);
    expect(await t.recordOf('abs-chat')).toMatchObject({ outcome: 'ok' });
    expect(b.hits).toHaveLength(4);
    // Targets fastify takes for no URL (another scheme, no authority, a fragment): its 400, and no
    // record the front door began and nobody ended (which the close would make a client's cancel).
    for (const [i, target] of [`ftp://h${CHAT}`, `http://${CHAT}`, `http://h${CHAT}#x`].entries()) {
      const s = await rawSocket(t.url);
      const got: Buffer[] = [];
      s.on('data', (c: Buffer) => got.push(c));
      s.write(
        `POST ${target} HTTP/1.1\r\nhost: h\r\ncontent-type: application/json\r\n` +
          `content-length: ${Buffer.byteLength(good)}\r\nx-request-id: abs-bad-${i}\r\nconnection: close\r\n\r\n${good}`,
      );
      await once(s, 'close');
      expect(Buffer.concat(got).toString('latin1'), target).toMatch(/^HTTP\/1\.1 400 /);
    }
    await post(t.url, CHAT, good, { 'x-request-id': 'after-abs' });
    await t.recordOf('after-abs');
    const ended = (await t.records()).filter((r) => r.req_id.startsWith('abs-bad-'));
    expect(ended.filter((r) => r.outcome !== 'refused')).toEqual([]);
  });

  it('a body that arrives in pieces reaches the backend byte for byte', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const body = Buffer.from(
      JSON.stringify(chat({ stream: true, messages: [{ role: 'user', content: 'ünïcödé 海 '.repeat(50) }] })),
    );
    const received = stageMark('pieces', 'received');
    const socket = await rawSocket(t.url);
    const reply: Buffer[] = [];
    socket.on('data', (c: Buffer) => reply.push(c));
    socket.write(
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        `content-length: ${body.length}\r\nx-request-id: pieces\r\nconnection: close\r\n\r\n`,
    );
    // The first piece ends inside a multi-byte character; the rest follows once the request is in.
    const cut = body.indexOf(Buffer.from('海')) + 1;
    socket.write(body.subarray(0, cut));
    await received;
    socket.write(body.subarray(cut));
    await once(socket, 'close');
    expect(Buffer.concat(reply).toString('utf8')).toMatch(/^HTTP\/1\.1 200 /);
    expect(b.hits).toHaveLength(1);
    const sent = JSON.parse(b.hits[0]!.body) as { messages: unknown };
    expect(sent.messages).toEqual(JSON.parse(body.toString('utf8')).messages);
  });

  it("a slow upload is the client's time: the gateway's overhead is counted from the body's last byte", async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const body = Buffer.from(JSON.stringify(chat({ stream: true })));
    const received = stageMark('slow-upload', 'received');
    const socket = await rawSocket(t.url);
    socket.resume();
    socket.write(
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        `content-length: ${body.length}\r\nx-request-id: slow-upload\r\nconnection: close\r\n\r\n`,
    );
    socket.write(body.subarray(0, 10));
    await received;
    // The upload itself is what is slow here: the rest of the body follows 400 ms after its start.
    await sleep(400);
    socket.write(body.subarray(10));
    await once(socket, 'close');
    expect(b.hits).toHaveLength(1);
    const metrics = (await get(t.url, '/metrics')).text;
    expect(metrics).toMatch(/^slagate_overhead_seconds_count 1$/m);
    const sum = Number(/^slagate_overhead_seconds_sum (\S+)$/m.exec(metrics)![1]);
    expect(sum).toBeGreaterThan(0);
    expect(sum).toBeLessThan(0.2);
  });

  it('a client that stops sending mid-body → 504 at the request deadline and the connection closed', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({
      backends: [{ name: 'b0', url: b.url }],
      config: { upstream: { first_token_timeout_ms: 300 } },
    });
    const { port } = new URL(t.url);
    const socket = connect(Number(port), '127.0.0.1');
    await once(socket, 'connect');
    const reply: Buffer[] = [];
    socket.on('data', (c: Buffer) => reply.push(c));
    const sentAt = performance.now();
    socket.write(
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        'content-length: 100\r\nx-request-id: stalled\r\n\r\n{"model":',
    );
    // Nothing more is sent: the gateway answers and hangs up by itself.
    await once(socket, 'close');
    expect(performance.now() - sentAt).toBeGreaterThanOrEqual(290);
    const text = Buffer.concat(reply).toString('utf8');
    expect(text).toMatch(/^HTTP\/1\.1 504 /);
    expect(text.toLowerCase()).toContain('connection: close');
    expect(errorOf(text.slice(text.indexOf('\r\n\r\n') + 4))).toMatchObject({ code: 'first_token_timeout' });
    expect(await t.recordOf('stalled')).toMatchObject({ outcome: 'refused', reason: 'first_token_timeout' });
    expect(b.hits).toHaveLength(0);
  });

  it('the same on a route fastify serves (which waits for a body before it routes): 504, closed', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({
      backends: [{ name: 'b0', url: b.url }],
      config: { upstream: { first_token_timeout_ms: 300 } },
    });
    for (const path of ['/healthz', '/v1/embeddings']) {
      const socket = connect(Number(new URL(t.url).port), '127.0.0.1');
      await once(socket, 'connect');
      const reply: Buffer[] = [];
      socket.on('data', (c: Buffer) => reply.push(c));
      socket.write(
        `POST ${path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
          'content-length: 100000\r\nx-request-id: slow-body\r\n\r\n{"a":',
      );
      await once(socket, 'close');
      const text = Buffer.concat(reply).toString('utf8');
      expect(text).toMatch(/^HTTP\/1\.1 504 /);
      expect(text.toLowerCase()).toContain('connection: close');
      expect(errorOf(text.slice(text.indexOf('\r\n\r\n') + 4))).toMatchObject({
        code: 'first_token_timeout',
      });
    }
    // The /v1 path had a record: ended refused, once.
    expect(await t.recordOf('slow-body')).toMatchObject({
      outcome: 'refused',
      reason: 'first_token_timeout',
    });
  });
});

/** A gateway in front of one simulated replica whose context length is 256 tokens. */
async function smallContextGateway() {
  const replica = await SimReplica.start({
    profile: { ...getProfile('llama3-8b-h100'), maxModelLen: 256 },
    timeScale: 0.1,
  });
  cleanups.push(() => replica.close());
  const t = await gateway({ backends: [{ name: 'small', url: replica.url }] });
  return { replica, t };
}

describe('a request that is not HTTP', () => {
  /** Sends `head` on a raw connection and returns what comes back before the gateway closes it. */
  async function raw(url: string, head: string): Promise<string> {
    const socket = connect(Number(new URL(url).port), '127.0.0.1');
    await once(socket, 'connect');
    const reply: Buffer[] = [];
    socket.on('data', (c: Buffer) => reply.push(c));
    socket.write(head);
    await once(socket, 'close');
    return Buffer.concat(reply).toString('utf8');
  }
  const envelopeOf = (reply: string) => JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4)).error;

  it("a malformed head or one over the size limit gets the gateway's envelope, never fastify's", async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const bad = await raw(t.url, `POST ${CHAT} HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n`);
    expect(bad).toMatch(/^HTTP\/1\.1 400 /);
    expect(envelopeOf(bad)).toEqual({
      message: 'The request is not valid HTTP/1.1.',
      type: 'invalid_request_error',
      param: null,
      code: 'invalid_request',
    });
    const huge = await raw(
      t.url,
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-secret\r\nx-pad: ${'p'.repeat(20_000)}\r\n\r\n`,
    );
    expect(huge).toMatch(/^HTTP\/1\.1 431 /);
    expect(envelopeOf(huge)).toMatchObject({ type: 'invalid_request_error', code: 'invalid_request' });
    expect(huge).not.toContain('sk-secret');
    // A bad chunk in the body of the request in flight: the answer is that request's own, with
    // its id, and so is its record: refused, not a client that left.
    const chunk = await raw(
      t.url,
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nx-request-id: bad-chunk\r\n\r\nzz\r\n{}\r\n`,
    );
    expect(chunk).toMatch(/^HTTP\/1\.1 400 /);
    expect(chunk).toMatch(/\r\nx-request-id: bad-chunk\r\n/);
    expect(envelopeOf(chunk)).toMatchObject({ code: 'invalid_request' });
    // One good chunk, then a broken one.
    const later = await raw(
      t.url,
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nx-request-id: bad-chunk-2\r\n\r\n5\r\n{"mes\r\nZZ\r\n`,
    );
    expect(later).toMatch(/^HTTP\/1\.1 400 /);
    expect(later).toMatch(/\r\nx-request-id: bad-chunk-2\r\n/);
    for (const id of ['bad-chunk', 'bad-chunk-2'])
      expect(await t.recordOf(id)).toMatchObject({
        outcome: 'refused',
        decision: 'refused',
        reason: 'invalid_request',
      });
    expect(b.hits).toHaveLength(0);
  });
});

describe('Expect: 100-continue', () => {
  it('the 100 goes when the body is about to be read: a request refused on its head is answered without it', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({
      backends: [{ name: 'b0', url: b.url }],
      config: { server: { body_limit_bytes: 4096 } },
    });
    const good = JSON.stringify(chat({ stream: true }));
    const head = (id: string, length: number) =>
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n` +
      `expect: 100-continue\r\nx-request-id: ${id}\r\nconnection: close\r\n\r\n`;
    const open = () => readingSocket(t.url);
    // Over the limit by its length: 413 at once, no 100, nothing of the body sent.
    const big = await open();
    big.socket.write(head('exp-big', 100_000));
    await once(big.socket, 'close');
    expect(big.text()).toMatch(/^HTTP\/1\.1 413 /);
    expect(big.text()).not.toContain('100 Continue');
    // A request the head does not refuse: the 100, then the body, then the answer.
    const ok = await open();
    ok.socket.write(head('exp-ok', Buffer.byteLength(good)));
    await ok.until(/^HTTP\/1\.1 100 Continue\r\n\r\n/);
    expect(ok.text()).toBe('HTTP/1.1 100 Continue\r\n\r\n');
    ok.socket.write(good);
    await once(ok.socket, 'close');
    expect(ok.text()).toMatch(/\r\n\r\nHTTP\/1\.1 200 /);
    expect(await t.recordOf('exp-ok')).toMatchObject({ outcome: 'ok' });
    expect(await t.recordOf('exp-big')).toMatchObject({ outcome: 'refused', reason: 'body_too_large' });
    expect(b.hits).toHaveLength(1);
  });
});

describe('Expect: anything else', () => {
  it('an expectation the gateway cannot meet → 417 in the envelope with the id, the record refused, the body never read', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const body = JSON.stringify(chat({ stream: true }));
    const open = () => readingSocket(t.url);
    const envelope = (answer: string) => errorOf(answer.slice(answer.indexOf('\r\n\r\n') + 4));
    // A body of declared length: answered, dropped unread, and the connection kept for the next
    // request (which the client sends on it after the answer).
    const kept = await open();
    kept.socket.write(
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
        `content-length: ${Buffer.byteLength(body)}\r\nexpect: 200-ok\r\nx-request-id: exp-other\r\n\r\n${body}`,
    );
    await kept.until(/"code":"invalid_request"\}\}$/);
    const answer = kept.text();
    expect(answer).toMatch(/^HTTP\/1\.1 417 /);
    expect(answer).toMatch(/\r\nx-request-id: exp-other\r\n/);
    expect(answer).toMatch(/\r\ncontent-type: application\/json\r\n/);
    expect(answer.toLowerCase()).not.toContain('connection: close');
    expect(envelope(answer)).toMatchObject({ code: 'invalid_request', type: 'invalid_request_error' });
    kept.socket.write('GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
    await once(kept.socket, 'close');
    expect(kept.text().slice(answer.length)).toMatch(/^HTTP\/1\.1 200 /);
    expect(await t.recordOf('exp-other')).toMatchObject({
      outcome: 'refused',
      decision: 'refused',
      reason: 'invalid_request',
    });
    // A body of no declared length, to a route that is not an inference one: the same answer, and
    // the connection ends with it.
    const closed = await open();
    closed.socket.write(
      'POST /healthz HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nexpect: 200-ok\r\n\r\n5\r\nhello\r\n',
    );
    await once(closed.socket, 'close');
    expect(closed.text()).toMatch(/^HTTP\/1\.1 417 /);
    expect(closed.text().toLowerCase()).toContain('connection: close');
    expect(envelope(closed.text()).code).toBe('invalid_request');
    expect(b.hits).toHaveLength(0);
  });
});

describe('connections without a request', () => {
  it('one that never sends a byte is closed after the keep-alive timeout; a slow request is not cut', async () => {
    // The backend takes longer than the keep-alive timeout to its first token.
    const slow: Script = (req, res, hit) => {
      setTimeout(() => healthyStream(req, res, hit), 700);
    };
    const b = await backend(slow);
    const t = await gateway({
      backends: [{ name: 'b0', url: b.url }],
      config: { server: { keep_alive_timeout_ms: 300 } },
    });
    const silent = connect(Number(new URL(t.url).port), '127.0.0.1');
    await once(silent, 'connect');
    const openedAt = performance.now();
    let timer: NodeJS.Timeout | undefined;
    const stillOpen = new Promise<'open'>((resolve) => {
      timer = setTimeout(() => resolve('open'), 5_000);
    });
    const served = post(t.url, CHAT, { ...chat(), stream: true });
    expect(await Promise.race([once(silent, 'close').then(() => 'closed' as const), stillOpen])).toBe(
      'closed',
    );
    clearTimeout(timer);
    expect(performance.now() - openedAt).toBeGreaterThanOrEqual(250);
    const res = await served;
    expect(res.status).toBe(200);
    expect(res.text).toContain('data: [DONE]');
  });
});

describe('27: context length', () => {
  it('a prompt over the backend context length → 400, never dispatched', async () => {
    const { replica, t } = await smallContextGateway();
    expect(JSON.parse((await get(t.url, '/v1/models')).text).data[0].max_model_len).toBe(256);
    const longPrompt = 'The quick brown fox jumps over the lazy dog. '.repeat(40);
    const over = await post(t.url, CHAT, chat({ messages: [{ role: 'user', content: longPrompt }] }), {
      'x-request-id': 'ctx-1',
    });
    expect(over.status).toBe(400);
    expect(errorOf(over.text).code).toBe('invalid_request');
    expect(over.text).toContain('maximum context length is 256 tokens');
    // Prompt fits, but not with the completion asked for.
    const withMax = await post(
      t.url,
      '/v1/completions',
      { model: MODEL, prompt: 'Hello there', max_tokens: 300 },
      { 'x-request-id': 'ctx-2' },
    );
    expect(withMax.status).toBe(400);
    expect(await t.recordOf('ctx-1')).toMatchObject({ outcome: 'refused', reason: 'invalid_request' });
    expect((await t.recordOf('ctx-2')).prompt_tokens_est).toBeGreaterThan(0);
    expect(await replicaRequests(replica.url)).toBe(0);
    expect(replica.stats().engine.promptTokens).toBe(0);
    // A request that fits is served.
    expect((await post(t.url, CHAT, chat({ max_tokens: 10 }))).status).toBe(200);
  });

  it('a prompt that fits is never refused for its characters: a padded table, many characters a token, is served', async () => {
    const { replica, t } = await smallContextGateway();
    await get(t.url, '/v1/models');
    // 20 rows of a padded table: about 2,600 characters, which the estimate (four a token) puts far
    // over 256 tokens; the backend counts about 150 (a run of spaces is one token).
    const row = (i: number) => `| item ${i}${' '.repeat(56)}| ${i * 7}${' '.repeat(56)}|\n`;
    const table = Array.from({ length: 20 }, (_, i) => row(i)).join('');
    expect(table.length).toBeGreaterThan(256 * 1.25 * 5);
    const res = await post(
      t.url,
      CHAT,
      chat({ max_tokens: 10, messages: [{ role: 'user', content: table }] }),
      { 'x-request-id': 'padded' },
    );
    expect(res.status, res.text).toBe(200);
    const served = await t.recordOf('padded');
    expect(served).toMatchObject({ outcome: 'ok', backend: 'small' });
    expect(served.prompt_tokens!).toBeLessThan(256);
    expect(replica.stats().engine.promptTokens).toBe(served.prompt_tokens);
  });

  it('a prompt near the limit is judged by the backend, which counts exactly, and its message reaches the client', async () => {
    const { t } = await smallContextGateway();
    // About 260 tokens with the template, against 256: within the estimate's slack (it estimates
    // about 290 before it has learnt this text's ratio), so the gateway does not refuse it.
    const nearPrompt = 'The quick brown fox jumps over the lazy dog. '.repeat(25);
    const near = await post(t.url, CHAT, chat({ messages: [{ role: 'user', content: nearPrompt }] }), {
      'x-request-id': 'ctx-near',
    });
    expect(near.status, near.text).toBe(400);
    expect(errorOf(near.text).code).toBe('invalid_request');
    // vLLM's own wording, with its exact count.
    expect(near.text).toMatch(
      /maximum context length is 256 tokens\. However, your request has \d+ input tokens/,
    );
    // It was sent, once: the backend's answer, not the gateway's estimate, refused it.
    const record = await t.recordOf('ctx-near');
    expect(record).toMatchObject({ reason: 'invalid_request', backend: 'small', attempts: 1 });
    // Estimated over the context, but within the slack the gateway lets through: routed by its
    // blocks, as a conversation near the context whose estimate runs high must be (else it would
    // go cold at every turn).
    expect(record.prefix_blocks).toBeGreaterThan(0);
  });

  it('a prompt over the context even at the fewest tokens it plausibly holds is routed by no blocks', async () => {
    const { t } = await smallContextGateway();
    // About 560 tokens at four characters a token: over 256 × 1.25. Its floor (words) is under
    // the context, so the gateway does not refuse it; the backend does, and nothing is cached.
    const padded = 'word '.repeat(200) + '. '.repeat(500);
    const res = await post(t.url, CHAT, chat({ messages: [{ role: 'user', content: padded }] }), {
      'x-request-id': 'ctx-far',
    });
    expect(res.status, res.text).toBe(400);
    expect(await t.recordOf('ctx-far')).toMatchObject({ backend: 'small', prefix_blocks: 0 });
    expect(t.gw.runtime.live.prefixSize('small').blocks).toBe(0);
  });
});

describe('27c: a prompt the backend will truncate', () => {
  it('is not refused for its length when truncate_prompt_tokens cuts it to fit, as vLLM cuts it first', async () => {
    const { t } = await smallContextGateway();
    await get(t.url, '/v1/models');
    const ids = Array.from({ length: 400 }, (_, i) => 100 + i);
    const cut = await post(t.url, '/v1/completions', {
      model: MODEL,
      prompt: ids,
      max_tokens: 10,
      truncate_prompt_tokens: 100,
    });
    expect(cut.status, cut.text).toBe(200);
    // Planned and charged as the backend will prefill it: its last 100 tokens. What it caches
    // starts past the prompt's leading blocks: routed by none (no hit counted, none taught).
    expect((await t.records()).at(-1)).toMatchObject({ prompt_tokens_est: 100, prefix_blocks: 0 });
    // The cut written as a string, which the gateway would otherwise misread as none: the
    // gateway's own 400 naming the field, as for a sampling parameter of the wrong type.
    const asText = await post(t.url, '/v1/completions', {
      model: MODEL,
      prompt: ids,
      max_tokens: 10,
      truncate_prompt_tokens: '100',
    });
    expect(asText.status).toBe(400);
    expect(errorOf(asText.text)).toMatchObject({ code: 'invalid_request', param: 'truncate_prompt_tokens' });
    // Cut by nothing (the prompt is shorter than 500), the same prompt is routed by its blocks.
    const uncut = await post(t.url, '/v1/completions', {
      model: MODEL,
      prompt: ids.slice(0, 200),
      max_tokens: 10,
      truncate_prompt_tokens: 500,
    });
    expect(uncut.status, uncut.text).toBe(200);
    expect((await t.records()).at(-1)).toMatchObject({ prompt_tokens_est: 200 });
    expect((await t.records()).at(-1)!.prefix_blocks).toBeGreaterThan(0);
    // A text prompt the backend cuts teaches no characters-per-token ratio: it counts fewer than were sent.
    const learnt = t.gw.runtime.tokens.fleet.samples;
    const fox = (times: number) => [
      { role: 'user', content: 'The quick brown fox jumps over the lazy dog. '.repeat(times) },
    ];
    /** Sends a served chat with these fields; resolves with the ratio samples learnt so far. */
    const samplesAfter = async (fields: Record<string, unknown>) => {
      const res = await post(t.url, CHAT, { ...chat({ max_tokens: 5 }), ...fields });
      expect(res.status, res.text).toBe(200);
      await t.records();
      return t.gw.runtime.tokens.fleet.samples;
    };
    expect(await samplesAfter({ messages: fox(40), truncate_prompt_tokens: 200 })).toBe(learnt);
    // Nor does one with documents: vLLM renders them into the prompt, and no count here holds them.
    expect(
      await samplesAfter({ messages: fox(8), documents: [{ title: 'a', text: 'lorem ipsum '.repeat(20) }] }),
    ).toBe(learnt);
    // The same prompt without them teaches one (the control).
    expect(await samplesAfter({ messages: fox(8) })).toBe(learnt + 1);
    // Without it the same prompt is over the 256-token context, and refused here.
    const whole = await post(t.url, '/v1/completions', { model: MODEL, prompt: ids, max_tokens: 10 });
    expect(whole.status).toBe(400);
    expect(whole.text).toContain('maximum context length is 256 tokens');
  });
});

describe('27b: context length of completion prompts, as vLLM counts it', () => {
  it("judges each of several prompts on its own, and a prompt without max_tokens with vLLM's default of 16", async () => {
    const { t } = await smallContextGateway();
    await get(t.url, '/v1/models');
    const ids = (n: number) => Array.from({ length: n }, (_, i) => 100 + i);
    // Two prompts of 200 ids: 400 together, but each fits with its 10 tokens. The gateway leaves
    // them to the backend (this simulator takes one prompt per request and says so).
    const two = await post(
      t.url,
      '/v1/completions',
      { model: MODEL, prompt: [ids(200), ids(200)], max_tokens: 10 },
      { 'x-request-id': 'ctx-two' },
    );
    expect(two.text).toContain('one prompt per request');
    expect(await t.recordOf('ctx-two')).toMatchObject({ backend: 'small', attempts: 1 });
    // Neither is over the context, nor cut by a truncate_prompt_tokens of 300, though together they
    // are 400 tokens: routed by the first prompt's blocks (200 ids: three of 64).
    expect((await t.recordOf('ctx-two')).prefix_blocks).toBe(3);
    await post(
      t.url,
      '/v1/completions',
      { model: MODEL, prompt: [ids(200), ids(200)], max_tokens: 10, truncate_prompt_tokens: 300 },
      { 'x-request-id': 'ctx-two-cut' },
    );
    // Cut one by one, neither is: 400 tokens to prefill, not 300.
    expect(await t.recordOf('ctx-two-cut')).toMatchObject({ prefix_blocks: 3, prompt_tokens_est: 400 });
    // 250 ids and no max_tokens: vLLM would generate up to 16, past 256. Refused here, exactly.
    const full = await post(
      t.url,
      '/v1/completions',
      { model: MODEL, prompt: ids(250) },
      { 'x-request-id': 'ctx-default' },
    );
    expect(full.status).toBe(400);
    expect(full.text).toContain('you requested 266 tokens (250 in the messages, 16 in the completion)');
    expect(await t.recordOf('ctx-default')).toMatchObject({ outcome: 'refused', backend: null, attempts: 0 });
    // max_tokens sent as null is no default but no limit: vLLM serves it, up to the context's end.
    const open = await post(
      t.url,
      '/v1/completions',
      { model: MODEL, prompt: ids(250), max_tokens: null, ignore_eos: true },
      { 'x-request-id': 'ctx-null' },
    );
    expect(open.status).toBe(200);
    expect(JSON.parse(open.text).usage.completion_tokens).toBe(6);
    expect(await t.recordOf('ctx-null')).toMatchObject({ outcome: 'ok', backend: 'small' });
  });
});

// vLLM serves its one model to a request that names none (absent, null or empty); so does the
// gateway when it serves one, and it says which are served when it serves several.
describe('a body that names no model', () => {
  it('gets the one model served: absent, null and empty alike', async () => {
    const t = await gateway({ replicas: 1 });
    const { model: _named, ...unnamed } = chat();
    const bodies = [unnamed, { ...unnamed, model: null }, { ...unnamed, model: '' }];
    for (const [i, body] of bodies.entries()) {
      const res = await post(t.url, CHAT, body, { 'x-request-id': `unnamed-${i}` });
      expect(res.status, JSON.stringify(body)).toBe(200);
      expect(JSON.parse(res.text).model).toBe(MODEL);
      expect(await t.recordOf(`unnamed-${i}`)).toMatchObject({ outcome: 'ok', model: MODEL });
    }
    const typed = await post(t.url, CHAT, { ...unnamed, model: 5 }, { 'x-request-id': 'model-number' });
    expect(typed.status).toBe(400);
    expect(errorOf(typed.text)).toMatchObject({ code: 'invalid_request', param: 'model' });
  });

  it('the backend is told that model, not left to its own default', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const { model: _named, ...unnamed } = chat();
    const res = await post(t.url, CHAT, { ...unnamed, model: null, stream: true });
    expect(res.status).toBe(200);
    expect(JSON.parse(b.hits[0]!.body).model).toBe(MODEL);
  });

  it('is refused with the served models named when there are several', async () => {
    const t = await gateway({ replicas: 1, config: { models: [MODEL, 'other-model'] } });
    const { model: _named, ...unnamed } = chat();
    const res = await post(t.url, CHAT, unnamed, { 'x-request-id': 'unnamed-of-two' });
    expect(res.status).toBe(400);
    const err = errorOf(res.text);
    expect(err).toMatchObject({ code: 'invalid_request', param: 'model' });
    expect(err.message).toContain(`${MODEL}, other-model`);
    expect(await t.recordOf('unnamed-of-two')).toMatchObject({
      outcome: 'refused',
      reason: 'invalid_request',
    });
    expect(await replicaRequests(t.fleet!.urls[0]!)).toBe(0);
  });
});

describe('28: keys and the route allowlist', () => {
  const sha = (k: string) => createHash('sha256').update(k).digest('hex');
  const tenants = [
    {
      name: 'team-a',
      api_key_sha256: sha('key-a'),
      class: 'interactive',
      allowed_classes: ['interactive', 'batch'],
    },
    { name: 'team-b', api_key_sha256: sha('key-b'), class: 'batch' },
  ];

  it('a bad or missing key → 401; a good key works and names its tenant and class', async () => {
    const t = await gateway({ replicas: 1, config: { tenants } });
    for (const [i, auth] of [undefined, 'Bearer wrong', 'key-a', 'Basic a2V5LWE='].entries()) {
      const headers: http.OutgoingHttpHeaders = { 'x-request-id': `auth-${i}` };
      if (auth !== undefined) headers.authorization = auth;
      const res = await post(t.url, CHAT, chat(), headers);
      expect(res.status, String(auth)).toBe(401);
      expect(errorOf(res.text)).toMatchObject({ code: 'invalid_api_key', type: 'authentication_error' });
      expect(await t.recordOf(`auth-${i}`)).toMatchObject({ outcome: 'refused', reason: 'invalid_api_key' });
    }
    const a = await post(t.url, CHAT, chat(), { authorization: 'Bearer key-a', 'x-slagate-class': 'batch' });
    expect(a.status).toBe(200);
    expect(a.headers['x-slagate-class']).toBe('batch');
    // team-b may not pick interactive: its own class is kept.
    const b = await post(t.url, CHAT, chat(), {
      authorization: 'Bearer key-b',
      'x-slagate-class': 'interactive',
      'x-request-id': 'auth-b',
    });
    expect(b.status).toBe(200);
    expect(b.headers['x-slagate-class']).toBe('batch');
    expect(await t.recordOf('auth-b')).toMatchObject({ tenant: 'team-b', class: 'batch', outcome: 'ok' });
    // The key never reaches the log.
    const log = JSON.stringify(await t.records());
    expect(log).not.toContain('key-a');
    expect(log).not.toContain('key-b');
  });

  it('/pause, /tokenize, /v1/foo, /health and wrong methods → 404 from the gateway, never proxied', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const probes: [string, string][] = [
      ['POST', '/pause'],
      ['POST', '/abort_requests'],
      ['POST', '/tokenize'],
      ['POST', '/v1/foo'],
      ['GET', '/health'],
      ['GET', '/version'],
      ['POST', '/v1/chat/completions/../../tokenize'],
    ];
    for (const [method, path] of probes) {
      const res = await send(t.url, method, path, method === 'POST' ? {} : undefined);
      expect(res.status, `${method} ${path}`).toBe(404);
      expect(errorOf(res.text).code).toBe('route_not_found');
    }
    // A known path with another method: 405 with Allow, as vLLM answers.
    const wrong: [string, string, string][] = [
      ['GET', '/v1/chat/completions', 'POST'],
      ['DELETE', '/v1/completions?x=1', 'POST'],
      ['POST', '/v1/models', 'GET, HEAD'],
    ];
    for (const [method, path, allow] of wrong) {
      const res = await send(t.url, method, path, method === 'POST' ? {} : undefined);
      expect(res.status, `${method} ${path}`).toBe(405);
      expect(res.headers.allow).toBe(allow);
      expect(errorOf(res.text)).toMatchObject({ code: 'method_not_allowed', type: 'invalid_request_error' });
      expect(errorOf(res.text).message).toContain(allow.split(', ')[0]);
    }
    // Only the gateway's own probes reached the backend.
    expect(b.hits).toHaveLength(0);
    const recs = await t.records();
    const v1 = recs.filter((r) => r.reason === 'route_not_found');
    // Paths under /v1 are inference-shaped, so they get an admission record; the others do not.
    expect(v1.length).toBe(probes.filter(([, p]) => p.startsWith('/v1/')).length);
    expect(recs.filter((r) => r.reason === 'method_not_allowed')).toHaveLength(wrong.length);
  });

  it('a path whose percent-encoding is broken → 400 in the envelope, with the id, and the URL not echoed', async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    for (const [method, path] of [
      ['GET', '/v1/x%ZZ?api_key=SECRETQ'],
      ['POST', '/v1/chat%ZZcompletions'],
    ] as const) {
      const res = await send(t.url, method, path, method === 'POST' ? {} : undefined);
      expect(res.status, path).toBe(400);
      expect(errorOf(res.text)).toMatchObject({ code: 'invalid_request', type: 'invalid_request_error' });
      expect(res.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
      expect(res.text).not.toContain('SECRETQ');
    }
    expect(b.hits).toHaveLength(0);
  });
});

describe('what a client sends is bounded and kept out of the log', () => {
  it("a query string's credential never reaches the answer or the log; a huge model name is cut there", async () => {
    const b = await backend(healthyStream);
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }] });
    const lost = await send(t.url, 'GET', '/v1/embeddings?api_key=sk-query-secret');
    expect(lost.status).toBe(404);
    expect(errorOf(lost.text).message).toBe('Route GET /v1/embeddings not found.');
    expect(lost.text).not.toContain('sk-query-secret');

    const huge = 'm'.repeat(1_000_000);
    const res = await post(t.url, CHAT, { model: huge, messages: [{ role: 'user', content: 'hi' }] });
    expect(res.status).toBe(404);
    const message = errorOf(res.text).message;
    expect(errorOf(res.text).code).toBe('model_not_found');
    expect(message).toBe(`The model \`${'m'.repeat(256)}…\` does not exist.`);
    expect(b.hits).toHaveLength(0);

    const recs = await t.records();
    const notFound = recs.find((r) => r.reason === 'route_not_found')!;
    expect(notFound.error).toBe('Route GET /v1/embeddings not found.');
    const noModel = recs.find((r) => r.reason === 'model_not_found')!;
    expect(noModel.model).toBe(`${'m'.repeat(256)}…`);
    expect(JSON.stringify(recs)).not.toContain('sk-query-secret');
    expect(JSON.stringify(recs).length).toBeLessThan(10_000);
  });
});

describe('29: headers that must not pass', () => {
  it('client x-slagate-* headers do not steer; credentials and hop-by-hop headers do not reach upstream', async () => {
    const b0 = await backend(healthyStream);
    const b1 = await backend(healthyStream);
    const t = await gateway({
      backends: [
        { name: 'b0', url: b0.url },
        { name: 'b1', url: b1.url },
      ],
    });
    const served: string[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await rawPost(t.url, CHAT, JSON.stringify(chat({ stream: true })), {
        'x-slagate-backend': 'b1',
        'x-slagate-queue-ms': '999',
        'x-slagate-internal': 'steer-me',
        authorization: 'Bearer client-secret',
        cookie: 'session=client-cookie',
        'proxy-authorization': 'Basic cHJveHk=',
        connection: 'keep-alive, x-custom-hop',
        'x-custom-hop': 'hop-value',
        'keep-alive': 'timeout=99',
        te: 'trailers',
        'transfer-encoding': 'chunked',
        'x-forwarded-for': '6.6.6.6',
        'x-request-id': `hdr-${i}`,
      });
      expect(res.status).toBe(200);
      served.push(res.headers['x-slagate-backend'] as string);
      // The gateway's own measurement (nothing queued here), never the client's value.
      expect(Number(res.headers['x-slagate-queue-ms'])).toBeLessThan(50);
      expect(res.headers['x-upstream-secret']).toBeUndefined();
      expect(res.headers.server).toBeUndefined();
    }
    // Round robin over both backends, whatever the client asked for.
    expect(new Set(served)).toEqual(new Set(['b0', 'b1']));
    const hits = [...b0.hits, ...b1.hits];
    expect(hits).toHaveLength(4);
    const allowed = new Set([
      'host',
      'connection',
      'content-length',
      'content-type',
      'accept',
      'x-request-id',
    ]);
    for (const hit of hits) {
      expect(Object.keys(hit.headers).filter((h) => !allowed.has(h))).toEqual([]);
      expect(hit.headers.connection ?? 'keep-alive').toBe('keep-alive');
      expect(JSON.stringify(hit.rawHeaders)).not.toMatch(
        /client-secret|client-cookie|hop-value|6\.6\.6\.6|steer-me/,
      );
    }
    // The client's id leads the one each attempt sends (upstreamRequestId in src/upstream/relay.ts).
    expect(hits.map((h) => String(h.headers['x-request-id']).split('.')[0]).sort()).toEqual([
      'hdr-0',
      'hdr-1',
      'hdr-2',
      'hdr-3',
    ]);
  });
});

describe('30: upstream error bodies', () => {
  it("an upstream 500 body never reaches the client; of a 400 only the message does, in the gateway's envelope", async () => {
    const secret = 'Traceback: /opt/vllm/secret_path.py token=sk-live-SECRET';
    let status = 500;
    const b = await backend((_req, res) => {
      res.writeHead(status, { 'content-type': 'application/json', 'x-upstream-secret': 'hdr' });
      res.end(JSON.stringify({ error: { message: secret, type: 'InternalServerError', code: status } }));
    });
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }], config: { upstream: { retries: 0 } } });
    for (const stream of [false, true]) {
      status = 500;
      const res = await post(t.url, CHAT, chat({ stream }), { 'x-request-id': `secret-500-${stream}` });
      expect(res.status).toBe(502);
      expect(res.text).not.toContain('SECRET');
      expect(res.text).not.toContain('secret_path');
      expect(res.headers['x-upstream-secret']).toBeUndefined();
      expect(errorOf(res.text).code).toBe('upstream_error');
      status = 400;
      const rejected = await post(t.url, CHAT, chat({ stream }), { 'x-request-id': `secret-400-${stream}` });
      expect(rejected.status).toBe(400);
      // DESIGN section 4: the message tells the client what to fix; nothing else of the body passes.
      expect(JSON.parse(rejected.text)).toEqual({
        error: { message: secret, type: 'invalid_request_error', param: null, code: 'invalid_request' },
      });
      expect(rejected.headers['x-upstream-secret']).toBeUndefined();
    }
    // The record says why, without the upstream body's secret either.
    const recs = await t.records();
    expect(recs).toHaveLength(4);
    expect(JSON.stringify(recs.filter((r) => r.req_id.startsWith('secret-500')))).not.toContain('SECRET');
  });
});

describe('30: a long upstream error body', () => {
  it("a 400 whose body quotes a long request back keeps the backend's message and param", async () => {
    // vLLM's validation errors can quote the request back: a body far past a small error's size,
    // here written in 4 KiB pieces (each after the last is taken), so that it arrives in many reads.
    const body = Buffer.from(
      JSON.stringify({
        error: {
          message: `When using \`tool_choice\`, \`tools\` must be set. input: ${'x'.repeat(300_000)}`,
          type: 'BadRequestError',
          param: 'tool_choice',
          code: 400,
        },
      }),
    );
    const b = await backend((_req, res) => {
      res.writeHead(400, { 'content-type': 'application/json' });
      const next = (at: number): void => {
        if (at >= body.length) {
          res.end();
          return;
        }
        res.write(body.subarray(at, at + 4096), () => next(at + 4096));
      };
      next(0);
    });
    const t = await gateway({ backends: [{ name: 'b0', url: b.url }], config: { upstream: { retries: 0 } } });
    const res = await post(t.url, CHAT, chat({ tool_choice: 'auto' }), { 'x-request-id': 'long-400' });
    expect(res.status).toBe(400);
    const error = errorOf(res.text) as ReturnType<typeof errorOf> & { param: string | null };
    expect(error.message.startsWith('When using `tool_choice`, `tools` must be set.')).toBe(true);
    expect(error.message.length).toBeLessThanOrEqual(500);
    expect(error.param).toBe('tool_choice');
  });
});

/** A POST with exactly the given headers (node:http would refuse some of them on its own agent). */
function rawPost(
  base: string,
  path: string,
  body: string,
  headers: http.OutgoingHttpHeaders,
): Promise<{ status: number; headers: http.IncomingHttpHeaders; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      `${base}${path}`,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } },
      (res) => collect(res).then(resolve, reject),
    );
    req.on('error', reject);
    // Chunked, as the transfer-encoding header says.
    req.write(body.slice(0, 10));
    req.end(body.slice(10));
  });
}
