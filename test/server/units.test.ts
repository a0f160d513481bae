// The server's small pieces on their own: body facts, keys, the model catalog, the drain.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import type { Prediction } from '../../src/admission/index.ts';
import { GatewayError } from '../../src/errors/index.ts';
import type { BackendPrediction } from '../../src/scheduler/index.ts';
import { answerClientError } from '../../src/server/app.ts';
import { createAuthenticator } from '../../src/server/auth.ts';
import { SHARED_SALT, upstreamSalt } from '../../src/server/cache-salt.ts';
import { predictionFields } from '../../src/server/finish.ts';
import { parseInferenceRequest } from '../../src/server/inference-request.ts';
import { SESSION_ID_CHARS, sessionKey } from '../../src/server/intake.ts';
import { MAX_CONTAINERS, MAX_KEYS, parseJsonBody } from '../../src/server/json-body.ts';
import { ModelCatalog } from '../../src/server/model-catalog.ts';
import { Lifecycle } from '../../src/server/runtime.ts';
import { createMetrics } from '../../src/telemetry/metrics.ts';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    return e instanceof GatewayError ? `${e.code}:${e.param}` : 'not a GatewayError';
  }
  return undefined;
}

describe('parseInferenceRequest', () => {
  const msg = [{ role: 'user', content: 'hi' }];

  it('reads the facts the gateway decides on', () => {
    const ir = parseInferenceRequest('chat', {
      model: 'm',
      messages: [
        {
          role: 'system',
          content: [
            { type: 'text', text: 'be ' },
            { type: 'text', text: 'brief' },
          ],
        },
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: null },
      ],
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: 50,
      max_completion_tokens: 20,
    });
    expect(ir).toMatchObject({ model: 'm', stream: true, wantsUsage: true, maxTokens: 20 });
    expect(ir.promptParts).toEqual(['be \nbrief', 'hi', '']);
    const c = parseInferenceRequest('completions', { model: 'm', prompt: ['a', 'b'] });
    expect(c).toMatchObject({ stream: false, wantsUsage: false, maxTokens: null, promptParts: ['a', 'b'] });
    // vLLM's include_usage defaults to true once stream_options is sent.
    const usage = (so: unknown) =>
      parseInferenceRequest('completions', { prompt: 'a', stream: true, stream_options: so }).wantsUsage;
    expect(usage({})).toBe(true);
    expect(usage({ continuous_usage_stats: true })).toBe(true);
    expect(usage({ include_usage: false })).toBe(false);
    expect(usage({ include_usage: null })).toBe(false);
    expect(usage(null)).toBe(false);
    // Not a boolean: refused, never guessed at. vLLM's lax models read "true" as true; taken here
    // as not asking, the usage chunk the client asked for was withheld.
    const misread = (v: unknown) => () =>
      parseInferenceRequest('completions', {
        prompt: 'a',
        stream: true,
        stream_options: { include_usage: v },
      });
    for (const v of ['true', 'no', 0, 1])
      expect(codeOf(misread(v)), String(v)).toBe('invalid_request:stream_options');
    // Stream options on a request that does not stream: vLLM's 400 (an empty object passes).
    expect(
      codeOf(() => parseInferenceRequest('chat', { messages: [], stream_options: { include_usage: true } })),
    ).toBe('invalid_request:stream_options');
    expect(parseInferenceRequest('completions', { prompt: 'a', stream_options: {} }).wantsUsage).toBe(true);
    // vLLM's rule for cache_salt: a non-empty string, or null for none.
    for (const salt of ['', 5, ['s'], { s: 1 }, true])
      expect(
        codeOf(() => parseInferenceRequest('completions', { prompt: 'a', cache_salt: salt })),
        JSON.stringify(salt),
      ).toBe('invalid_request:cache_salt');
    for (const salt of ['s', null, undefined])
      expect(parseInferenceRequest('completions', { prompt: 'a', cache_salt: salt }).endpoint).toBe(
        'completions',
      );
    // A completions request has no max_completion_tokens in vLLM: it is ignored, as vLLM ignores it.
    const ignored = parseInferenceRequest('completions', {
      model: 'm',
      prompt: 'a',
      max_completion_tokens: 9,
    });
    expect(ignored.maxTokens).toBeNull();
    expect(
      parseInferenceRequest('completions', {
        model: 'm',
        prompt: 'a',
        max_tokens: 7,
        max_completion_tokens: 9,
      }).maxTokens,
    ).toBe(7);
    // max_tokens 0 only with echo (vLLM returns the prompt alone); otherwise it must be positive.
    expect(
      parseInferenceRequest('completions', { model: 'm', prompt: 'a', echo: true, max_tokens: 0 }).maxTokens,
    ).toBe(0);
    expect(
      codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: 'a', max_tokens: 0 })),
    ).toBe('invalid_request:max_tokens');
  });

  it('rejects what no backend could serve, naming the field', () => {
    expect(codeOf(() => parseInferenceRequest('chat', null))).toBe('invalid_request:body');
    expect(codeOf(() => parseInferenceRequest('chat', { model: 7, messages: msg }))).toBe(
      'invalid_request:model',
    );
    // Naming no model is not an error here: intake gives it the one served, as vLLM does.
    expect(parseInferenceRequest('chat', { messages: msg }).model).toBeNull();
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: [] }))).toBe(
      'invalid_request:messages',
    );
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: [{ content: 'x' }] }))).toBe(
      'invalid_request:messages',
    );
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: msg, stream: 'yes' }))).toBe(
      'invalid_request:stream',
    );
    // n > 1: assembled from a stream when not streamed; relayed as a stream when streamed.
    expect(parseInferenceRequest('chat', { model: 'm', messages: msg, n: 2 }).mode).toBe('assemble');
    expect(parseInferenceRequest('chat', { model: 'm', messages: msg, n: 2, stream: true }).mode).toBe(
      'stream',
    );
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: msg, n: 0 }))).toBe(
      'invalid_request:n',
    );
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: msg, n: 1.5 }))).toBe(
      'invalid_request:n',
    );
    // At most 4,096 content parts over all messages.
    const parts = (k: number) => Array.from({ length: k }, () => ({ type: 'text', text: 'x' }));
    const twoMessages = (k: number) => [
      { role: 'user', content: parts(k) },
      { role: 'user', content: parts(k) },
    ];
    expect(() => parseInferenceRequest('chat', { model: 'm', messages: twoMessages(2048) })).not.toThrow();
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: twoMessages(2049) }))).toBe(
      'invalid_request:messages',
    );
    // At most OpenAI's 128: 1e300 is an integer to JSON.
    expect(parseInferenceRequest('chat', { model: 'm', messages: msg, n: 128 }).mode).toBe('assemble');
    for (const n of [129, 1e300]) {
      expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: msg, n }))).toBe(
        'invalid_request:n',
      );
    }
    // A completion's prompts times n: at most 256 sequences, however they are made.
    const prompts = (k: number) => Array.from({ length: k }, (_, i) => `prompt ${i}`);
    expect(parseInferenceRequest('completions', { model: 'm', prompt: prompts(2), n: 128 }).sequences).toBe(
      256,
    );
    expect(parseInferenceRequest('completions', { model: 'm', prompt: prompts(256) }).sequences).toBe(256);
    expect(
      codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: prompts(3), n: 128 })),
    ).toBe('invalid_request:prompt');
    expect(codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: prompts(100_000) }))).toBe(
      'invalid_request:prompt',
    );
    const ids = Array.from({ length: 257 }, () => [1, 2, 3]);
    expect(codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: ids }))).toBe(
      'invalid_request:prompt',
    );
    expect(parseInferenceRequest('chat', { model: 'm', messages: msg, n: 3 }).sequences).toBe(3);
    expect(codeOf(() => parseInferenceRequest('chat', { model: 'm', messages: msg, max_tokens: 1.5 }))).toBe(
      'invalid_request:max_tokens',
    );
    expect(codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: [1.5, 2] }))).toBe(
      'invalid_request:prompt',
    );
    expect(codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: ['a', [1]] }))).toBe(
      'invalid_request:prompt',
    );
    // Embeddings in place of a prompt (vLLM's --enable-prompt-embeds): named as what is not
    // supported, not taken for a malformed prompt.
    expect(codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt_embeds: 'AAAA' }))).toBe(
      'invalid_request:prompt_embeds',
    );
  });
});

