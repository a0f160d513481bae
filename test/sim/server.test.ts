import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getProfile } from '../../src/sim/profiles.ts';
import { SimReplica } from '../../src/sim/replica.ts';
import { naturalLength, requestSeed } from '../../src/sim/textgen.ts';
import { sharedTokenizer } from '../../src/tokenizer/tokenizer.ts';
import { openStream, post, send, sseData, waitFor } from './http-helpers.ts';

const PROFILE = getProfile('llama3-8b-h100');
const MODEL = PROFILE.model;
const CHAT = '/v1/chat/completions';
const COMPLETIONS = '/v1/completions';
const MESSAGES = [
  { role: 'system', content: 'You are a terse assistant.' },
  { role: 'user', content: 'Name three rivers.' },
];

let replica: SimReplica;
let base: string;

beforeAll(async () => {
  replica = await SimReplica.start({ profile: PROFILE, timeScale: 0.05, seed: 1 });
  base = replica.url;
});
afterAll(() => replica.close());

describe('chat streaming', () => {
  it('sends the role chunk, one chunk per token, the finish chunk and [DONE], and no usage unless asked', async () => {
    const r = await post(
      base,
      CHAT,
      { model: MODEL, messages: MESSAGES, max_tokens: 6, stream: true },
      {
        'x-request-id': 'req-1',
      },
    );
    expect(r.status).toBe(200);
    expect(r.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    expect(r.headers['x-request-id']).toBe('req-1');
    const data = sseData(r.text);
    expect(data.at(-1)).toBe('[DONE]');
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
    expect(chunks).toHaveLength(7); // role + 6 tokens
    for (const c of chunks) {
      expect(Object.keys(c)).toEqual(['id', 'object', 'created', 'model', 'choices']);
      expect(c.id).toBe('chatcmpl-req-1');
      expect(c.object).toBe('chat.completion.chunk');
      expect(c.model).toBe(MODEL);
      expect(Number.isInteger(c.created)).toBe(true);
    }
    expect(chunks[0].choices).toEqual([
      { index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null },
    ]);
    for (const c of chunks.slice(1, -1)) {
      expect(Object.keys(c.choices[0])).toEqual(['index', 'delta', 'logprobs', 'finish_reason']);
      expect(c.choices[0].finish_reason).toBeNull();
      expect(typeof c.choices[0].delta.content).toBe('string');
      expect(c.choices[0].delta.content.length).toBeGreaterThan(0);
    }
    const last = chunks.at(-1).choices[0];
    expect(Object.keys(last)).toEqual(['index', 'delta', 'logprobs', 'finish_reason', 'stop_reason']);
    expect(last.finish_reason).toBe('length');
    expect(last.stop_reason).toBeNull();
    expect(last.delta.content.length).toBeGreaterThan(0);
  });

  it('adds the usage chunk before [DONE] when stream_options.include_usage is set', async () => {
    const r = await post(base, CHAT, {
      model: MODEL,
      messages: MESSAGES,
      max_completion_tokens: 4,
      stream: true,
      stream_options: { include_usage: true },
    });
    const data = sseData(r.text);
    const usage = JSON.parse(data.at(-2) as string);
    expect(usage.choices).toEqual([]);
    expect(Object.keys(usage.usage)).toEqual(['prompt_tokens', 'total_tokens', 'completion_tokens']);
    const tok = JSON.parse((await post(base, '/tokenize', { model: MODEL, messages: MESSAGES })).text);
    expect(usage.usage).toEqual({
      prompt_tokens: tok.count,
      total_tokens: tok.count + 4,
      completion_tokens: 4,
    });
    expect(data).toHaveLength(1 + 4 + 1 + 1);
  });

  it('stops naturally with finish_reason stop after the seeded length, the last token being the empty EOS', async () => {
    const body = {
      model: MODEL,
      messages: MESSAGES,
      seed: 12345,
      stream: true,
      stream_options: { include_usage: true },
    };
    const r = await post(base, CHAT, body);
    const chunks = sseData(r.text)
      .slice(0, -1)
      .map((d) => JSON.parse(d));
    const usage = chunks.at(-1).usage;
    const expected = naturalLength(requestSeed(1, [], 12345));
    expect(usage.completion_tokens).toBe(expected);
    const finish = chunks.at(-2).choices[0];
    expect(finish.finish_reason).toBe('stop');
    expect(finish.delta.content).toBe('');
  });
});

describe('completions streaming', () => {
  it('sends text_completion chunks with every field, nulls included', async () => {
    const r = await post(base, COMPLETIONS, {
      model: MODEL,
      prompt: 'Once upon a time',
      max_tokens: 3,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(r.headers['content-type']).toBe('text/event-stream; charset=utf-8');
    const data = sseData(r.text);
    expect(data.at(-1)).toBe('[DONE]');
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
    expect(chunks).toHaveLength(4);
    for (const c of chunks.slice(0, 3)) {
      expect(Object.keys(c)).toEqual(['id', 'object', 'created', 'model', 'choices', 'usage']);
      expect(c.object).toBe('text_completion');
      expect(c.id).toMatch(/^cmpl-[0-9a-f]{32}$/);
      expect(c.usage).toBeNull();
      expect(Object.keys(c.choices[0])).toEqual([
        'index',
        'text',
        'logprobs',
        'finish_reason',
        'stop_reason',
      ]);
    }
    expect(chunks.slice(0, 2).map((c) => c.choices[0].finish_reason)).toEqual([null, null]);
    expect(chunks[2].choices[0].finish_reason).toBe('length');
    const prompt = 1 + sharedTokenizer.encode('Once upon a time').length;
    expect(chunks[3].usage).toEqual({
      prompt_tokens: prompt,
      total_tokens: prompt + 3,
      completion_tokens: 3,
    });
    expect(chunks[3].choices).toEqual([]);
  });
});

describe('non-streaming', () => {
  it('returns the whole chat.completion body', async () => {
    const r = await post(base, CHAT, { model: MODEL, messages: MESSAGES, max_tokens: 5, ignore_eos: true });
    expect(r.status).toBe(200);
    expect(r.headers['content-type']).toBe('application/json');
    expect(Number(r.headers['content-length'])).toBe(Buffer.byteLength(r.text));
    const j = JSON.parse(r.text);
    expect(j.id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
    expect(r.headers['x-request-id']).toBe(j.id.slice('chatcmpl-'.length));
    expect(j.object).toBe('chat.completion');
    expect(j.choices[0].message.role).toBe('assistant');
    expect(j.choices[0].message.content.split(/(?=[ ,.])/).length).toBeGreaterThanOrEqual(3);
    expect(j.choices[0]).toMatchObject({
      index: 0,
      logprobs: null,
      finish_reason: 'length',
      stop_reason: null,
    });
    expect(j.usage.completion_tokens).toBe(5);
    expect(j.usage.total_tokens).toBe(j.usage.prompt_tokens + 5);
  });

  it('returns the whole text_completion body', async () => {
    const r = await post(base, COMPLETIONS, { model: MODEL, prompt: 'Hello', max_tokens: 2 });
    const j = JSON.parse(r.text);
    expect(j.object).toBe('text_completion');
    expect(j.choices).toEqual([
      {
        index: 0,
        text: expect.any(String),
        logprobs: null,
        finish_reason: 'length',
        stop_reason: null,
        prompt_logprobs: null,
      },
    ]);
    expect(j.usage).toEqual({
      prompt_tokens: 2,
      total_tokens: 4,
      completion_tokens: 2,
      prompt_tokens_details: null,
    });
  });

  it("a completion without max_tokens stops at vLLM's default of 16", async () => {
    const body = { model: MODEL, prompt: 'Hello', ignore_eos: true };
    const absent = JSON.parse((await post(base, COMPLETIONS, body)).text);
    expect(absent.usage.completion_tokens).toBe(16);
    expect(absent.choices[0].finish_reason).toBe('length');
  });

  it('generates the same text for the same seed on another replica, and other text for another seed', async () => {
    const other = await SimReplica.start({ profile: PROFILE, timeScale: 0.05, seed: 1 });
    try {
      const body = { model: MODEL, messages: MESSAGES, max_tokens: 12, seed: 99 };
      const text = async (b: string, extra = {}) =>
        JSON.parse((await post(b, CHAT, { ...body, ...extra })).text).choices[0].message.content as string;
      const a = await text(base);
      expect(await text(other.url)).toBe(a);
      expect(await text(base, { seed: 100 })).not.toBe(a);
    } finally {
      await other.close();
    }
  });
});

describe('errors', () => {
  const envelope = (text: string) => {
    const j = JSON.parse(text);
    expect(Object.keys(j)).toEqual(['error']);
    expect(Object.keys(j.error)).toEqual(['message', 'type', 'param', 'code']);
    return j.error;
  };

  it('answers an unknown model with 404 NotFoundError', async () => {
    const r = await post(base, CHAT, { model: 'gpt-5', messages: MESSAGES });
    expect(r.status).toBe(404);
    expect(envelope(r.text)).toMatchObject({
      message: 'The model `gpt-5` does not exist.',
      type: 'NotFoundError',
      code: 404,
    });
  });

  it('answers bad JSON and bad fields with 400', async () => {
    const bad = await post(base, CHAT, '{"model":');
    expect(bad.status).toBe(400);
    expect(envelope(bad.text)).toMatchObject({ type: 'Bad Request', code: 400 });
    const field = await post(base, CHAT, { model: MODEL, messages: MESSAGES, max_tokens: 'ten' });
    expect(field.status).toBe(400);
    expect(envelope(field.text).param).toBe('max_tokens');
    const n = await post(base, CHAT, { model: MODEL, messages: MESSAGES, n: 0 });
    expect(n.status).toBe(400);
    expect(envelope(n.text)).toMatchObject({ param: 'n', code: 400 });
    for (const cache_salt of ['', 7]) {
      const salt = await post(base, CHAT, { model: MODEL, messages: MESSAGES, cache_salt });
      expect(salt.status).toBe(400);
      expect(envelope(salt.text)).toMatchObject({ param: 'cache_salt', code: 400 });
    }
    const image = await post(base, CHAT, {
      model: MODEL,
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }],
    });
    expect(image.status).toBe(400);
  });

  it('answers context overflow with vLLM messages', async () => {
    const small = await SimReplica.start({ profile: { ...PROFILE, maxModelLen: 64 }, timeScale: 0.05 });
    try {
      const count = (p: string) => 1 + sharedTokenizer.encode(p).length;
      const longPrompt = ' word'.repeat(100);
      const long = await post(small.url, COMPLETIONS, { model: MODEL, prompt: longPrompt, max_tokens: 1 });
      expect(long.status).toBe(400);
      expect(count(longPrompt)).toBe(101);
      expect(envelope(long.text).message).toBe(
        "This model's maximum context length is 64 tokens. However, your request has 101 input tokens. " +
          'Please reduce the length of the input messages.',
      );
      const shortPrompt = ' word'.repeat(20);
      expect(count(shortPrompt)).toBe(21);
      const over = await post(small.url, COMPLETIONS, { model: MODEL, prompt: shortPrompt, max_tokens: 50 });
      expect(over.status).toBe(400);
      expect(envelope(over.text)).toMatchObject({
        type: 'BadRequestError',
        code: 400,
        message:
          "'max_tokens' or 'max_completion_tokens' is too large: 50. This model's maximum context length " +
          'is 64 tokens and your request has 21 input tokens (50 > 64 - 21).',
      });
      // With max_tokens null the request may use the rest of the context (left out, it gets 16).
      const rest = await post(small.url, COMPLETIONS, {
        model: MODEL,
        prompt: shortPrompt,
        max_tokens: null,
        ignore_eos: true,
      });
      expect(JSON.parse(rest.text).usage.completion_tokens).toBe(64 - 21);
    } finally {
      await small.close();
    }
  });

  it('answers unknown routes with 404 in the envelope', async () => {
    const r = await send(base, 'GET', '/v1/embeddings');
    expect(r.status).toBe(404);
    expect(envelope(r.text)).toMatchObject({ type: 'NotFoundError', code: 404 });
    const noPrefix = await post(base, '/chat/completions', { model: MODEL, messages: MESSAGES });
    expect(noPrefix.status).toBe(404);
  });
});

describe('other routes', () => {
  it('serves /v1/models, /health, /version and /tokenize', async () => {
    const models = JSON.parse((await send(base, 'GET', '/v1/models')).text);
    expect(models.object).toBe('list');
    expect(models.data[0]).toMatchObject({
      id: MODEL,
      object: 'model',
      owned_by: 'vllm',
      root: MODEL,
      parent: null,
      max_model_len: PROFILE.maxModelLen,
    });
    const health = await send(base, 'GET', '/health');
    expect(health.status).toBe(200);
    expect(health.text).toBe('');
    expect(JSON.parse((await send(base, 'GET', '/version')).text).version).toMatch(/^\d+\.\d+\.\d+/);
    const tok = JSON.parse((await post(base, '/tokenize', { model: MODEL, prompt: 'Hello world' })).text);
    expect(tok).toEqual({
      count: 3,
      max_model_len: PROFILE.maxModelLen,
      tokens: [128000, 9906, 1917],
      token_strs: null,
    });
    const noBos = JSON.parse(
      (await post(base, '/tokenize', { prompt: 'Hello world', add_special_tokens: false })).text,
    );
    expect(noBos.tokens).toEqual([9906, 1917]);
  });

  it('reports cached prefix tokens, including the blocks of a previous answer re-sent in the next turn', async () => {
    const system = 'You answer questions about rivers of the world. '.repeat(30);
    const turn1 = [
      { role: 'system', content: system },
      { role: 'user', content: 'Which river is longest?' },
    ];
    const before = JSON.parse((await post(base, '/sim/cached-tokens', { messages: turn1 })).text);
    expect(before.cached_tokens).toBe(0);
    const r = await post(base, CHAT, {
      model: MODEL,
      messages: turn1,
      max_tokens: 64,
      ignore_eos: true,
      seed: 5,
    });
    const answer = JSON.parse(r.text).choices[0].message.content as string;
    const after = JSON.parse((await post(base, '/sim/cached-tokens', { messages: turn1 })).text);
    expect(after.prompt_tokens).toBe(before.prompt_tokens);
    expect(after.cached_tokens).toBe(Math.floor(after.prompt_tokens / 16) * 16);
    const turn2 = [
      ...turn1,
      { role: 'assistant', content: answer },
      { role: 'user', content: 'And the second?' },
    ];
    const next = JSON.parse((await post(base, '/sim/cached-tokens', { messages: turn2 })).text);
    // Prompt + the computed output tokens (all but the last) form cached full blocks.
    expect(next.cached_tokens).toBe(Math.floor((after.prompt_tokens + 63) / 16) * 16);
  });
});

describe('openai client', () => {
  const client = () => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });

  it('streams a chat completion with usage', async () => {
    const stream = await client().chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text.length).toBeGreaterThan(8);
    expect(finish).toBe('length');
    expect(usage?.completion_tokens).toBe(8);
  });

  it('gets a non-streamed chat completion', async () => {
    const r = await client().chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 4,
    });
    expect(r.choices[0]?.message.content?.length).toBeGreaterThan(4);
    expect(r.usage?.completion_tokens).toBe(4);
  });

  it('streams and non-streams completions', async () => {
    const stream = await client().completions.create({
      model: MODEL,
      prompt: 'Say',
      max_tokens: 5,
      stream: true,
      stream_options: { include_usage: true },
    });
    let pieces = 0;
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      if (chunk.choices.length > 0) pieces++;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(pieces).toBe(5);
    expect(usage?.completion_tokens).toBe(5);
    const whole = await client().completions.create({ model: MODEL, prompt: 'Say', max_tokens: 3 });
    expect(whole.choices[0]?.finish_reason).toBe('length');
    expect(whole.usage?.total_tokens).toBe(whole.usage!.prompt_tokens + 3);
  });

  it('raises NotFoundError for an unknown model', async () => {
    await expect(
      client().chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'Hi' }] }),
    ).rejects.toMatchObject({ status: 404 });
  });
});

