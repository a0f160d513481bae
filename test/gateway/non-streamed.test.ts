// A non-streamed request is streamed from the backend and its body assembled at the gateway, so it
// is measured like a streamed one; the client gets exactly the body vLLM would have sent. Shapes
// the assembler does not cover pass through as before (docs/architecture.md lists them).
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import {
  chat,
  get,
  MODEL,
  post,
  type Script,
  scripted,
  startTestGateway,
  type TestGateway,
} from './harness.ts';

let t: TestGateway | null = null;
afterEach(async () => {
  await t?.close();
  t = null;
});

const CHAT = '/v1/chat/completions';
const COMPLETIONS = '/v1/completions';

/** vLLM's bodies carry `created` (seconds): the one field two requests may not share. */
const sansCreated = (text: string) => text.replace(/"created":\d+/, '"created":0');

/**
 * The x-request-id the gateway sent upstream, read from the body's id (`<prefix><sent id>`): the
 * client's id, then the attempt's own suffix.
 */
function upstreamId(body: string, prefix: string, clientId: string): string {
  const id = (JSON.parse(body) as { id: string }).id;
  expect(id.startsWith(`${prefix}${clientId}.`)).toBe(true);
  return id.slice(prefix.length);
}

/** A backend that answers every request with `reply` as JSON, recording each body it was sent. */
function jsonBackend(reply: string, bodies: Record<string, unknown>[]) {
  return scripted((_req, res, hit) => {
    bodies.push(JSON.parse(hit.body) as Record<string, unknown>);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(reply);
  });
}