describe("parseInferenceRequest: whether vLLM reads its prefix cache (it does not when it computes the prompt's logprobs)", () => {
  const msg = [{ role: 'user', content: 'hi' }];
  const reads = (endpoint: 'chat' | 'completions', extra: Record<string, unknown>) =>
    parseInferenceRequest(endpoint, {
      model: 'm',
      ...(endpoint === 'chat' ? { messages: msg } : { prompt: 'hi' }),
      ...extra,
    }).readsPrefixCache;

  it('reads it for a plain request, and for logprobs of the output alone', () => {
    expect(reads('chat', {})).toBe(true);
    expect(reads('chat', { logprobs: true, top_logprobs: 3 })).toBe(true);
    expect(reads('completions', { logprobs: 2 })).toBe(true);
    expect(reads('chat', { prompt_logprobs: null })).toBe(true);
  });

  it('not with prompt_logprobs, nor on echo with a (top_)logprobs count: chat defaults it to 0, completions to none', () => {
    expect(reads('chat', { prompt_logprobs: 0 })).toBe(false);
    expect(reads('completions', { prompt_logprobs: 1 })).toBe(false);
    expect(reads('chat', { echo: true })).toBe(false);
    expect(reads('chat', { echo: true, top_logprobs: null })).toBe(true);
    expect(reads('completions', { echo: true })).toBe(true);
    expect(reads('completions', { echo: true, logprobs: 1, max_tokens: 0 })).toBe(false);
  });
});

