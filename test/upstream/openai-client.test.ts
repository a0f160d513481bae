// The real openai client against a gateway using the relay: a stream it can read, usage when it
// asks, an error it raises after the commit point, and a typed error before it.
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import {
  frame,
  gateway,
  healthy,
  makeSet,
  roleChunk,
  type Script,
  sseHead,
  tokenChunk,
  upstream,
} from './helpers.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function client(script: Script): Promise<OpenAI> {
  const up = await upstream(script);
  const set = makeSet([up.url]);
  const gw = await gateway({ set });
  cleanups.push(up.close, () => set.close(), gw.close);
  return new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'k', maxRetries: 0 });
}

describe('openai client through the relay', () => {
  it('reads the stream and the usage chunk it asked for', async () => {
    const openai = await client(healthy(3));
    const stream = await openai.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe('t0t1t2');
    expect(usage).toMatchObject({ prompt_tokens: 7, completion_tokens: 3 });
  });

  it('raises the error event sent after the commit point', async () => {
    const openai = await client((_req, res) => {
      sseHead(res);
      res.end(
        roleChunk() + tokenChunk('a') + frame({ error: { message: 'x', code: 500 } }) + 'data: [DONE]\n\n',
      );
    });
    const stream = await openai.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      stream: true,
    });
    const seen: string[] = [];
    await expect(
      (async () => {
        for await (const chunk of stream) seen.push(chunk.choices[0]?.delta.content ?? '');
      })(),
    ).rejects.toThrow(/during the stream/);
    expect(seen).toEqual(['', 'a']);
  });

  it('gets a typed 502 when every attempt failed before the commit point', async () => {
    const openai = await client((req) => {
      req.socket.destroy();
    });
    const err = await openai.chat.completions
      .create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('upstream_error');
  });
});