describe('assembled from a stream', () => {
  it('chat: byte for byte the body the replica sends for the same request non-streamed', async () => {
    t = await startTestGateway({ replicas: 1 });
    const body = chat({ max_tokens: 24, seed: 7 });
    const via = await post(t.url, CHAT, body, { 'x-request-id': 'same-id' });
    expect(via.status).toBe(200);
    // The replica names its body by the x-request-id it was sent: the gateway's for its attempt.
    const sent = upstreamId(via.text, 'chatcmpl-', 'same-id');
    const direct = await post(t.fleet!.urls[0]!, CHAT, body, { 'x-request-id': sent });
    expect(direct.status).toBe(200);
    expect(via.headers['content-type']).toBe('application/json');
    expect(sansCreated(via.text)).toBe(sansCreated(direct.text));
    const rec = await t.recordOf('same-id');
    expect(rec).toMatchObject({ stream: false, outcome: 'ok', completion_tokens: 24 });
    expect(rec.ttft_ms!).toBeLessThan(rec.e2e_ms!);
    expect(rec.tpot_ms!).toBeGreaterThan(0);
    expect(typeof rec.sla_met).toBe('boolean');
  });

  it('completions: byte for byte too, with its own key order and nulls', async () => {
    t = await startTestGateway({ replicas: 1 });
    const body = { model: MODEL, prompt: 'Once upon a time', max_tokens: 9, seed: 3 };
    const via = await post(t.url, COMPLETIONS, body, { 'x-request-id': 'cmpl-same' });
    const sent = upstreamId(via.text, 'cmpl-', 'cmpl-same');
    const direct = await post(t.fleet!.urls[0]!, COMPLETIONS, body, { 'x-request-id': sent });
    expect(via.status).toBe(200);
    expect(sansCreated(via.text)).toBe(sansCreated(direct.text));
    expect((await t.recordOf('cmpl-same')).tpot_ms!).toBeGreaterThan(0);
  });

  it('asks the backend for a stream with usage; a failure before the first token is retried', async () => {
    const seen: { stream: unknown; include_usage: unknown }[] = [];
    let n = 0;
    const script: Script = (_req, res, hit) => {
      const b = JSON.parse(hit.body) as { stream?: unknown; stream_options?: { include_usage?: unknown } };
      seen.push({ stream: b.stream, include_usage: b.stream_options?.include_usage });
      if (n++ === 0) {
        res.writeHead(503).end();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const f = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
      const head = { id: 'chatcmpl-z', object: 'chat.completion.chunk', created: 5, model: MODEL };
      res.end(
        f({
          ...head,
          choices: [
            { index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null },
          ],
        }) +
          f({
            ...head,
            choices: [{ index: 0, delta: { content: 'Hel' }, logprobs: null, finish_reason: null }],
          }) +
          f({
            ...head,
            choices: [
              {
                index: 0,
                delta: { content: 'lo' },
                logprobs: null,
                finish_reason: 'stop',
                stop_reason: null,
              },
            ],
          }) +
          f({ ...head, choices: [], usage: { prompt_tokens: 4, total_tokens: 6, completion_tokens: 2 } }) +
          'data: [DONE]\n\n',
      );
    };
    const a = await scripted(script);
    const b = await scripted(script);
    t = await startTestGateway({
      backends: [
        { name: 'a', url: a.url },
        { name: 'b', url: b.url },
      ],
    });
    try {
      const res = await post(t.url, CHAT, chat(), { 'x-request-id': 'asm' });
      expect(res.status).toBe(200);
      expect(JSON.parse(res.text)).toEqual({
        id: 'chatcmpl-z',
        object: 'chat.completion',
        created: 5,
        model: MODEL,
        choices: [
          {
            index: 0,
            message: {
              role: 'assistant',
              content: 'Hello',
              refusal: null,
              annotations: null,
              audio: null,
              function_call: null,
              tool_calls: [],
              reasoning_content: null,
            },
            logprobs: null,
            finish_reason: 'stop',
            stop_reason: null,
          },
        ],
        service_tier: null,
        system_fingerprint: null,
        usage: { prompt_tokens: 4, total_tokens: 6, completion_tokens: 2, prompt_tokens_details: null },
        prompt_logprobs: null,
        kv_transfer_params: null,
      });
      expect(seen).toEqual([
        { stream: true, include_usage: true },
        { stream: true, include_usage: true },
      ]);
      expect(await t.recordOf('asm')).toMatchObject({ attempts: 2, outcome: 'ok', completion_tokens: 2 });
    } finally {
      await a.close();
      await b.close();
    }
  });

  it('tools, as the real openai client reads them: streamed from the backend, the calls assembled, TTFT measured and the SLA judged', async () => {
    const seen: { stream: unknown; tools: unknown }[] = [];
    const b = await scripted((_req, res, hit) => {
      const sent = JSON.parse(hit.body) as { stream?: unknown; tools?: unknown };
      seen.push({ stream: sent.stream, tools: sent.tools });
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const head = { id: 'chatcmpl-tc', object: 'chat.completion.chunk', created: 5, model: MODEL };
      const f = (delta: Record<string, unknown>, finish: string | null = null) =>
        `data: ${JSON.stringify({ ...head, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] })}\n\n`;
      res.end(
        f({ role: 'assistant', content: '' }) +
          f({
            tool_calls: [
              {
                index: 0,
                id: 'chatcmpl-tool-1',
                type: 'function',
                function: { name: 'weather', arguments: '' },
              },
            ],
          }) +
          f({ tool_calls: [{ index: 0, function: { arguments: '{"city": "Oslo"}' } }] }, 'tool_calls') +
          `data: ${JSON.stringify({ ...head, choices: [], usage: { prompt_tokens: 9, total_tokens: 11, completion_tokens: 2 } })}\n\n` +
          'data: [DONE]\n\n',
      );
    });
    t = await startTestGateway({ backends: [{ name: 'b', url: b.url }] });
    try {
      const openai = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'k', maxRetries: 0 });
      const tools = [
        {
          type: 'function' as const,
          function: {
            name: 'weather',
            parameters: { type: 'object', properties: { city: { type: 'string' } } },
          },
        },
      ];
      const completion = await openai.chat.completions.create(
        { model: MODEL, messages: [{ role: 'user', content: 'Weather in Oslo?' }], tools },
        { headers: { 'x-request-id': 'tc' } },
      );
      const choice = completion.choices[0]!;
      expect(choice.finish_reason).toBe('tool_calls');
      expect(choice.message.content).toBeNull();
      expect(choice.message.tool_calls).toEqual([
        {
          id: 'chatcmpl-tool-1',
          type: 'function',
          function: { name: 'weather', arguments: '{"city": "Oslo"}' },
        },
      ]);
      expect(choice.logprobs).toBeNull();
      expect(completion.usage).toMatchObject({ prompt_tokens: 9, completion_tokens: 2 });
      // Asked as a stream, the tools as the client sent them.
      expect(seen).toEqual([{ stream: true, tools }]);
      const rec = await t.recordOf('tc');
      expect(rec).toMatchObject({ stream: false, outcome: 'ok', completion_tokens: 2 });
      expect(rec.ttft_ms).not.toBeNull();
      expect(typeof rec.sla_met).toBe('boolean');
    } finally {
      await b.close();
    }
  });

  it('a stream that fails after its first token ends in the error envelope (nothing was sent yet)', async () => {
    t = await startTestGateway({ replicas: 1 });
    await t.fleet!.replicas[0]!.fault({ mode: 'drop', afterTokens: 3 });
    const res = await post(t.url, CHAT, chat({ max_tokens: 20 }), { 'x-request-id': 'asm-drop' });
    expect(res.status).toBe(502);
    expect(JSON.parse(res.text)).toMatchObject({ error: { code: 'upstream_error' } });
    const rec = await t.recordOf('asm-drop');
    expect(rec).toMatchObject({ outcome: 'failed_after_commit', attempts: 1 });
    // The headers of every answer to an admitted request (docs/architecture.md).
    expect(res.headers['x-slagate-backend']).toBe(rec.backend);
    expect(res.headers['x-slagate-queue-ms']).toMatch(/^\d+(\.\d)?$/);
  });
});