describe('parseInferenceRequest: sampling parameters of the wrong type', () => {
  const msg = [{ role: 'user', content: 'hi' }];
  const chat = (extra: Record<string, unknown>) => () =>
    parseInferenceRequest('chat', { model: 'm', messages: msg, ...extra });

  it("are the gateway's own 400, naming the field and the type wanted", () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ temperature: 'hot' }, 'temperature'],
      [{ top_p: [0.9] }, 'top_p'],
      [{ top_k: 2.5 }, 'top_k'],
      [{ seed: '42' }, 'seed'],
      [{ truncate_prompt_tokens: '100' }, 'truncate_prompt_tokens'],
      [{ ignore_eos: 'yes' }, 'ignore_eos'],
      [{ stop: ['a', 3] }, 'stop'],
      [{ logprobs: 5 }, 'logprobs'],
    ];
    for (const [extra, field] of cases) expect(codeOf(chat(extra)), field).toBe(`invalid_request:${field}`);
    try {
      chat({ temperature: 'hot' })();
    } catch (e) {
      expect((e as Error).message).toBe("'temperature' must be a number");
    }
    // In completions, logprobs is a count.
    expect(
      codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: 'a', logprobs: true })),
    ).toBe('invalid_request:logprobs');
  });

  it('values of the right type pass, whatever their range: the engine judges those', () => {
    for (const extra of [
      { temperature: -1 },
      { temperature: 0, top_p: 1, top_k: -1, seed: 7, ignore_eos: true, stop: 'x' },
      { stop: ['a', 'b'], logprobs: true, top_logprobs: 3, temperature: null },
    ])
      expect(codeOf(chat(extra))).toBeUndefined();
    expect(
      codeOf(() => parseInferenceRequest('completions', { model: 'm', prompt: 'a', logprobs: 2 })),
    ).toBeUndefined();
  });
});

describe('sessionKey', () => {
  it('keeps a short id as it is and a long one as a short digest, the same for every request', () => {
    expect(sessionKey(undefined)).toBeUndefined();
    expect(sessionKey('conv-1')).toBe('conv-1');
    const atBound = 'x'.repeat(SESSION_ID_CHARS);
    expect(sessionKey(atBound)).toBe(atBound);
    const a = `${'a'.repeat(15_000)}1`;
    const b = `${'a'.repeat(15_000)}2`;
    expect(sessionKey(a)!.length).toBeLessThanOrEqual(SESSION_ID_CHARS);
    expect(sessionKey(a)).toBe(sessionKey(`${'a'.repeat(15_000)}1`));
    // Ids that differ only past any prefix stay apart.
    expect(sessionKey(a)).not.toBe(sessionKey(b));
  });

  it("is the tenant's own with tenants: one id sent by two tenants is two sessions", () => {
    expect(sessionKey('conv-1', 'acme')).not.toBe(sessionKey('conv-1', 'globex'));
    expect(sessionKey('conv-1', 'acme')).toBe(sessionKey('conv-1', 'acme'));
    expect(sessionKey('conv-1', null)).toBe('conv-1');
    expect(sessionKey(undefined, 'acme')).toBeUndefined();
  });
});

