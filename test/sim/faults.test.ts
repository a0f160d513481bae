import { createServer as createNetServer } from 'node:net';
import { Pool } from 'undici';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { parseFaultHeader, parseFaultJson } from '../../src/sim/faults.ts';
import { type Fleet, startFleet } from '../../src/sim/fleet.ts';
import { getProfile } from '../../src/sim/profiles.ts';
import { SimReplica } from '../../src/sim/replica.ts';
import { connectResult, openStream, post, send, sseData, waitFor } from './http-helpers.ts';

const PROFILE = getProfile('llama3-8b-h100');
const MODEL = PROFILE.model;
const CHAT = '/v1/chat/completions';
const MESSAGES = [{ role: 'user', content: 'Tell me a long story about a lighthouse keeper.' }];
const LONG = { model: MODEL, messages: MESSAGES, max_tokens: 20000, ignore_eos: true, stream: true };

let replica: SimReplica;
let base: string;

beforeAll(async () => {
  replica = await SimReplica.start({ profile: PROFILE, timeScale: 0.05 });
  base = replica.url;
});
afterAll(() => replica.close());

const events = (text: string) => text.split('\n\n').filter((e) => e !== '');

describe('fault specs', () => {
  it('parses the header and JSON forms', () => {
    expect(parseFaultHeader('drop;after_tokens=3')).toEqual({ mode: 'drop', afterTokens: 3 });
    expect(parseFaultHeader('error; status=503')).toEqual({ mode: 'error', status: 503 });
    expect(parseFaultJson({ mode: 'crash', duration_ms: 250 })).toEqual({ mode: 'crash', durationMs: 250 });
    expect(parseFaultJson({ mode: 'slow', factor: 3 })).toEqual({ mode: 'slow', factor: 3 });
  });

  it('rejects unknown modes, unknown keys and bad values', () => {
    expect(() => parseFaultHeader('explode')).toThrow(/fault mode/);
    expect(() => parseFaultHeader('drop;after_tokens')).toThrow(/key=value/);
    expect(() => parseFaultJson({ mode: 'drop', colour: 1 })).toThrow(/unknown fault parameter/);
    expect(() => parseFaultJson({ mode: 'error', status: 200 })).toThrow(/status/);
    expect(() => parseFaultJson({ mode: 'slow', factor: 0.5 })).toThrow(/factor/);
  });

  it('answers a bad fault header with 400', async () => {
    const r = await post(base, CHAT, { model: MODEL, messages: MESSAGES }, { 'x-sim-fault': 'explode' });
    expect(r.status).toBe(400);
    expect(JSON.parse(r.text).error.code).toBe(400);
  });
});

