// HTTP/1.1 pipelining at the front door: a request sent behind another on one connection waits
// for its turn, and one whose connection dies before its turn ends as a cancel, holding nothing.
import { afterEach, expect, it } from 'vitest';
import { chat, get, scripted, startTestGateway, type TestGateway, waitFor } from '../gateway/harness.ts';
import { rawConnection } from '../helpers/http.ts';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const role = (id: string) =>
  `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', model: 'm', choices: [{ index: 0, delta: { role: 'assistant', content: 'a' }, finish_reason: null }] })}\n\n`;

/** A gateway in front of `backend` (both closed after the test). */
async function gatewayIn(backend: { url: string; close: () => Promise<void> }): Promise<TestGateway> {
  cleanups.push(backend.close);
  const t = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }] });
  cleanups.push(() => t.close());
  return t;
}

const body = JSON.stringify(chat({ stream: true }));
/** A streamed chat request's bytes, whole. */
const request = (id: string) =>
  'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n' +
  `content-length: ${Buffer.byteLength(body)}\r\nx-request-id: ${id}\r\n\r\n${body}`;

it('a request pipelined behind a stream ends as a cancel when the connection dies before its turn, and holds nothing', async () => {
  // The backend starts every stream and holds it open.
  const backend = await scripted((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(role('chatcmpl-1'));
  });
  const t = await gatewayIn(backend);
  const conn = await rawConnection(t.url);
  conn.socket.write(request('first') + request('second'));
  await conn.until((text) => text.includes('data:'));
  conn.socket.destroy();
  const inFlight = async () =>
    (JSON.parse((await get(t.url, '/admin/state')).text) as { in_flight: number }).in_flight;
  await waitFor(async () => (await inFlight()) === 0, 3000, 'nothing left in flight');
  expect(await t.recordOf('first')).toMatchObject({ outcome: 'client_cancelled' });
  // Its turn never came: one record, a cancel before any decision, and never sent upstream.
  expect(await t.recordOf('second')).toMatchObject({ outcome: 'client_cancelled', decision: null });
  expect(backend.hits).toHaveLength(1);
});

it('a pipelined request is served in its turn, after the one before it', async () => {
  let n = 0;
  const backend = await scripted((_req, res) => {
    n++;
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(`${role(`chatcmpl-${n}`)}data: [DONE]\n\n`);
  });
  const t = await gatewayIn(backend);
  const conn = await rawConnection(t.url);
  conn.socket.write(request('one') + request('two'));
  const text = await conn.until((s) => (s.match(/\r\n0\r\n\r\n/g) ?? []).length >= 2);
  // Two answers, in order, each with its own id.
  expect(text.indexOf('x-request-id: one')).toBeGreaterThanOrEqual(0);
  expect(text.indexOf('x-request-id: two')).toBeGreaterThan(text.indexOf('x-request-id: one'));
  expect(await t.recordOf('one')).toMatchObject({ outcome: 'ok' });
  expect(await t.recordOf('two')).toMatchObject({ outcome: 'ok' });
  conn.socket.destroy();
});
