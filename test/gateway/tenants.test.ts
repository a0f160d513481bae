// Tenants: keys (item 28), limits (item 31) in one gateway and across two sharing one Redis, the
// class a key may ask for, and fairness by work between tenants of one class under a burst.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isolatedSalt } from '../../src/server/cache-salt.ts';
import { type Fleet, startFleet } from '../../src/sim/fleet.ts';
import { rawConnection as openRaw } from '../helpers/http.ts';
import { type RedisServer, startRedisServer } from '../helpers/redis-server.ts';
import { stageReached } from '../helpers/stages.ts';
import { deadUrl } from '../upstream/helpers.ts';
import {
  baseConfig,
  breakPolicy,
  cacheHits,
  chat,
  chatStreamText,
  get,
  MODEL,
  merge,
  openStream,
  post,
  readRecords,
  type Script,
  scripted,
  serveChild,
  startTestGateway,
  type TestGateway,
  toConfig,
  waitFor,
} from './harness.ts';

const CHAT = '/v1/chat/completions';
const sha = (k: string) => createHash('sha256').update(k).digest('hex');
const bearer = (k: string) => ({ authorization: `Bearer ${k}` });

let t: TestGateway | null = null;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  await t?.close();
  t = null;
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Streams that send their first token at once and end when released. */
async function gated() {
  const pending: (() => void)[] = [];
  const f = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
  const head = { id: 'c', object: 'chat.completion.chunk', created: 1, model: MODEL };
  const script: Script = (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(
      f({ ...head, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] }),
    );
    pending.push(() =>
      res.end(
        `${f({ ...head, choices: [{ index: 0, delta: { content: 'x' }, finish_reason: 'stop' }] })}data: [DONE]\n\n`,
      ),
    );
  };
  const backend = await scripted(script);
  cleanups.push(backend.close);
  return {
    backend,
    releaseAll: () => {
      for (const r of pending.splice(0)) r();
    },
  };
}

const TENANTS = [
  { name: 'team-a', api_key_sha256: sha('key-a'), class: 'interactive', max_concurrency: 2 },
  {
    name: 'team-b',
    api_key_sha256: sha('key-b'),
    class: 'interactive',
    allowed_classes: ['interactive', 'batch'],
  },
];

describe('keys and classes (item 28)', () => {
  it('a bad key is 401; a key names its tenant; x-slagate-class only within the tenant’s allowed classes', async () => {
    t = await startTestGateway({ replicas: 1, config: { tenants: TENANTS } });
    const bad = await post(t.url, CHAT, chat(), { ...bearer('key-x'), 'x-request-id': 'bad-key' });
    expect(bad.status).toBe(401);
    expect(JSON.parse(bad.text)).toMatchObject({ error: { code: 'invalid_api_key' } });
    expect((await post(t.url, CHAT, chat())).status).toBe(401);
    // team-a may only use interactive: its request for batch runs as interactive.
    const a = await post(t.url, CHAT, chat(), {
      ...bearer('key-a'),
      'x-slagate-class': 'batch',
      'x-request-id': 'a-batch',
    });
    expect(a.status).toBe(200);
    expect(a.headers['x-slagate-class']).toBe('interactive');
    expect(await t.recordOf('a-batch')).toMatchObject({ tenant: 'team-a', class: 'interactive' });
    const b = await post(t.url, CHAT, chat(), {
      ...bearer('key-b'),
      'x-slagate-class': 'batch',
      'x-request-id': 'b-batch',
    });
    expect(b.headers['x-slagate-class']).toBe('batch');
    expect(await t.recordOf('b-batch')).toMatchObject({ tenant: 'team-b', class: 'batch' });
    expect(await t.recordOf('bad-key')).toMatchObject({
      outcome: 'refused',
      reason: 'invalid_api_key',
      tenant: null,
    });
    // A body refused (malformed; more objects and arrays than any request holds) is counted to the
    // tenant and class its head settled.
    const many = `{"messages":[${Array.from({ length: 20_000 }, () => '{}').join(',')}]}`;
    for (const [rid, body] of [
      ['b-malformed', '{"messages":'],
      ['b-many', many],
    ]) {
      const r = await post(t.url, CHAT, body, {
        ...bearer('key-b'),
        'x-slagate-class': 'batch',
        'x-request-id': rid,
      });
      expect(r.status).toBe(400);
      expect(JSON.parse(r.text)).toMatchObject({ error: { code: 'invalid_request', param: 'body' } });
      expect(await t.recordOf(rid!)).toMatchObject({
        outcome: 'refused',
        reason: 'invalid_request',
        tenant: 'team-b',
        class: 'batch',
        ttft_target_ms: expect.any(Number),
      });
    }
  });
});

