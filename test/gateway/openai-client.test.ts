// The official openai client, unchanged, through the gateway in front of simulated vLLM replicas:
// chat and completions, streamed and not; the response headers of DESIGN section 4; /v1/models.
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { get, MODEL, post, startTestGateway, type TestGateway } from './harness.ts';

let t: TestGateway;
let openai: OpenAI;

beforeAll(async () => {
  t = await startTestGateway({ replicas: 2, timeScale: 0.05 });
  openai = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
afterAll(async () => {
  await t.close();
});

const messages = [{ role: 'user' as const, content: 'Write a short poem about the sea.' }];

describe('openai client through the gateway', () => {
  it('chat, not streamed: a whole completion with usage', async () => {
    const { data, response } = await openai.chat.completions
      .create({ model: MODEL, messages, max_tokens: 12 })
      .withResponse();
    expect(data.object).toBe('chat.completion');
    expect(data.choices[0]?.message.role).toBe('assistant');
    expect(data.choices[0]?.message.content?.length).toBeGreaterThan(0);
    expect(data.usage?.completion_tokens).toBeGreaterThan(0);
    expect(data.usage?.completion_tokens).toBeLessThanOrEqual(12);
    expect(response.headers.get('x-slagate-backend')).toMatch(/^r[01]$/);
    const rec = await t.recordOf(response.headers.get('x-request-id')!);
    expect(rec).toMatchObject({ outcome: 'ok', stream: false, model: MODEL, attempts: 1 });
    expect(rec.completion_tokens).toBe(data.usage?.completion_tokens);
    // The backend streamed it and the gateway assembled the body: TTFT and TPOT are measured as for
    // a streamed request, the SLA is judged on both, and the live windows learn from it.
    expect(rec.ttft_ms!).toBeLessThan(rec.e2e_ms!);
    expect(rec.tpot_ms!).toBeGreaterThan(0);
    expect(rec.sla_met).toBe(rec.ttft_ms! <= rec.ttft_target_ms! && rec.tpot_ms! <= rec.tpot_target_ms!);
    const backend = rec.backend!;
    expect(t.gw.runtime.live.backendView(backend)?.latency.requests ?? 0).toBe(
      (await t.records()).filter((r) => r.backend === backend && r.outcome === 'ok').length,
    );
  });

  it('completions with token-id prompts, as vLLM accepts them', async () => {
    const single = await openai.completions.create({ model: MODEL, prompt: [791, 3938, 315], max_tokens: 4 });
    expect(single.choices[0]?.text.length).toBeGreaterThan(0);
    const res = await post(t.url, '/v1/completions', { model: MODEL, prompt: [[791, 3938]], max_tokens: 2 });
    expect(res.status).toBe(200);
    const rec = await t.recordOf(res.headers['x-request-id'] as string);
    expect(rec.prompt_tokens_est).toBe(2);
    const bad = await post(t.url, '/v1/completions', { model: MODEL, prompt: [1.5, -2], max_tokens: 2 });
    expect(bad.status).toBe(400);
  });

  it('chat, streamed: the text arrives in chunks and usage when asked', async () => {
    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 10,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let chunks = 0;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      chunks++;
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(usage?.completion_tokens).toBe(10);
    // role chunk + one chunk per token + usage chunk
    expect(chunks).toBe(12);
  });

  it('chat, streamed with stream_options but no include_usage: usage arrives, as vLLM defaults it on', async () => {
    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 5,
      stream: true,
      stream_options: {},
    });
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
    expect(usage?.completion_tokens).toBe(5);
  });

  it('chat, streamed without include_usage: no usage chunk reaches the client', async () => {
    const stream = await openai.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 5,
      stream: true,
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.some((c) => c.usage)).toBe(false);
    expect(chunks.length).toBe(6);
  });

  it('completions, not streamed and streamed', async () => {
    const whole = await openai.completions.create({
      model: MODEL,
      prompt: 'Once upon a time',
      max_tokens: 6,
    });
    expect(whole.object).toBe('text_completion');
    expect(whole.choices[0]?.text.length).toBeGreaterThan(0);
    expect(whole.usage?.completion_tokens).toBe(6);

    const stream = await openai.completions.create({
      model: MODEL,
      prompt: 'Once upon a time',
      max_tokens: 6,
      stream: true,
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
    // The same prompt and seed give the same text on any replica.
    expect(text).toBe(whole.choices[0]?.text);
  });

  it('an unknown model is a typed 404 from the gateway', async () => {
    const err = await openai.chat.completions
      .create({ model: 'no-such-model', messages })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('model_not_found');
  });

  it('lists the configured models with the context length the backends report', async () => {
    const list = await openai.models.list();
    expect(list.data.map((m) => m.id)).toEqual([MODEL]);
    expect((list.data[0] as unknown as { max_model_len: number }).max_model_len).toBe(131072);
  });
});

describe('response headers (DESIGN section 4)', () => {
  it('keeps a given x-request-id and names backend, class and queue time', async () => {
    const res = await post(
      t.url,
      '/v1/chat/completions',
      { model: MODEL, messages, max_tokens: 3, stream: true },
      { 'x-request-id': 'client-id-42' },
    );
    expect(res.status).toBe(200);
    expect(res.headers['x-request-id']).toBe('client-id-42');
    expect(res.headers['x-slagate-backend']).toMatch(/^r[01]$/);
    expect(res.headers['x-slagate-class']).toBe('interactive');
    // Measured: the time this request waited in the gateway's queue (none here), as the record says.
    expect(res.headers['x-slagate-queue-ms']).toMatch(/^\d+(\.\d)?$/);
    // The router's estimate of the cached share: none for a prompt shorter than one index block,
    // which the index cannot see (not measured, so no header)...
    expect(res.headers['x-slagate-prefix-hit']).toBeUndefined();
    // ...and 0 for a first, unique prompt it can see.
    const long = await post(t.url, '/v1/chat/completions', {
      model: MODEL,
      messages: [{ role: 'user', content: `a first question ${'never asked before '.repeat(40)}` }],
      max_tokens: 3,
      stream: true,
    });
    expect(long.headers['x-slagate-prefix-hit']).toBe('0');
    const rec = await t.recordOf('client-id-42');
    expect(rec.backend).toBe(res.headers['x-slagate-backend']);
    expect(Number(res.headers['x-slagate-queue-ms'])).toBeCloseTo(rec.queue_ms!, 0);
    expect(rec.prefix_hit_est).toBeNull();
    expect(rec.prefix_blocks).toBe(0);
  });

  it('sends the predicted TTFT the record carries once the backend has a fit, and none before', async () => {
    const one = await startTestGateway({ replicas: 1, timeScale: 0.05 });
    try {
      const ask = (id: string, words: number) =>
        post(
          one.url,
          '/v1/chat/completions',
          {
            model: MODEL,
            messages: [{ role: 'user', content: `${id} ${'a question of some length '.repeat(words)}` }],
            max_tokens: 2,
            stream: true,
          },
          { 'x-request-id': id },
        );
      // A fresh backend has no fit: nothing predicted, no header.
      const cold = await ask('cold', 10);
      expect(cold.status).toBe(200);
      expect((await one.recordOf('cold')).predicted_ttft_ms).toBeNull();
      expect(cold.headers['x-slagate-predicted-ttft-ms']).toBeUndefined();
      // Its first tokens teach the fit (prompts of several lengths).
      for (const [i, words] of [40, 120, 250, 20, 400].entries()) {
        expect((await ask(`teach-${i}`, words)).status).toBe(200);
      }
      const warm = await ask('warm', 60);
      const rec = await one.recordOf('warm');
      expect(rec.predicted_ttft_ms).not.toBeNull();
      expect(Number(warm.headers['x-slagate-predicted-ttft-ms'])).toBeCloseTo(rec.predicted_ttft_ms!, 0);
    } finally {
      await one.close();
    }
  });

  it('makes an id when none (or an unsafe one) is given, and sends it on errors too', async () => {
    const ok = await post(t.url, '/v1/chat/completions', { model: MODEL, messages, max_tokens: 2 });
    expect(ok.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    const bad = await post(
      t.url,
      '/v1/chat/completions',
      { model: MODEL, messages, max_tokens: 2 },
      { 'x-request-id': 'has spaces and {braces}' },
    );
    expect(bad.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    const refused = await post(t.url, '/v1/chat/completions', { model: 'nope', messages });
    expect(refused.status).toBe(404);
    expect(refused.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    const rec = await t.recordOf(refused.headers['x-request-id'] as string);
    expect(rec).toMatchObject({ outcome: 'refused', reason: 'model_not_found' });
  });

  it('honours x-slagate-class only for a known class', async () => {
    const batch = await post(
      t.url,
      '/v1/chat/completions',
      { model: MODEL, messages, max_tokens: 2 },
      { 'x-slagate-class': 'batch' },
    );
    expect(batch.headers['x-slagate-class']).toBe('batch');
    const unknown = await post(
      t.url,
      '/v1/chat/completions',
      { model: MODEL, messages, max_tokens: 2 },
      { 'x-slagate-class': 'platinum' },
    );
    expect(unknown.headers['x-slagate-class']).toBe('interactive');
  });

  it('HEAD /v1/models writes no admission record', async () => {
    const n = (await t.records()).length;
    const { send } = await import('../helpers/http.ts');
    expect((await send(t.url, 'HEAD', '/v1/models')).status).toBe(200);
    expect((await t.records()).length).toBe(n);
  });

  it('GET /v1/models is served by the gateway itself', async () => {
    const res = await get(t.url, '/v1/models');
    expect(res.status).toBe(200);
    const body = JSON.parse(res.text) as { data: { id: string; owned_by: string }[] };
    expect(body.data).toHaveLength(1);
    expect(body.data[0]).toMatchObject({ id: MODEL, owned_by: 'slagate' });
  });
});