describe('crash', () => {
  it('kills open streams, drops engine work and cache, refuses connections until reset', async () => {
    const warm = { model: MODEL, messages: MESSAGES, max_tokens: 2 };
    await post(base, CHAT, warm);
    const probe = { messages: MESSAGES };
    expect(JSON.parse((await post(base, '/sim/cached-tokens', probe)).text).cached_tokens).toBeGreaterThan(0);
    const s = await openStream(base, CHAT, LONG);
    await s.until((t) => events(t).length >= 3);
    const r = await post(base, '/sim/fault', { mode: 'crash' });
    expect(r.status).toBe(200);
    expect((await s.ended).complete).toBe(false);
    expect(s.received()).not.toContain('[DONE]');
    expect(await connectResult(base)).toBe('ECONNREFUSED');
    expect(replica.engine.stats().running).toBe(0);
    expect(replica.stats().listening).toBe(false);
    await replica.reset();
    expect(await connectResult(base)).toBe('ok');
    expect(JSON.parse((await post(base, '/sim/cached-tokens', probe)).text).cached_tokens).toBe(0);
    // A new process: its counters start from 0 (a scraper sees them go down).
    const metrics = (await send(base, 'GET', '/metrics')).text;
    expect(metrics).toMatch(/^vllm:prompt_tokens_total\{[^}]*\} 0(\.0)?$/m);
    expect(metrics).toMatch(/^vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\} 0(\.0)?$/m);
    // The stream the crash killed is not counted as an abort by the process that came back.
    expect(metrics).toMatch(/^vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} 0(\.0)?$/m);
  });

  it('comes back by itself after duration_ms', async () => {
    await replica.fault({ mode: 'crash', durationMs: 200 });
    expect(await connectResult(base)).toBe('ECONNREFUSED');
    const t0 = Date.now();
    for (;;) {
      if ((await connectResult(base)) === 'ok') break;
      expect(Date.now() - t0).toBeLessThan(3000);
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(Date.now() - t0).toBeGreaterThanOrEqual(150);
  });

  it('tries its port again each second when it is taken as the fault ends, and the process goes on', async () => {
    const own = await SimReplica.start({ profile: PROFILE, timeScale: 0.05 });
    const port = Number(new URL(own.url).port);
    const told = new Promise<string>((resolve) => {
      const write = process.stderr.write.bind(process.stderr) as (chunk: string | Uint8Array) => boolean;
      const spy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
        const text = String(chunk);
        if (!text.includes('cannot listen again')) return write(chunk);
        spy.mockRestore();
        resolve(text);
        return true;
      });
    });
    const blocker = createNetServer();
    try {
      await own.fault({ mode: 'crash', durationMs: 500 });
      await new Promise<void>((resolve) => blocker.listen(port, '127.0.0.1', resolve));
      expect(await told).toContain('EADDRINUSE');
      expect(own.stats().listening).toBe(false);
      await new Promise<void>((resolve) => blocker.close(() => resolve()));
      await waitFor(() => own.stats().listening, 5000, 'listening again');
      expect((await post(own.url, CHAT, { model: MODEL, messages: MESSAGES, max_tokens: 2 })).status).toBe(
        200,
      );
    } finally {
      if (blocker.listening) blocker.close();
      await own.close();
    }
  });

  it('crashes from a request header, killing that request too', async () => {
    await expect(
      post(base, CHAT, { model: MODEL, messages: MESSAGES }, { 'x-sim-fault': 'crash;duration_ms=5000' }),
    ).rejects.toMatchObject({ code: 'ECONNRESET' });
    expect(await connectResult(base)).toBe('ECONNREFUSED');
    await replica.reset();
    expect(await connectResult(base)).toBe('ok');
  });
});

describe('refuse', () => {
  it('refuses new connections while an open stream finishes normally', async () => {
    const s = await openStream(base, CHAT, { ...LONG, max_tokens: 40 });
    await s.until((t) => events(t).length >= 2);
    await replica.fault({ mode: 'refuse', durationMs: 400 });
    expect(await connectResult(base)).toBe('ECONNREFUSED');
    expect((await s.ended).complete).toBe(true);
    expect(sseData(s.received()).at(-1)).toBe('[DONE]');
    await waitFor(() => replica.stats().listening, 3000, 'listening again');
    expect(await connectResult(base)).toBe('ok');
  });
});

describe('refuse, on a connection opened before it', () => {
  it('serves nothing more on it: the response under way ends its connection, and a request on it is dropped', async () => {
    // One pooled connection, busy with a stream when the fault comes, as a gateway's pool holds them.
    const pool = new Pool(base, { connections: 1, pipelining: 1 });
    try {
      const first = await pool.request({
        path: CHAT,
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...LONG, max_tokens: 20 }),
      });
      await replica.fault({ mode: 'refuse', durationMs: 5_000 });
      expect(first.statusCode).toBe(200);
      expect(sseData(await first.body.text()).at(-1)).toBe('[DONE]');
      // The pool would reuse that connection: the replica closed it, and a new one is refused.
      await expect(pool.request({ path: '/health', method: 'GET' })).rejects.toMatchObject({
        code: expect.stringMatching(/ECONNREFUSED|UND_ERR_SOCKET|ECONNRESET/),
      });
    } finally {
      await pool.close();
      await replica.reset();
    }
  });
});