describe('a request without a valid key', () => {
  /** A raw connection and a wait for `n` whole answers (head and a content-length body). */
  async function rawConnection(url: string) {
    const conn = await openRaw(url);
    const answers = (n: number) =>
      conn.until((text) => splitAnswers(text).length >= n).then((text) => splitAnswers(text));
    return { socket: conn.socket, answers };
  }
  function splitAnswers(text: string): string[] {
    const out: string[] = [];
    let rest = text;
    for (;;) {
      const headEnd = rest.indexOf('\r\n\r\n');
      if (headEnd < 0) return out;
      const length = Number(/content-length: (\d+)/i.exec(rest.slice(0, headEnd))?.[1] ?? 0);
      if (rest.length < headEnd + 4 + length) return out;
      out.push(rest.slice(0, headEnd + 4 + length));
      rest = rest.slice(headEnd + 4 + length);
    }
  }
  const head = (extra: string) =>
    'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n' +
    `authorization: Bearer key-x\r\n${extra}\r\n`;

  it('is answered 401 from its head, its body neither waited for nor parsed; the connection stays for the next request', async () => {
    t = await startTestGateway({ replicas: 1, config: { tenants: TENANTS } });
    const { socket, answers } = await rawConnection(t.url);
    // 1,000 bytes announced, ten sent (and not JSON): reading it first would wait for the request
    // deadline and answer 504, or 400 for the JSON.
    const body = `{not json!${' '.repeat(990)}`;
    socket.write(`${head('content-length: 1000\r\nx-request-id: no-key\r\n')}${body.slice(0, 10)}`);
    const [first] = await answers(1);
    expect(first).toMatch(/^HTTP\/1\.1 401 /);
    expect(first!.toLowerCase()).not.toContain('connection: close');
    expect(JSON.parse(first!.slice(first!.indexOf('\r\n\r\n') + 4))).toMatchObject({
      error: { code: 'invalid_api_key' },
    });
    // The rest of the body is read and dropped; the next request on the connection is answered.
    socket.write(body.slice(10));
    socket.write(`${head('content-length: 2\r\nx-request-id: no-key-2\r\n')}{}`);
    const [, second] = await answers(2);
    expect(second).toMatch(/^HTTP\/1\.1 401 /);
    socket.destroy();
    expect(await t.recordOf('no-key')).toMatchObject({ outcome: 'refused', reason: 'invalid_api_key' });
    expect(await t.recordOf('no-key-2')).toMatchObject({ outcome: 'refused', reason: 'invalid_api_key' });
  });

  it('many 401s on one kept connection leave nothing behind on it (no listener per refusal)', async () => {
    t = await startTestGateway({ replicas: 1, config: { tenants: TENANTS } });
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on('warning', onWarning);
    try {
      const { socket, answers } = await rawConnection(t.url);
      for (let i = 1; i <= 15; i++) {
        socket.write(`${head(`content-length: 2\r\nx-request-id: many-${i}\r\n`)}{}`);
        const got = await answers(i);
        expect(got[i - 1]).toMatch(/^HTTP\/1\.1 401 /);
      }
      socket.destroy();
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off('warning', onWarning);
    }
    expect(warnings).not.toContain('MaxListenersExceededWarning');
  });

  it('a reload while its body comes judges it by the new keys and classes', async () => {
    t = await startTestGateway({ replicas: 1, config: { tenants: TENANTS } });
    const { socket, answers } = await rawConnection(t.url);
    const body = JSON.stringify(chat());
    const received = stageReached('mid-reload', 'received');
    // team-b asks for batch, which its key allows; the upload stops half-way.
    socket.write(
      'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n' +
        'authorization: Bearer key-b\r\nx-slagate-class: batch\r\nx-request-id: mid-reload\r\n' +
        `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body.slice(0, 10)}`,
    );
    await received;
    // The reload removes team-b and the batch class.
    await t.gw.reload(
      toConfig(
        merge(baseConfig([{ name: 'r0', url: t.fleet!.urls[0]! }], join(t.dir, 'admission.log')), {
          tenants: [TENANTS[0]!],
          sla: {
            default_class: 'interactive',
            classes: { interactive: { ttft_p99_ms: 500, tpot_p99_ms: 50, priority: 0 } },
          },
        }),
      ),
    );
    socket.write(body.slice(10));
    const [answer] = await answers(1);
    expect(answer).toMatch(/^HTTP\/1\.1 401 /);
    socket.destroy();
    // Refused for its key: no tenant, no class, no targets, as for any bad key (not team-b's batch).
    expect(await t.recordOf('mid-reload')).toMatchObject({
      outcome: 'refused',
      reason: 'invalid_api_key',
      tenant: null,
      class: null,
      ttft_target_ms: null,
      tpot_target_ms: null,
    });
    // …and so in the metrics: the class the reload removed has no series again.
    const metrics = (await get(t.url, '/metrics')).text;
    expect(metrics).not.toMatch(/slagate_admission_total\{[^}]*class="batch"/);
    expect(metrics).toMatch(/slagate_admission_total\{[^}]*class="none"[^}]*reason="invalid_api_key"/);
  });

  it('after a 401, a body of declared length that stops coming is cut at the request deadline', async () => {
    t = await startTestGateway({
      replicas: 1,
      config: { tenants: TENANTS, upstream: { first_token_timeout_ms: 300 } },
    });
    const { socket, answers } = await rawConnection(t.url);
    const sentAt = performance.now();
    socket.write(`${head('content-length: 1000\r\nx-request-id: stalled\r\n')}{"model":`);
    const [answer] = await answers(1);
    expect(answer).toMatch(/^HTTP\/1\.1 401 /);
    // The rest never comes: the connection is not held past the deadline.
    await once(socket, 'close');
    expect(performance.now() - sentAt).toBeGreaterThanOrEqual(250);
  });

  it('a body of no declared length ends the connection after the 401', async () => {
    t = await startTestGateway({ replicas: 1, config: { tenants: TENANTS } });
    const { socket, answers } = await rawConnection(t.url);
    socket.write(`${head('transfer-encoding: chunked\r\nx-request-id: no-key-chunked\r\n')}5\r\n{not \r\n`);
    const [answer] = await answers(1);
    expect(answer).toMatch(/^HTTP\/1\.1 401 /);
    expect(answer!.toLowerCase()).toContain('connection: close');
    await once(socket, 'close');
  });
});