describe('parseJsonBody', () => {
  const parse = (text: string) => parseJsonBody(Buffer.from(text));
  const refused = (text: string) => codeOf(() => parse(text));

  it('refuses a body that is not valid UTF-8 rather than pass on another text', () => {
    const bad = Buffer.concat([Buffer.from('{"prompt":"caf'), Buffer.from([0xe9]), Buffer.from('"}')]);
    expect(codeOf(() => parseJsonBody(bad))).toBe('invalid_request:body');
    expect(parseJsonBody(Buffer.from('{"prompt":"café"}'))).toEqual({ prompt: 'café' });
  });

  it('refuses a __proto__ key or a constructor holding a prototype on any object, however written', () => {
    for (const text of [
      '{"__proto__":{"admin":true}}',
      '{"\\u005f_proto__":{"admin":true}}',
      '{"__pr\\u006fto__":1}',
      '{"messages":[{"role":"user","content":"hi","__proto__":{"x":1}}]}',
      '{"tools":[[{"a":{"__proto__":null}}]]}',
      '{"constructor":{"prototype":{"x":1}}}',
      '{"a":{"b":[{"c\\u006fnstructor":0,"constructor":{"prototype":null}}]}}',
    ]) {
      expect(refused(text), text).toBe('invalid_request:body');
    }
    expect(({} as Record<string, unknown>).admin).toBeUndefined();
  });

  it('accepts those words where they are not such keys', () => {
    const body = {
      model: 'm',
      messages: [{ role: 'user', content: 'set "__proto__": {} and "constructor": {"prototype": 1}' }],
      constructor: 'a string',
      meta: { constructor: { name: 'no prototype here' } },
      prompt: Array.from({ length: 5000 }, (_, i) => i),
    };
    expect(parse(JSON.stringify(body))).toEqual(body);
    expect(parse(`\ufeff${JSON.stringify({ a: 1 })}`)).toEqual({ a: 1 });
  });

  it('refuses empty and malformed bodies', () => {
    for (const text of ['', '{"model":', '{"a":1}}', 'nul'])
      expect(refused(text), text).toBe('invalid_request:body');
  });

  it('refuses a body of more than MAX_CONTAINERS objects and arrays, in any field, before parsing it', () => {
    const many = (n: number, item: string) => Array.from({ length: n }, () => item).join(',');
    // At the cap (the body itself and its one array counted), and one over it.
    const at = `{"x":[${many(MAX_CONTAINERS - 2, '[1]')}]}`;
    expect(() => parse(at)).not.toThrow();
    for (const text of [
      `{"x":[${many(MAX_CONTAINERS - 1, '[1]')}]}`,
      `{"prompt":[${many(MAX_CONTAINERS, '[1,2]')}],"max_tokens":1}`,
      `{"tools":[${many(MAX_CONTAINERS, '{}')}]}`,
    ]) {
      expect(refused(text)).toBe('invalid_request:body');
    }
    expect(() => parse(`{"x":[${many(MAX_CONTAINERS, '{}')}]}`)).toThrow(
      `Request body holds more than ${MAX_CONTAINERS} JSON objects and arrays.`,
    );
  });

  it('refuses a body of more than MAX_KEYS keys, though in one object', () => {
    const keys = (n: number) => Array.from({ length: n }, (_, i) => `"k${i}":0`).join(',');
    expect(() => parse(`{"logit_bias":{${keys(MAX_KEYS - 1)}}}`)).not.toThrow();
    expect(() => parse(`{"logit_bias":{${keys(MAX_KEYS)}}}`)).toThrow(
      `Request body holds more than ${MAX_KEYS} keys in its objects.`,
    );
    // The shortest bodies over the caps (a body too short to hold more is not counted).
    const shortest = (n: number, item: string) => Array.from({ length: n }, () => item).join(',');
    expect(refused(`{${shortest(MAX_KEYS + 1, '"":0')}}`)).toBe('invalid_request:body');
    expect(refused(`[${shortest(MAX_CONTAINERS, '[]')}]`)).toBe('invalid_request:body');
    const nested = `${'['.repeat(MAX_CONTAINERS + 1)}${']'.repeat(MAX_CONTAINERS + 1)}`;
    expect(() => parse(nested)).toThrow(
      `Request body holds more than ${MAX_CONTAINERS} JSON objects and arrays.`,
    );
  });

  it('counts only the brackets outside strings: a prompt of code full of them is no such body', () => {
    // Escaped quotes and backslashes inside the strings do not end them.
    const code = 'if (a[i]) { b["k\\"] = [{}]; } '.repeat(MAX_CONTAINERS);
    const body = {
      messages: [
        { role: 'user', content: code },
        // Written \"[[[…: the quote is escaped, the brackets are in the string.
        { role: 'user', content: `"${'['.repeat(2 * MAX_CONTAINERS)}` },
        { role: 'user', content: `"${'a: b, '.repeat(2 * MAX_KEYS)}` },
      ],
    };
    expect(parse(JSON.stringify(body))).toEqual(body);
  });
});