describe('shapes the assembler does not cover pass through', () => {
  it("chat's echo: sent non-streamed, relayed as it came, no TTFT claimed", async () => {
    const bodies: Record<string, unknown>[] = [];
    const reply = JSON.stringify({
      id: 'x',
      object: 'chat.completion',
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: 'hi' },
          logprobs: null,
          finish_reason: 'stop',
        },
      ],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
    });
    const b = await jsonBackend(reply, bodies);
    t = await startTestGateway({ backends: [{ name: 'b', url: b.url }] });
    try {
      const res = await post(t.url, CHAT, chat({ echo: true }), {
        'x-request-id': 'lp',
      });
      expect(res.status).toBe(200);
      expect(res.text).toBe(reply);
      expect(bodies[0]!.stream).toBeUndefined();
      expect(bodies[0]!.stream_options).toBeUndefined();
      const rec = await t.recordOf('lp');
      // Nothing arrives before the end: no TTFT or TPOT is made up, and the SLA is not judged.
      expect(rec).toMatchObject({ outcome: 'ok', ttft_ms: null, tpot_ms: null, sla_met: null });
    } finally {
      await b.close();
    }
  });

  it("a retry that hangs with most of its budget left is its backend's fault when streamed, the deadline's when passed through", async () => {
    // Whichever backend is tried first fails at once; the retry hangs on the other.
    let hits = 0;
    const script: Script = (_req, res) => {
      if (++hits % 2 === 1) res.writeHead(500, { 'content-type': 'application/json' }).end('{}');
    };
    const [b0, b1] = [await scripted(script), await scripted(script)];
    t = await startTestGateway({
      backends: [
        { name: 'b0', url: b0.url },
        { name: 'b1', url: b1.url },
      ],
      config: { upstream: { first_token_timeout_ms: 400, passthrough_timeout_ms: 400 } },
    });
    try {
      const streamed = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'hung-retry' });
      expect(streamed.status).toBe(504);
      const rec = await t.recordOf('hung-retry');
      expect(rec.failed_attempts.map((f) => f.reason)).toEqual(['upstream_status', 'first_token_timeout']);
      // A body passed through: the retry's timer runs to the end of a generation it may need
      // more of than is left, however little the first attempt took.
      const passed = await post(t.url, CHAT, chat({ echo: true }), { 'x-request-id': 'hung-passthrough' });
      expect(passed.status).toBe(504);
      const whole = await t.recordOf('hung-passthrough');
      expect(whole.failed_attempts.map((f) => f.reason)).toEqual(['upstream_status', 'deadline']);
    } finally {
      await b0.close();
      await b1.close();
    }
  });

  it('its generation may outlast first_token_timeout_ms: upstream.passthrough_timeout_ms is its budget', async () => {
    const b = await scripted(async (_req, res) => {
      await new Promise((r) => setTimeout(r, 700));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [] }));
    });
    t = await startTestGateway({
      backends: [{ name: 'b', url: b.url }],
      config: {
        upstream: { first_token_timeout_ms: 300, passthrough_timeout_ms: 5_000 },
        sla: { default_class: 'fast', classes: { fast: { ttft_p99_ms: 100, tpot_p99_ms: 50, priority: 0 } } },
      },
    });
    try {
      const res = await post(t.url, CHAT, chat({ echo: true }), {
        'x-request-id': 'tools-long',
      });
      expect(res.status).toBe(200);
      expect(await t.recordOf('tools-long')).toMatchObject({ outcome: 'ok', attempts: 1 });
    } finally {
      await b.close();
    }
  });

  it('its prefill stops counting as pending within the first-token budget, not at the end of its generation', async () => {
    let answer: (() => void) | null = null;
    const b = await scripted((_req, res) => {
      // The generation: the body comes when the test says so.
      answer = () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'x', object: 'chat.completion', choices: [] }));
      };
    });
    // A generation may take up to first_token_timeout_ms (the whole budget of a body passed
    // through); the first-token budget of the class is 4 × its 100 ms target.
    t = await startTestGateway({
      backends: [{ name: 'b', url: b.url }],
      config: {
        upstream: { first_token_timeout_ms: 10_000 },
        sla: { default_class: 'fast', classes: { fast: { ttft_p99_ms: 100, tpot_p99_ms: 50, priority: 0 } } },
      },
    });
    type State = { backends: { local_inflight: number; inflight: { pendingPrefillTokens: number } }[] };
    const state = async () => JSON.parse((await get(t!.url, '/admin/state')).text) as State;
    try {
      const res = post(t.url, CHAT, chat({ echo: true }), { 'x-request-id': 'lp-long' });
      let s = await state();
      const started = performance.now();
      while (answer === null || s.backends[0]!.local_inflight === 0) {
        if (performance.now() - started > 5_000) throw new Error('the request never reached the backend');
        await new Promise((r) => setImmediate(r));
        s = await state();
      }
      expect(s.backends[0]!.inflight.pendingPrefillTokens).toBeGreaterThan(0);
      // Nothing predicts this backend yet: the first-token budget (400 ms) is when its prefill
      // counts as done. The request is still running then.
      while (s.backends[0]!.inflight.pendingPrefillTokens > 0) {
        if (performance.now() - started > 5_000) throw new Error('the prefill stayed pending');
        await new Promise((r) => setTimeout(r, 50));
        s = await state();
      }
      expect(s.backends[0]!.local_inflight).toBe(1);
      (answer as () => void)();
      expect((await res).status).toBe(200);
    } finally {
      await b.close();
    }
  });
});