describe('listing the models', () => {
  it('with tenants takes a tenant key (the openai client: a bad or missing key is 401, a good one lists)', async () => {
    t = await startTestGateway({ replicas: 1, config: { tenants: TENANTS } });
    const client = (apiKey: string) => new OpenAI({ baseURL: `${t!.url}/v1`, apiKey, maxRetries: 0 });
    const refused = await client('key-x')
      .models.list()
      .then(
        () => null,
        (err: unknown) => err,
      );
    expect(refused).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((refused as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe('invalid_api_key');
    const bare = await fetch(`${t.url}/v1/models`);
    expect(bare.status).toBe(401);
    expect(bare.headers.get('x-request-id')).toBeTruthy();
    const listed = await client('key-a').models.list();
    expect(listed.data.map((m) => m.id)).toEqual([MODEL]);
  });
});

describe('an open gateway (no tenants configured)', () => {
  it('serves any request, and its record names no tenant', async () => {
    t = await startTestGateway({ replicas: 1 });
    const res = await post(t.url, CHAT, chat(), { 'x-request-id': 'open-1' });
    expect(res.status).toBe(200);
    expect(await t.recordOf('open-1')).toMatchObject({ outcome: 'ok', tenant: null, class: 'interactive' });
    // Listing the models takes no key here.
    expect((await fetch(`${t.url}/v1/models`)).status).toBe(200);
  });
});

describe('prefix-cache isolation (isolate_prefix_cache)', () => {
  it("an isolated tenant's prompts share no cached block with another tenant's, on the replica itself", async () => {
    const tenant = (name: string, isolate: boolean) => ({
      name,
      api_key_sha256: sha(`key-${name}`),
      class: 'interactive',
      isolate_prefix_cache: isolate,
    });
    const tenants = [tenant('a', true), tenant('b', true), tenant('c', false), tenant('d', false)];
    t = await startTestGateway({ replicas: 1, timeScale: 0.05, config: { tenants } });
    const replica = t.fleet!.urls;
    const system = `Internal playbook. ${'Step: escalate to the on-call lead. '.repeat(60)}`;
    // The tokens this prompt found cached on the replica (its prefix-cache hit counter's step).
    const cached = async (name: string, salt?: string): Promise<number> => {
      const before = (await cacheHits(replica))[0]!;
      const client = new OpenAI({ baseURL: `${t!.url}/v1`, apiKey: `key-${name}`, maxRetries: 0 });
      const body = {
        model: MODEL,
        max_tokens: 1,
        messages: [
          { role: 'system' as const, content: system },
          { role: 'user' as const, content: 'What comes first?' },
        ],
        ...(salt === undefined ? {} : { cache_salt: salt }),
      };
      const done = await client.chat.completions.create(body);
      expect(done.choices.length).toBe(1);
      return (await cacheHits(replica))[0]! - before;
    };
    expect(await cached('a')).toBe(0);
    // Its own tenant hits it...
    expect(await cached('a')).toBeGreaterThan(500);
    // ...another isolated tenant does not, nor does a tenant that shares (no salt)...
    expect(await cached('b')).toBe(0);
    expect(await cached('c')).toBe(0);
    // ...and tenants that share do share with each other.
    expect(await cached('d')).toBeGreaterThan(500);
    // A client's own salt partitions its tenant's cache further, as it would vLLM's.
    expect(await cached('a', 'project-x')).toBe(0);
    expect(await cached('a', 'project-x')).toBeGreaterThan(500);
    // The same client salt under another isolated tenant is still that tenant's own.
    expect(await cached('b', 'project-x')).toBe(0);
    // A client of a shared tenant that names an isolated tenant's very salt (anyone who reads the
    // configuration can compute it) is not let into its blocks: shared tenants' salts go under
    // `shared:`, which no isolated tenant's salt begins with.
    const aSalt = isolatedSalt('a', sha('key-a')).prefix;
    expect(await cached('c', aSalt)).toBe(0);
    expect(await cached('c', `${aSalt}:project-x`)).toBe(0);
    // And the salted shared tenant keeps its own partition, shared with its peers under the same salt.
    expect(await cached('d', aSalt)).toBeGreaterThan(500);
  });
  it('a reload that isolates a tenant starts its chains afresh: no hit is counted under the new salt', async () => {
    const tenants = (isolate: boolean) => [
      { name: 'a', api_key_sha256: sha('key-a'), class: 'interactive', isolate_prefix_cache: isolate },
    ];
    t = await startTestGateway({ replicas: 1, timeScale: 0.05, config: { tenants: tenants(false) } });
    const body = chat({
      messages: [{ role: 'system', content: `Playbook. ${'Step: page the lead. '.repeat(80)}` }],
    });
    const send = async () => {
      const before = (await cacheHits(t!.fleet!.urls))[0]!;
      const res = await post(t!.url, CHAT, body, bearer('key-a'));
      expect(res.status, res.text).toBe(200);
      return {
        told: Number(res.headers['x-slagate-prefix-hit']),
        replica: (await cacheHits(t!.fleet!.urls))[0]! - before,
      };
    };
    await send();
    const warm = await send();
    expect(warm.told).toBeGreaterThan(0.8);
    expect(warm.replica).toBeGreaterThan(400);
    const backends = t.fleet!.urls.map((url, i) => ({ name: `r${i}`, url }));
    await t.gw.reload(
      toConfig(merge(baseConfig(backends, join(t.dir, 'admission.log')), { tenants: tenants(true) })),
    );
    // Under its new salt the replica holds nothing of it, and the router says so.
    const fresh = await send();
    expect(fresh.replica).toBe(0);
    expect(fresh.told).toBe(0);
    const again = await send();
    expect(again.told).toBeGreaterThan(0.8);
    expect(again.replica).toBeGreaterThan(400);
  });
});

describe('tenant limits (item 31)', () => {
  it('tenant A over max_concurrency gets 429 rate_limited with Retry-After; tenant B is unaffected', async () => {
    const g = await gated();
    t = await startTestGateway({
      backends: [{ name: 'g0', url: g.backend.url }],
      config: { tenants: TENANTS },
    });
    const held = [
      await openStream(t.url, CHAT, chat({ stream: true }), bearer('key-a')).response,
      await openStream(t.url, CHAT, chat({ stream: true }), bearer('key-a')).response,
    ];
    for (const s of held) await s.until((x) => x.includes('"role"'));
    const over = await post(t.url, CHAT, chat({ stream: true }), {
      ...bearer('key-a'),
      'x-request-id': 'a-over',
    });
    expect(over.status).toBe(429);
    expect(Number(over.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(JSON.parse(over.text)).toMatchObject({
      error: { code: 'rate_limited', type: 'rate_limit_error' },
    });
    // B, same class, same backend: served at once.
    const other = openStream(t.url, CHAT, chat({ stream: true }), bearer('key-b'));
    const b = await other.response;
    await b.until((x) => x.includes('"role"'));
    expect(b.status).toBe(200);
    expect(await t.recordOf('a-over')).toMatchObject({
      outcome: 'refused',
      reason: 'rate_limited',
      tenant: 'team-a',
    });
    // A's streams end: A may send again.
    g.releaseAll();
    for (const s of [...held, b]) await s.ended;
    const again = post(t.url, CHAT, chat({ stream: true }), bearer('key-a'));
    await waitFor(() => g.backend.hits.length === 4, 2000, "A's next request dispatched");
    g.releaseAll();
    expect((await again).status).toBe(200);
  });

  it('tokens_per_minute: prompt + max_tokens counted at admission; over it, 429 with the wait in Retry-After', async () => {
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 600 },
    ];
    t = await startTestGateway({ replicas: 1, config: { tenants } });
    expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(200);
    expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(200);
    const over = await post(t.url, CHAT, chat({ max_tokens: 250 }), {
      ...bearer('key-t'),
      'x-request-id': 'tpm-over',
    });
    expect(over.status).toBe(429);
    // The first tokens leave the minute window in about 60 s.
    expect(Number(over.headers['retry-after'])).toBeGreaterThan(50);
    expect(Number(over.headers['retry-after'])).toBeLessThanOrEqual(60);
    expect(JSON.parse(over.text).error.message).toMatch(/tokens per minute/);
  });

  it('tokens_per_minute: a request that alone counts more than the budget gets 400 (waiting cannot cure it) and charges nothing', async () => {
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 600 },
    ];
    t = await startTestGateway({ replicas: 1, config: { tenants } });
    const big = await post(t.url, CHAT, chat({ max_tokens: 5000 }), bearer('key-t'));
    expect(big.status).toBe(400);
    expect(big.headers['retry-after']).toBeUndefined();
    const err = JSON.parse(big.text).error;
    expect(err.code).toBe('invalid_request');
    expect(err.type).toBe('invalid_request_error');
    expect(err.message).toMatch(/may use 600 per minute/);
    // Nothing was charged: two requests of ~260 tokens still fit in the 600.
    expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(200);
    expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(200);
  });

  it('tokens_per_minute: a request a gateway bug failed before any backend answered it gives its tokens back', async () => {
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 600 },
    ];
    t = await startTestGateway({ replicas: 1, config: { tenants, logging: { level: 'fatal' } } });
    const restore = breakPolicy(t.gw);
    const failed = await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'));
    expect(failed.status).toBe(500);
    expect(t.gw.runtime.live.tenantUsage('tpm')).toMatchObject({ inflight: 0, tokens: 0 });
    restore();
    // Two requests of ~260 tokens still fit in the 600.
    expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(200);
    expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(200);
  });

  it('tokens_per_minute: a request the backends refuse before any work (a 400, a 429) gives its tokens back', async () => {
    // vLLM's API server refuses a prompt over the context before its engine sees it; a backend
    // shedding load answers 429. Each answer in turn: 400, 400, 429; then a 400 to a
    // request whose body is passed through (its head comes after generation: charged).
    const answers = ['400', '400', '429'];
    const backend = await scripted((_req, res) => {
      const a = answers.shift();
      if (a === undefined) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(chatStreamText(3));
        return;
      }
      res.writeHead(Number(a), { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          error: {
            message: "This model's maximum context length is 8192 tokens.",
            type: 'BadRequestError',
            code: Number(a),
          },
        }),
      );
    });
    cleanups.push(backend.close);
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 600 },
    ];
    t = await startTestGateway({
      backends: [{ name: 'b0', url: backend.url }],
      config: { tenants, upstream: { retries: 0 } },
    });
    for (const status of [400, 400]) {
      expect((await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status).toBe(status);
      expect(t.gw.runtime.live.tenantUsage('tpm')).toMatchObject({ inflight: 0, tokens: 0 });
    }
    expect(
      (await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'))).status,
    ).toBeGreaterThanOrEqual(429);
    expect(t.gw.runtime.live.tenantUsage('tpm')).toMatchObject({ inflight: 0, tokens: 0 });
    // A non-streamed request with logprobs is passed through whole: a 400 may come after vLLM
    // generated it (a tool call cut short), so it is charged.
    answers.push('400');
    const passed = await post(
      t.url,
      CHAT,
      chat({ stream: false, logprobs: true, max_tokens: 250 }),
      bearer('key-t'),
    );
    expect(passed.status).toBe(400);
    expect(t.gw.runtime.live.tenantUsage('tpm').tokens).toBeGreaterThan(0);
  });

  it('tokens_per_minute: a request without max_tokens is charged, as it ends, what its backend says it used', async () => {
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 1200 },
    ];
    // The backend generates 1,000 tokens for a request that named no max_tokens (as vLLM does, up
    // to the end of the context): usage says prompt 5, completion 1,000.
    const backend = await scripted((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(chatStreamText(1000));
    });
    cleanups.push(backend.close);
    t = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }], config: { tenants } });
    const unbounded = () => {
      const body = chat({ stream: true });
      delete body.max_tokens;
      return body;
    };
    // Charged at admission: the prompt and an estimated 256 output tokens, well under 1,200 twice.
    expect((await post(t.url, CHAT, unbounded(), bearer('key-t'))).status).toBe(200);
    // It used 1,005: with the next request's own charge, over the 1,200.
    const over = await post(t.url, CHAT, unbounded(), bearer('key-t'));
    expect(over.status).toBe(429);
    expect(JSON.parse(over.text).error.message).toMatch(/tokens per minute/);
  });

  it("a tenant's prompt is never matched for another tenant: the prefix hit it is told is its own", async () => {
    const tenants = [
      { name: 'a', api_key_sha256: sha('key-a'), class: 'interactive' },
      { name: 'b', api_key_sha256: sha('key-b'), class: 'interactive' },
    ];
    t = await startTestGateway({ replicas: 1, timeScale: 0.05, config: { tenants } });
    const secret = chat({
      stream: true,
      messages: [
        { role: 'system', content: `Internal playbook of team a. ${'Step: escalate. '.repeat(80)}` },
      ],
    });
    const hit = async (key: string) =>
      Number((await post(t!.url, CHAT, secret, bearer(key))).headers['x-slagate-prefix-hit']);
    expect(await hit('key-a')).toBe(0);
    // Sent again by its own tenant, it is matched...
    expect(await hit('key-a')).toBeGreaterThan(0.9);
    // ...and by another, not at all.
    expect(await hit('key-b')).toBe(0);
  });

  it('tokens_per_minute: a request every backend refused a connection to gives its tokens back', async () => {
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 600 },
    ];
    // Probes every minute: the dead replica stays routable, and each request is refused a connection.
    t = await startTestGateway({
      backends: [{ name: 'dead', url: await deadUrl() }],
      config: { tenants, upstream: { health_interval_ms: 60_000 } },
    });
    for (let i = 0; i < 4; i++) {
      const res = await post(t.url, CHAT, chat({ max_tokens: 250 }), bearer('key-t'));
      // Charged ~260 tokens each and never given back, the third would be refused rate_limited.
      expect(JSON.parse(res.text).error.code).toBe('no_healthy_backend');
    }
  });

  it('tokens_per_minute: a request refused in the queue, never sent, gives its tokens back', async () => {
    const g = await gated();
    const tenants = [
      { name: 'tpm', api_key_sha256: sha('key-t'), class: 'interactive', tokens_per_minute: 1200 },
    ];
    t = await startTestGateway({
      backends: [{ name: 'g0', url: g.backend.url }],
      config: { tenants, scheduler: { concurrency: { min: 1, max: 1, initial: 1 } } },
    });
    // One stream holds the backend's only slot (about 260 of the 1,200 tokens).
    const holder = await openStream(t.url, CHAT, chat({ stream: true, max_tokens: 250 }), bearer('key-t'))
      .response;
    await holder.until((s) => s.includes('"role"'));
    // Each of these is admitted (counted), then refused at once: it may not wait for the slot.
    for (let i = 0; i < 8; i++) {
      const refused = await post(t.url, CHAT, chat({ stream: true, max_tokens: 250 }), {
        ...bearer('key-t'),
        'x-slagate-no-queue': '1',
      });
      expect(JSON.parse(refused.text).error.code).toBe('queue_full');
    }
    g.releaseAll();
    await holder.ended;
    // Charged for the one it served only, the tenant still has room for another of ~260 tokens.
    const again = post(t.url, CHAT, chat({ stream: true, max_tokens: 250 }), bearer('key-t'));
    await waitFor(() => g.backend.hits.length === 2, 2000, 'the next request dispatched');
    g.releaseAll();
    expect((await again).status).toBe(200);
  });
});