describe('createAuthenticator', () => {
  const sha = (k: string) => createHash('sha256').update(k).digest('hex');
  const classes = new Set(['interactive', 'batch']);

  it('open gateway: anonymous, any known class on request', () => {
    const auth = createAuthenticator([], 'interactive', classes);
    expect(auth.identify(undefined, 'batch')).toEqual({
      tenant: 'anonymous',
      class: 'batch',
      limits: null,
      cacheSalt: null,
    });
    expect(auth.identify('Bearer whatever', 'gold')).toEqual({
      tenant: 'anonymous',
      class: 'interactive',
      limits: null,
      cacheSalt: null,
    });
  });

  it('with tenants: the key picks the tenant; the class only within its allowed list', () => {
    const auth = createAuthenticator(
      [
        {
          name: 't',
          api_key_sha256: sha('k1').toUpperCase(),
          class: 'interactive',
          allowed_classes: ['interactive'],
          max_concurrency: 3,
        },
      ],
      'interactive',
      classes,
    );
    expect(auth.identify('bearer   k1 ', 'batch')).toEqual({
      tenant: 't',
      class: 'interactive',
      limits: { max_concurrency: 3, tokens_per_minute: undefined },
      cacheSalt: { prefix: 'shared', always: false },
    });
    expect(codeOf(() => auth.identify('Bearer k2', undefined))).toBe('invalid_api_key:null');
    expect(codeOf(() => auth.identify(undefined, undefined))).toBe('invalid_api_key:null');
  });

  it('gives each isolated tenant a salt of its own, from its name and key; the others share one namespace, isolated tenants or none', () => {
    const tenant = (name: string, key: string, isolate: boolean) => ({
      name,
      api_key_sha256: sha(key),
      class: 'interactive',
      allowed_classes: ['interactive'],
      isolate_prefix_cache: isolate,
    });
    const build = (aName: string, aKey: string) =>
      createAuthenticator(
        [tenant(aName, aKey, true), tenant('b', 'kb', true), tenant('c', 'kc', false)],
        'interactive',
        classes,
      );
    const auth = build('a', 'ka');
    const a = auth.identify('Bearer ka', undefined).cacheSalt;
    const b = auth.identify('Bearer kb', undefined).cacheSalt;
    expect(a).toMatchObject({ prefix: expect.stringMatching(/^[0-9a-f]{32}$/), always: true });
    expect(b).toMatchObject({ prefix: expect.stringMatching(/^[0-9a-f]{32}$/), always: true });
    expect(a!.prefix).not.toBe(b!.prefix);
    expect(auth.identify('Bearer kc', undefined).cacheSalt).toEqual({ prefix: 'shared', always: false });
    // Another instance with the same configuration sends the same salt; a new key or a new name, another.
    expect(build('a', 'ka').identify('Bearer ka', undefined).cacheSalt).toEqual(a);
    expect(build('a', 'ka2').identify('Bearer ka2', undefined).cacheSalt!.prefix).not.toBe(a!.prefix);
    expect(build('a2', 'ka').identify('Bearer ka', undefined).cacheSalt!.prefix).not.toBe(a!.prefix);
    // With no tenant isolated (any more), a shared tenant's salts are still under `shared:`: none
    // can name the salt a tenant had while it was isolated.
    const none = createAuthenticator([tenant('c', 'kc', false)], 'interactive', classes);
    expect(none.identify('Bearer kc', undefined).cacheSalt).toEqual({ prefix: 'shared', always: false });
    // An open gateway leaves every body's salt as it is.
    expect(
      createAuthenticator([], 'interactive', classes).identify(undefined, undefined).cacheSalt,
    ).toBeNull();
  });

  it('makes the upstream salt: the tenant part first; a shared tenant only when its client sent one', () => {
    const own = { prefix: '0123456789abcdef0123456789abcdef', always: true };
    expect(upstreamSalt(own, undefined)).toBe(own.prefix);
    expect(upstreamSalt(own, null)).toBe(own.prefix);
    expect(upstreamSalt(own, 'x')).toBe(`${own.prefix}:x`);
    expect(upstreamSalt(SHARED_SALT, undefined)).toBeNull();
    expect(upstreamSalt(SHARED_SALT, null)).toBeNull();
    // A shared tenant's client naming an isolated tenant's salt gets it only behind `shared:`.
    expect(upstreamSalt(SHARED_SALT, own.prefix)).toBe(`shared:${own.prefix}`);
    expect(upstreamSalt(null, 'x')).toBeNull();
  });

  it('among a thousand tenants each key finds its own, and a key hashed by none finds nobody', () => {
    const tenants = Array.from({ length: 1000 }, (_, i) => ({
      name: `t${i}`,
      api_key_sha256: sha(`key-${i}`),
      class: i % 2 === 0 ? 'interactive' : 'batch',
      allowed_classes: [],
    }));
    const auth = createAuthenticator(tenants, 'interactive', classes);
    for (const i of [0, 1, 499, 999]) {
      expect(auth.identify(`Bearer key-${i}`, undefined)).toMatchObject({
        tenant: `t${i}`,
        class: i % 2 === 0 ? 'interactive' : 'batch',
      });
    }
    // The digest itself is not a key.
    expect(codeOf(() => auth.identify(`Bearer ${sha('key-7')}`, undefined))).toBe('invalid_api_key:null');
    expect(codeOf(() => auth.identify('Bearer key-1000', undefined))).toBe('invalid_api_key:null');
  });
});