describe('n choices', () => {
  it('streams n choices interleaved, each its own text, a role chunk for each first, usage over all', async () => {
    const body = { model: MODEL, messages: MESSAGES, max_tokens: 6, ignore_eos: true, n: 3, seed: 7 };
    const r = await post(base, CHAT, { ...body, stream: true, stream_options: { include_usage: true } });
    expect(r.status).toBe(200);
    const chunks = sseData(r.text)
      .filter((d) => d !== '[DONE]')
      .map((d) => JSON.parse(d));
    // The role chunks of the three choices come first.
    expect(chunks.slice(0, 3).map((c) => [c.choices[0].index, c.choices[0].delta.role])).toEqual([
      [0, 'assistant'],
      [1, 'assistant'],
      [2, 'assistant'],
    ]);
    const texts = ['', '', ''];
    const finishes: (string | null)[] = [null, null, null];
    for (const c of chunks.slice(3, -1)) {
      const ch = c.choices[0];
      texts[ch.index] += ch.delta.content;
      if (ch.finish_reason !== null) finishes[ch.index] = ch.finish_reason;
    }
    expect(finishes).toEqual(['length', 'length', 'length']);
    // Each choice its own seed: three different texts.
    expect(new Set(texts).size).toBe(3);
    const usage = chunks.at(-1).usage;
    expect(usage.completion_tokens).toBe(18);
    // Not streamed: the same three texts, one choice each, in order.
    const whole = JSON.parse((await post(base, CHAT, body)).text);
    expect(whole.choices.map((c: { index: number }) => c.index)).toEqual([0, 1, 2]);
    expect(whole.choices.map((c: { message: { content: string } }) => c.message.content)).toEqual(texts);
    expect(whole.usage.completion_tokens).toBe(18);
  });

  it('a client that leaves aborts every choice', async () => {
    const before = abortCount(replica);
    const s = await openStream(base, CHAT, {
      model: MODEL,
      messages: MESSAGES,
      max_tokens: 20000,
      ignore_eos: true,
      stream: true,
      n: 2,
    });
    await s.until((t) => t.split('data: ').length > 5);
    expect(replica.engine.stats().running).toBe(2);
    s.close();
    await waitFor(() => replica.engine.stats().running === 0, 2000, 'engine running = 0');
    expect(abortCount(replica)).toBe(before + 2);
  });
});