describe('fairness by work between tenants of one class', () => {
  it('one tenant bursting at 5× the other’s rate does not push the other past its TTFT target', async () => {
    // One replica, at most 4 requests at once: A alone sends more than it can serve.
    const tenants = [
      { name: 'bursty', api_key_sha256: sha('key-burst'), class: 'interactive' },
      { name: 'steady', api_key_sha256: sha('key-steady'), class: 'interactive' },
    ];
    // The fleet runs in real time (time scale 1) so that a few milliseconds of a busy machine's
    // scheduling noise are small against the target; every figure below scales with it.
    t = await startTestGateway({
      replicas: 1,
      timeScale: 1,
      config: {
        tenants,
        sla: {
          default_class: 'interactive',
          classes: { interactive: { ttft_p99_ms: 1200, tpot_p99_ms: 400, priority: 0 } },
        },
        scheduler: { concurrency: { min: 4, max: 4, initial: 4 } },
      },
    });
    const send = (key: string, id: string) =>
      post(t!.url, CHAT, chat({ stream: true, max_tokens: 24, ignore_eos: true }), {
        ...bearer(key),
        'x-request-id': id,
      });
    const all: Promise<unknown>[] = [];
    // 5 s: the bursty tenant at 25/s, the steady one at 5/s (arrivals paced by the schedule).
    for (let i = 0; i < 125; i++) {
      all.push(new Promise((r) => setTimeout(r, i * 40)).then(() => send('key-burst', `burst-${i}`)));
    }
    for (let i = 0; i < 25; i++) {
      all.push(new Promise((r) => setTimeout(r, 20 + i * 200)).then(() => send('key-steady', `steady-${i}`)));
    }
    await Promise.all(all);
    const recs = await t.records();
    const steady = recs.filter((r) => r.tenant === 'steady');
    const bursty = recs.filter((r) => r.tenant === 'bursty');
    expect(steady).toHaveLength(25);
    // The steady tenant: every request served, every one within the target (its P99 is its max).
    expect(steady.every((r) => r.outcome === 'ok')).toBe(true);
    expect(Math.max(...steady.map((r) => r.ttft_ms!))).toBeLessThanOrEqual(1200);
    // The bursty one took the capacity that was left, and what could not meet its target was refused.
    expect(bursty.some((r) => r.outcome === 'refused')).toBe(true);
    expect(bursty.filter((r) => r.outcome === 'ok').length).toBeGreaterThan(25);
  });
});