describe('ModelCatalog', () => {
  it('offers only configured names, with the smallest context length any backend reported', () => {
    const cat = new ModelCatalog(['a', 'b']);
    expect(cat.maxModelLen('a')).toBe(Number.POSITIVE_INFINITY);
    cat.learn({
      data: [
        { id: 'a', max_model_len: 8192 },
        { id: 'zzz', max_model_len: 10 },
      ],
    });
    cat.learn({ data: [{ id: 'a', max_model_len: 4096 }] });
    cat.learn({
      data: [
        { id: 'a', max_model_len: 16384 },
        { id: 'b', max_model_len: 'big' },
      ],
    });
    cat.learn('garbage');
    expect(cat.maxModelLen('a')).toBe(4096);
    expect(cat.has('zzz')).toBe(false);
    // A name it does not serve is listed by the backend (Backend.models) but its length not kept.
    expect(cat.learn({ data: [{ id: 'adapter-7', max_model_len: 10 }] })).toEqual(new Set(['adapter-7']));
    expect(cat.maxModelLen('adapter-7')).toBe(Number.POSITIVE_INFINITY);
    expect(cat.maxModelLen('zzz')).toBe(Number.POSITIVE_INFINITY);
    expect(cat.list().data.map((m) => [m.id, m.max_model_len])).toEqual([
      ['a', 4096],
      ['b', null],
    ]);
  });

  it('a refresh asked `again` while one runs runs once more after it: a backend that came up meanwhile is asked', async () => {
    // Answers after `release()`, with the models it listed when asked.
    let listed = ['old'];
    let release: () => void = () => {};
    const server = http.createServer(async (_req, res) => {
      const now = listed;
      await new Promise<void>((r) => {
        release = r;
      });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: now.map((id) => ({ id, max_model_len: 10 })) }));
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const { port } = server.address() as { port: number };
    try {
      const learnt: string[][] = [];
      const target = {
        url: `http://127.0.0.1:${port}`,
        learned: (m: ReadonlySet<string>) => learnt.push([...m]),
      };
      const cat = new ModelCatalog(['old', 'new']);
      const running = cat.refresh([target], 5_000);
      await new Promise<void>((r) => server.once('request', () => setImmediate(r)));
      // What it will list has changed since that refresh asked: joined, it would be missed.
      listed = ['new'];
      const again = cat.refresh([target], 5_000, { again: () => [target] });
      expect(cat.refresh([target], 5_000, { again: () => [target] })).toBe(again);
      release();
      await running;
      await new Promise<void>((r) => server.once('request', () => setImmediate(r)));
      release();
      await again;
      expect(learnt).toEqual([['old'], ['new']]);
    } finally {
      release();
      await new Promise((r) => server.close(r));
    }
  });

  it('a refresh takes the smallest of its own answers: the length grows back once the short backend is gone', async () => {
    const serve = async (len: number) => {
      const server = http.createServer((_req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ object: 'list', data: [{ id: 'a', max_model_len: len }] }));
      });
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      const { port } = server.address() as { port: number };
      return { url: `http://127.0.0.1:${port}`, close: () => new Promise((r) => server.close(r)) };
    };
    const short = await serve(4096);
    const long = await serve(32768);
    try {
      const cat = new ModelCatalog(['a']);
      await cat.refresh([{ url: short.url }, { url: long.url }]);
      expect(cat.maxModelLen('a')).toBe(4096);
      // The short-context backend left the fleet.
      await cat.refresh([{ url: long.url }]);
      expect(cat.maxModelLen('a')).toBe(32768);
      // Nobody answers: what was known stays.
      await long.close();
      await cat.refresh([{ url: long.url }], 200);
      expect(cat.maxModelLen('a')).toBe(32768);
    } finally {
      await short.close();
      await long.close().catch(() => {});
    }
  });

  it("an older backend list's refresh that ends last does not overwrite a newer one's answers", async () => {
    const servers: http.Server[] = [];
    const serve = async (len: number, delayMs: number) => {
      const server = http.createServer((_req, res) => {
        setTimeout(() => {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ data: [{ id: 'a', max_model_len: len }] }));
        }, delayMs);
      });
      servers.push(server);
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
    };
    try {
      const removed = await serve(1024, 300);
      const kept = await serve(8192, 0);
      const cat = new ModelCatalog(['a']);
      // The timer's refresh still asks the old list (a slow backend) when a reload asks the new one.
      const old = cat.refresh([{ url: removed }, { url: kept }]);
      const fresh = cat.refresh([{ url: kept }]);
      await fresh;
      expect(cat.maxModelLen('a')).toBe(8192);
      await old;
      expect(cat.maxModelLen('a')).toBe(8192);
    } finally {
      for (const s of servers) {
        s.closeAllConnections();
        s.close();
      }
    }
  });

  it('a refresh ends within its timeout when a backend trickles its answer or sends too much; one at a time', async () => {
    const sockets = new Set<import('node:net').Socket>();
    const listen = async (handler: http.RequestListener) => {
      const server = http.createServer(handler);
      server.on('connection', (s) => sockets.add(s));
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      const { port } = server.address() as { port: number };
      return { url: `http://127.0.0.1:${port}`, server };
    };
    const good = await listen((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ data: [{ id: 'a', max_model_len: 4096 }] }));
    });
    // One byte every 100 ms: no gap reaches a per-read timeout, and the body never ends.
    const trickle = await listen((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const timer = setInterval(() => res.write(' '), 100);
      res.on('close', () => clearInterval(timer));
    });
    // A body without end, sent as fast as the socket takes it.
    const flood = await listen((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"data":[');
      const more = (): void => {
        while (res.write(`${JSON.stringify({ id: 'a', max_model_len: 1 })},`.repeat(100)));
        res.once('drain', more);
      };
      more();
    });
    try {
      const cat = new ModelCatalog(['a']);
      const targets = [{ url: good.url }, { url: trickle.url }, { url: flood.url }];
      const refresh = cat.refresh(targets, 600);
      // A second call for the same backends while it runs shares it rather than start another;
      // one for another list (a reload's), or for new backends at the same URLs, runs on its own.
      expect(cat.refresh(targets, 600)).toBe(refresh);
      expect(cat.refresh([...targets], 600)).toBe(refresh);
      const other = cat.refresh([{ url: good.url }]);
      expect(other).not.toBe(refresh);
      const renewed = cat.refresh(
        targets.map((t) => ({ ...t })),
        600,
      );
      expect(renewed).not.toBe(refresh);
      await other;
      let timer: NodeJS.Timeout | undefined;
      const hung = new Promise<'hung'>((resolve) => {
        timer = setTimeout(() => resolve('hung'), 5_000);
      });
      expect(await Promise.race([refresh.then(() => 'done' as const), hung])).toBe('done');
      clearTimeout(timer);
      // The good answer counts; the flood's (over the size bound) does not.
      expect(cat.maxModelLen('a')).toBe(4096);
    } finally {
      for (const s of sockets) s.destroy();
      for (const { server } of [good, trickle, flood]) server.close();
    }
  });
});