describe('client disconnect', () => {
  it('aborts the engine request at once', async () => {
    const s = await openStream(base, CHAT, {
      model: MODEL,
      messages: MESSAGES,
      max_tokens: 20000,
      ignore_eos: true,
      stream: true,
    });
    await s.until((t) => t.includes('"content":"') && t.split('data: ').length > 3);
    expect(replica.engine.stats().running).toBe(1);
    const abortsBefore = abortCount(replica);
    s.close();
    await waitFor(() => replica.engine.stats().running === 0, 2000, 'engine running = 0');
    expect(replica.engine.stats().waiting).toBe(0);
    expect(abortCount(replica)).toBe(abortsBefore + 1);
    // vLLM's metrics leave a client's abort out (its output processor drops the request before
    // its stats are taken): no finish reason counts it.
    expect(successCount(replica, 'abort')).toBe(0);
  });
});

/** Client aborts, on the simulator's own /sim/stats. */
function abortCount(r: SimReplica): number {
  return r.metrics.simStats().client_aborts;
}

function successCount(r: SimReplica, reason: string): number {
  const line = r.metrics
    .render(r.engine.stats())
    .split('\n')
    .find((l) => l.startsWith('vllm:request_success_total{') && l.includes(`finished_reason="${reason}"`));
  return Number(line?.split(' ').at(-1));
}