describe('tenant limits across gateway instances sharing one Redis (item 31)', () => {
  let redis: RedisServer;
  let fleet: Fleet;
  beforeAll(async () => {
    redis = await startRedisServer();
    fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.5 });
  });
  afterAll(async () => {
    await fleet.close();
    await redis.stop();
  });

  it('A’s streams on one instance count against its limit on the other; B is unaffected', async () => {
    const config = {
      models: [MODEL],
      backends: [{ name: 'r0', url: fleet.urls[0]! }],
      tenants: TENANTS,
      state: { store: 'redis', redis_url: redis.url, key_prefix: 'tenants', refresh_interval_ms: 100 },
    };
    const gw1 = await serveChild(config);
    cleanups.push(gw1.dispose);
    const gw2 = await serveChild(config);
    cleanups.push(gw2.dispose);
    // Long enough (about 7 s of decode) to outlast both instances' refreshes on a slow machine.
    const long = chat({ stream: true, max_tokens: 2000, ignore_eos: true });
    // A's limit is 2: one stream on each instance.
    const s1 = await openStream(gw1.url, CHAT, long, bearer('key-a')).response;
    const s2 = await openStream(gw2.url, CHAT, long, bearer('key-a')).response;
    for (const s of [s1, s2]) await s.until((x) => x.includes('"role"'));
    cleanups.push(
      () => s1.close(),
      () => s2.close(),
    );
    // Each instance sees the other's request within a refresh interval; until it does, a
    // probe may still be admitted (and is short), so each instance is probed until it refuses.
    let refused: { id: string; status: number; retryAfter: unknown; body: string } | undefined;
    for (const [i, g] of [gw1, gw2].entries()) {
      let n = 0;
      await waitFor(
        async () => {
          const id = `over-${i + 1}-${n++}`;
          const r = await post(g.url, CHAT, chat({ max_tokens: 2 }), {
            ...bearer('key-a'),
            'x-request-id': id,
          });
          if (r.status !== 429) return false;
          refused = { id, status: r.status, retryAfter: r.headers['retry-after'], body: r.text };
          return true;
        },
        5000,
        `instance ${i + 1} counted its peer's stream`,
      );
    }
    expect(refused!.id).toMatch(/^over-2-/);
    expect(refused!.retryAfter).toBeDefined();
    expect(JSON.parse(refused!.body)).toMatchObject({ error: { code: 'rate_limited' } });
    for (const g of [gw1, gw2]) {
      const b = await post(g.url, CHAT, chat({ max_tokens: 2 }), bearer('key-b'));
      expect(b.status).toBe(200);
    }
    // A's streams end: both instances let A in again.
    s1.close();
    s2.close();
    await waitFor(
      async () => (await post(gw2.url, CHAT, chat({ max_tokens: 2 }), bearer('key-a'))).status === 200,
      3000,
      'A freed',
    );
    // The refusal's record (written within the log's 100 ms flush).
    await waitFor(
      () =>
        readRecords(gw2.log).some(
          (r) => r.req_id === refused!.id && r.reason === 'rate_limited' && r.tenant === 'team-a',
        ),
      2000,
      'the refusal recorded',
    );
  });
});