describe('Lifecycle.drain', () => {
  it('resolves when the last request leaves', async () => {
    const lc = new Lifecycle();
    const a = lc.enter();
    const drained = lc.drain(10_000);
    setTimeout(() => lc.leave(a), 20);
    expect(await drained).toEqual({ cut: 0 });
    expect(a.aborted).toBe(false);
  });

  it('cuts what is left after the grace period', async () => {
    const lc = new Lifecycle();
    const a = lc.enter();
    const b = lc.enter();
    lc.leave(a);
    expect(await lc.drain(30)).toEqual({ cut: 1 });
    expect(b.aborted).toBe(true);
    expect(a.aborted).toBe(false);
  });
});

describe('answerClientError', () => {
  it('answers in the envelope and closes the connection, though the client keeps its side open', async () => {
    const logger = pino({ level: 'silent' });
    let serverSide: net.Socket | null = null;
    const server = net.createServer({ allowHalfOpen: true }, (socket) => {
      serverSide = socket;
      const err = Object.assign(new Error('Parse Error'), { code: 'HPE_INVALID_HEADER_TOKEN' });
      answerClientError({ logger, metrics: createMetrics({}, { processMetrics: false }) }, err, socket);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = net.connect({
      port: (server.address() as net.AddressInfo).port,
      host: '127.0.0.1',
      allowHalfOpen: true,
    });
    try {
      const reply: Buffer[] = [];
      client.on('data', (c: Buffer) => reply.push(c));
      await once(client, 'end');
      expect(Buffer.concat(reply).toString('utf8')).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
      // The client has not closed its side: only a close by the gateway ends the server's socket.
      const s = serverSide as net.Socket | null;
      expect(s).not.toBeNull();
      if (!s!.destroyed) await once(s!, 'close');
      expect(s!.destroyed).toBe(true);
    } finally {
      client.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});

describe('predictionFields', () => {
  const at = (backend: string, totalMs: number) =>
    ({ backend, totalMs, backendMs: totalMs, waitMs: 0 }) as unknown as BackendPrediction;
  const prediction = {
    byBackend: new Map([
      ['gpu-0', at('gpu-0', 100)],
      ['gpu-1', at('gpu-1', 150)],
    ]),
    waitMs: 0,
    best: at('gpu-0', 100),
    complete: true,
    unloadedMs: 90,
    largeForClass: false,
  } as Prediction;

  it('names the next-best backend beside the one that served', () => {
    expect(predictionFields(prediction, 'gpu-1')).toEqual({
      predicted_ttft_ms: 150,
      runner_up: 'gpu-0',
      runner_up_predicted_ttft_ms: 100,
    });
    expect(predictionFields(prediction, null)).toEqual({
      predicted_ttft_ms: 100,
      runner_up: 'gpu-1',
      runner_up_predicted_ttft_ms: 150,
    });
  });

  it('names no runner-up for a backend that served without a prediction', () => {
    // gpu-2 was unavailable at admission and recovered before the request left the queue.
    expect(predictionFields(prediction, 'gpu-2')).toEqual({
      predicted_ttft_ms: null,
      runner_up: null,
      runner_up_predicted_ttft_ms: null,
    });
  });
});
