// The upstream body built from the client's bytes parses to the same object a re-serialisation
// would have produced, and the client's own bytes are kept (a re-serialised body would turn the
// `\u00e9` escape below into the character itself).
import { describe, expect, it } from 'vitest';
import { upstreamPayload } from '../../src/upstream/payload.ts';

const ESCAPED = '{"model":"m","messages":[{"role":"user","content":"caf\\u00e9"}]';

function spec(
  rawText: string | null,
  extra: {
    streamed?: boolean;
    priority?: number | null;
    model?: string | null;
    cacheSalt?: string | null;
  } = {},
) {
  const raw = rawText === null ? null : Buffer.from(rawText);
  const body = JSON.parse(rawText ?? '{"model":"m","messages":[]}') as Record<string, unknown>;
  // As the server stage reads it from the body.
  const so = body.stream_options as { include_usage?: unknown } | undefined;
  const clientWantsUsage = so?.include_usage === true;
  return {
    raw,
    body,
    streamed: extra.streamed ?? true,
    priority: extra.priority ?? null,
    clientWantsUsage,
    model: extra.model ?? null,
    cacheSalt: extra.cacheSalt ?? null,
  };
}

describe('upstreamPayload', () => {
  it('asks for a stream with usage, keeping the client bytes', () => {
    const s = spec(`${ESCAPED},"stream":false,"max_tokens":5}`);
    const out = upstreamPayload(s).toString();
    expect(JSON.parse(out)).toEqual({ ...s.body, stream: true, stream_options: { include_usage: true } });
    expect(out.startsWith(`${ESCAPED},"stream":false,"max_tokens":5,`)).toBe(true);
  });

  it("merges the client's stream_options and overrides its include_usage", () => {
    const s = spec(
      `${ESCAPED},"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true,"x":1}}`,
    );
    expect(JSON.parse(upstreamPayload(s).toString())).toMatchObject({
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true, x: 1 },
    });
  });

  it('keeps usage off the token chunks when the client asked for continuous usage without include_usage', () => {
    // vLLM sends usage on every chunk only when both are set; the forced include_usage must not
    // turn the client's lone continuous_usage_stats on.
    const s = spec(
      `${ESCAPED},"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`,
    );
    expect(JSON.parse(upstreamPayload(s).toString()).stream_options).toEqual({
      include_usage: true,
      continuous_usage_stats: false,
    });
  });

  it('adds the priority, and nothing else to a pass-through body', () => {
    const s = spec(`${ESCAPED},"stream":false}`, { streamed: false, priority: 3 });
    expect(JSON.parse(upstreamPayload(s).toString())).toEqual({ ...s.body, priority: 3 });
  });

  it('names the model the gateway gave a body that named none, over a null or empty one', () => {
    const noModel = '{"messages":[{"role":"user","content":"caf\\u00e9"}]';
    for (const raw of [`${noModel}}`, `${noModel},"model":null}`, `${noModel},"model":""}`]) {
      const s = spec(raw, { streamed: false, model: 'served' });
      const out = upstreamPayload(s).toString();
      expect(JSON.parse(out)).toEqual({ ...s.body, model: 'served' });
      expect(out.startsWith(noModel)).toBe(true);
    }
  });

  it("sends an isolated tenant's salt over the client's own, streamed or passed through, keeping the client bytes", () => {
    for (const streamed of [true, false]) {
      for (const raw of [`${ESCAPED}}`, `${ESCAPED},"cache_salt":"mine"}`]) {
        const s = spec(raw, { streamed, cacheSalt: 'tenant:mine' });
        const out = upstreamPayload(s).toString();
        expect(JSON.parse(out).cache_salt).toBe('tenant:mine');
        expect(out.startsWith(raw.slice(0, -1))).toBe(true);
      }
    }
  });

  it('sends a pass-through body without priority as received', () => {
    const s = spec(`${ESCAPED}}`, { streamed: false });
    expect(upstreamPayload(s)).toBe(s.raw);
  });

  it('accepts whitespace around the object', () => {
    const s = spec(` \n${ESCAPED} }\r\n\t`);
    const out = upstreamPayload(s).toString();
    expect(JSON.parse(out)).toEqual({ ...s.body, stream: true, stream_options: { include_usage: true } });
    expect(out).toContain('caf\\u00e9');
  });

  it('re-serialises what it cannot splice: no bytes', () => {
    const s = spec(null);
    const out = upstreamPayload(s).toString();
    expect(JSON.parse(out)).toEqual({ ...s.body, stream: true, stream_options: { include_usage: true } });
  });

  it('splices after a byte-order mark, which it drops: a 64-bit seed reaches the backend exact', () => {
    const text = '{"model":"m","prompt":"hi","seed":9007199254740993,"max_tokens":5}';
    const s = spec(text);
    s.raw = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(text)]);
    const out = upstreamPayload(s).toString();
    expect(out.startsWith('{"model":"m","prompt":"hi","seed":9007199254740993,')).toBe(true);
    expect(JSON.parse(out)).toMatchObject({ stream: true, stream_options: { include_usage: true } });
  });

  it('re-serialises bytes that are not UTF-8, which the backend could not parse', () => {
    // fastify decodes the Latin-1 é (0xe9) as U+FFFD; the backend gets what the gateway validated.
    const raw = Buffer.concat([
      Buffer.from('{"model":"m","messages":[{"role":"user","content":"caf'),
      Buffer.from([0xe9]),
      Buffer.from('"}]}'),
    ]);
    const body = JSON.parse(raw.toString('utf8')) as Record<string, unknown>;
    for (const streamed of [true, false]) {
      const out = upstreamPayload({
        raw,
        body,
        streamed,
        priority: null,
        clientWantsUsage: false,
        model: null,
        cacheSalt: null,
      });
      expect(out.includes(0xe9)).toBe(false);
      expect(JSON.parse(out.toString()).messages).toEqual(body.messages);
    }
  });

  it('gives an empty object no stray comma', () => {
    const s = spec('{ }', { priority: 1 });
    expect(JSON.parse(upstreamPayload(s).toString())).toEqual({
      priority: 1,
      stream: true,
      stream_options: { include_usage: true },
    });
  });
});
