// How long the gateway keeps a request's parsed body (server/inference.ts): until its upstream
// payload is made, not for the life of its stream. A long prompt's text that outlives the send is
// copied by every young-generation collection while the stream runs.
import { randomUUID } from 'node:crypto';
import v8 from 'node:v8';
import vm from 'node:vm';
import { afterEach, expect, it } from 'vitest';
import { chat, heldStream, openStream, startTestGateway, type TestGateway } from './harness.ts';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

it("a request's parsed body can be collected while its stream is still open", async () => {
  // The backend sends the role chunk and one token, then holds the stream open until released.
  const b = await heldStream(3, 2);
  cleanups.push(() => b.close());
  const t: TestGateway = await startTestGateway({ backends: [{ name: 'b0', url: b.url }] });
  cleanups.push(() => t.close());

  // The gateway's own parse of the client's body is watched: the first JSON.parse of a text that
  // holds the marker and is not the upstream payload (which asks for usage: stream_options).
  const marker = `body-lifetime-${randomUUID()}`;
  const collected = new Set<string>();
  const registry = new FinalizationRegistry<string>((m) => collected.add(m));
  const parse = JSON.parse;
  let watched = false;
  JSON.parse = (text: string, reviver?: Parameters<typeof parse>[1]) => {
    const value = parse(text, reviver);
    if (!watched && typeof text === 'string' && text.includes(marker) && !text.includes('stream_options')) {
      watched = true;
      // The body, its messages and each message (which holds the prompt's text).
      registry.register(value as object, 'body');
      const messages = (value as { messages: object[] }).messages;
      registry.register(messages, 'messages');
      for (const m of messages) registry.register(m, 'message');
    }
    return value;
  };
  cleanups.push(() => {
    JSON.parse = parse;
  });
  const prompt = `${marker} ${'a long system prompt '.repeat(1500)}`;
  const s = openStream(
    t.url,
    '/v1/chat/completions',
    chat({ stream: true, messages: [{ role: 'user', content: prompt }] }),
  );
  const res = await s.response;
  expect(res.status).toBe(200);
  await res.until((text) => text.includes(' t0'));
  JSON.parse = parse;
  expect(watched).toBe(true);

  // The stream is open (the backend holds it): the body is unreachable all the same. A finalizer
  // runs in a task after the collection that found its object gone.
  const all = () => ['body', 'messages', 'message'].every((k) => collected.has(k));
  for (let i = 0; i < 10 && !all(); i++) {
    gc();
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
  expect(res.received()).not.toContain('[DONE]');
  expect([...collected].sort()).toEqual(['body', 'message', 'messages']);

  b.release();
  await res.until((text) => text.includes('[DONE]'));
});
