// Bodies the front door answers before reading them: the client reads the answer rather than a
// reset, and no body trickling in after an answer holds its connection.
import { once } from 'node:events';
import { afterEach, expect, it } from 'vitest';
import { scripted, startTestGateway, type TestGateway } from '../gateway/harness.ts';
import { rawConnection } from '../helpers/http.ts';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function gateway(config: Record<string, unknown> = {}): Promise<TestGateway> {
  const backend = await scripted((_req, res) => res.writeHead(500).end());
  cleanups.push(backend.close);
  const t = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }], config });
  cleanups.push(() => t.close());
  return t;
}

it('a body refused for its media type is let in and dropped: the answer is read, the connection kept', async () => {
  const t = await gateway();
  const body = 'x'.repeat(200_000);
  const conn = await rawConnection(t.url);
  conn.socket.write(
    'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\n' +
      `content-length: ${body.length}\r\nx-request-id: plain\r\n\r\n${body.slice(0, 1000)}`,
  );
  await conn.until((text) => text.includes('\r\n\r\n{'));
  expect(conn.received()).toMatch(/^HTTP\/1\.1 400 /);
  expect(conn.received()).not.toMatch(/connection: close/i);
  // The rest of the body, then another request on the same connection: answered.
  conn.socket.write(body.slice(1000));
  conn.socket.write('GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n');
  await conn.until((text) => text.includes('"alive"'));
  expect((await t.recordOf('plain')).reason).toBe('invalid_request');
  conn.socket.destroy();
});

it('a body still trickling in after fastify answered without it is cut at the request deadline', async () => {
  const t = await gateway({ upstream: { first_token_timeout_ms: 300 } });
  const conn = await rawConnection(t.url);
  // A method the inference route does not take: 405 at once, the chunked body never read.
  conn.socket.write(
    'PUT /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n',
  );
  await conn.until((text) => text.includes('\r\n\r\n{'));
  expect(conn.received()).toMatch(/^HTTP\/1\.1 405 /);
  // One more byte now and then would hold the connection for good; the deadline ends it.
  const trickle = setInterval(() => conn.socket.write('1\r\nx\r\n'), 50);
  cleanups.push(() => clearInterval(trickle));
  await once(conn.socket, 'close');
});

it('an HTTP/1.1 request without Host is answered 400 in the envelope, with its id and its record', async () => {
  const t = await gateway();
  const conn = await rawConnection(t.url);
  conn.socket.write(
    'POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\n' +
      'x-request-id: nohost\r\n\r\n{}',
  );
  await once(conn.socket, 'close');
  const text = conn.received();
  expect(text).toMatch(/^HTTP\/1\.1 400 /);
  expect(text).toMatch(/x-request-id: nohost/i);
  expect(JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4))).toMatchObject({
    error: { code: 'invalid_request', param: 'host' },
  });
  expect(await t.recordOf('nohost')).toMatchObject({ outcome: 'refused', reason: 'invalid_request' });
});