describe('hang', () => {
  it('sends headers and then nothing, and never reaches the engine', async () => {
    const s = await openStream(base, CHAT, LONG, { 'x-sim-fault': 'hang' });
    expect(s.status).toBe(200);
    expect(s.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    await new Promise((r) => setTimeout(r, 300));
    expect(s.received()).toBe('');
    expect(replica.engine.stats()).toMatchObject({ running: 0, waiting: 0 });
    s.close();
  });
});

describe('error', () => {
  it('answers with the given status and a vLLM error body', async () => {
    const r = await post(
      base,
      CHAT,
      { model: MODEL, messages: MESSAGES },
      { 'x-sim-fault': 'error;status=503' },
    );
    expect(r.status).toBe(503);
    expect(JSON.parse(r.text)).toEqual({
      error: {
        message: 'Simulated fault: error 503',
        type: 'ServiceUnavailableError',
        param: null,
        code: 503,
      },
    });
  });

  it('applies to every request while set for the replica, until DELETE /sim/fault', async () => {
    await post(base, '/sim/fault', { mode: 'error' });
    const chat = await post(base, CHAT, { model: MODEL, messages: MESSAGES, max_tokens: 2 });
    const completion = await post(base, '/v1/completions', { model: MODEL, prompt: 'x', max_tokens: 2 });
    expect([chat.status, completion.status]).toEqual([500, 500]);
    expect(JSON.parse(chat.text).error.type).toBe('InternalServerError');
    expect((await send(base, 'DELETE', '/sim/fault')).status).toBe(200);
    expect((await post(base, CHAT, { model: MODEL, messages: MESSAGES, max_tokens: 2 })).status).toBe(200);
  });

  it('is overridden by a reset or refuse header for the request that carries it', async () => {
    await post(base, '/sim/fault', { mode: 'error' });
    const req = { model: MODEL, messages: MESSAGES, max_tokens: 2 };
    // reset clears the replica's fault, and the carrying request is served.
    expect((await post(base, CHAT, req, { 'x-sim-fault': 'reset' })).status).toBe(200);
    expect((await post(base, CHAT, req)).status).toBe(200);
    await post(base, '/sim/fault', { mode: 'error' });
    // refuse replaces it (the port closes); the carrying request is served.
    expect((await post(base, CHAT, req, { 'x-sim-fault': 'refuse;duration_ms=50' })).status).toBe(200);
    // Listening again once its 50 ms are over.
    while ((await connectResult(base)) !== 'ok') await new Promise((r) => setTimeout(r, 10));
    expect((await post(base, CHAT, req)).status).toBe(200);
  });

  it('is overridden by a slow header for the request that carries it, as by the other header modes', async () => {
    await post(base, '/sim/fault', { mode: 'error', status: 503 });
    const req = { model: MODEL, messages: MESSAGES, max_tokens: 2 };
    try {
      expect((await post(base, CHAT, req, { 'x-sim-fault': 'slow;factor=2' })).status).toBe(200);
      // The replica's own fault stands for the requests that carry none.
      expect((await post(base, CHAT, req)).status).toBe(503);
    } finally {
      await send(base, 'DELETE', '/sim/fault');
    }
  });
});

describe('/sim/stats', () => {
  it("counts as client aborts only the requests whose client left, not an injected fault's", async () => {
    const stats = async () =>
      JSON.parse((await send(base, 'GET', '/sim/stats')).text) as { client_aborts: number };
    const before = (await stats()).client_aborts;
    const dropped = await openStream(base, CHAT, LONG, { 'x-sim-fault': 'drop;after_tokens=3' });
    await dropped.ended;
    expect((await post(base, CHAT, LONG, { 'x-sim-fault': 'inband_error;after_tokens=2' })).status).toBe(200);
    await waitFor(() => replica.engine.stats().running === 0, 2000, 'engine idle');
    expect((await stats()).client_aborts).toBe(before);
    // A client that leaves mid-stream is counted.
    const left = await openStream(base, CHAT, LONG);
    await left.until((text) => events(text).length >= 3);
    left.close();
    await waitFor(() => replica.engine.stats().running === 0, 2000, 'engine idle');
    expect((await stats()).client_aborts).toBe(before + 1);
  });
});

describe('drop', () => {
  it('destroys the socket after k tokens, without [DONE], and frees the engine', async () => {
    const s = await openStream(base, CHAT, LONG, { 'x-sim-fault': 'drop;after_tokens=3' });
    expect((await s.ended).complete).toBe(false);
    const got = events(s.received());
    expect(got).toHaveLength(4); // role chunk + 3 tokens
    expect(got.join()).not.toContain('[DONE]');
    await waitFor(() => replica.engine.stats().running === 0, 2000, 'engine idle');
  });

  it('drops a non-streamed request before any byte', async () => {
    await expect(
      post(
        base,
        CHAT,
        { model: MODEL, messages: MESSAGES, max_tokens: 50 },
        { 'x-sim-fault': 'drop;after_tokens=5' },
      ),
    ).rejects.toMatchObject({ code: 'ECONNRESET' });
  });
});

describe('inband_error', () => {
  it('sends k tokens, then an error event and [DONE]', async () => {
    const r = await post(base, CHAT, LONG, { 'x-sim-fault': 'inband_error;after_tokens=2' });
    expect(r.status).toBe(200);
    const data = sseData(r.text);
    expect(data).toHaveLength(5); // role, 2 tokens, error, [DONE]
    expect(JSON.parse(data[3] as string)).toEqual({
      error: {
        message: 'Simulated fault: in-band error',
        type: 'InternalServerError',
        param: null,
        code: 500,
      },
    });
    expect(data[4]).toBe('[DONE]');
    await waitFor(() => replica.engine.stats().running === 0, 2000, 'engine idle');
  });
});

describe('slow', () => {
  let slowReplica: SimReplica;
  beforeAll(async () => {
    slowReplica = await SimReplica.start({ profile: PROFILE, timeScale: 0.5 });
  });
  afterAll(() => slowReplica.close());

  const timed = async (headers: Record<string, string> = {}) => {
    const t0 = performance.now();
    const r = await post(
      slowReplica.url,
      CHAT,
      { model: MODEL, messages: MESSAGES, max_tokens: 40, ignore_eos: true },
      headers,
    );
    expect(r.status).toBe(200);
    return performance.now() - t0;
  };

  it('slows one request by its factor', async () => {
    const normal = await timed();
    const slow = await timed({ 'x-sim-fault': 'slow;factor=4' });
    expect(slow / normal).toBeGreaterThan(2);
  });

  it('slows the whole replica until reset', async () => {
    const normal = await timed();
    await slowReplica.fault({ mode: 'slow', factor: 4 });
    const slow = await timed();
    await slowReplica.reset();
    const after = await timed();
    expect(slow / normal).toBeGreaterThan(2);
    expect(slow / after).toBeGreaterThan(2);
  });
});

describe('fleet admin server', () => {
  let fleet: Fleet;
  beforeAll(async () => {
    fleet = await startFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 0.05, adminPort: 0 });
  });
  afterAll(() => fleet.close());

  it('lists replicas and sets and clears faults by index', async () => {
    const admin = fleet.adminUrl as string;
    const list = JSON.parse((await send(admin, 'GET', '/replicas')).text);
    expect(list.replicas.map((r: { url: string }) => r.url)).toEqual(fleet.urls);
    const set = await post(admin, '/replicas/1/fault', { mode: 'refuse' });
    expect(set.status).toBe(200);
    expect(JSON.parse(set.text).fault).toEqual({ mode: 'refuse' });
    expect(await connectResult(fleet.urls[1] as string)).toBe('ECONNREFUSED');
    expect(await connectResult(fleet.urls[0] as string)).toBe('ok');
    expect((await send(admin, 'DELETE', '/replicas/1/fault')).status).toBe(200);
    expect(await connectResult(fleet.urls[1] as string)).toBe('ok');
    await post(admin, '/replicas/0/fault', { mode: 'crash' });
    expect(await connectResult(fleet.urls[0] as string)).toBe('ECONNREFUSED');
    const listed = JSON.parse((await send(admin, 'GET', '/replicas')).text).replicas[0];
    expect(listed).toMatchObject({ listening: false, fault: { mode: 'crash' } });
    expect((await post(admin, '/replicas/0/fault', { mode: 'reset' })).status).toBe(200);
    expect(await connectResult(fleet.urls[0] as string)).toBe('ok');
    expect((await post(admin, '/replicas/7/fault', { mode: 'crash' })).status).toBe(404);
    expect((await post(admin, '/replicas/0/fault', { mode: 'nope' })).status).toBe(400);
  });
});
