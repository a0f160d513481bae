// A replica started with vLLM's --api-key: the gateway sends the key named by api_key_env on every
// inference request and on its /v1/models fetch, and shows it nowhere.
import http from 'node:http';
import { afterEach, expect, it } from 'vitest';
import { listenLoopback } from '../helpers/http.ts';
import {
  chat,
  chatStreamText,
  get,
  MODEL,
  post,
  sseData,
  startTestGateway,
  type TestGateway,
} from './harness.ts';

const KEY = 'sk-replica-0123456789';
const VAR = 'SLAGATE_TEST_BACKEND_KEY';

let t: TestGateway | null = null;
const servers: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await t?.close();
  t = null;
  for (const s of servers.splice(0)) await s.close();
  delete process.env[VAR];
});

/** A replica that answers /v1 only with its key, as vLLM's --api-key does, and leaves /health and /metrics open. */
async function keyedReplica(seen: string[]) {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health' || req.url === '/metrics') {
        res.writeHead(200).end();
        return;
      }
      seen.push(`${req.method} ${req.url} ${req.headers.authorization ?? '-'}`);
      if (req.headers.authorization !== `Bearer ${KEY}`) {
        res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"Unauthorized"}');
        return;
      }
      if (req.method === 'GET' && req.url === '/v1/models') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ object: 'list', data: [{ id: MODEL, max_model_len: 777 }] }));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' }).end(chatStreamText(4));
    });
  });
  const s = await listenLoopback(server);
  servers.push(s);
  return s.url;
}

it('a backend with api_key_env gets its key as a bearer token on requests and model fetches; the key shows nowhere', async () => {
  // As a secret file mounted into the variable often has it: a trailing newline, trimmed.
  process.env[VAR] = `${KEY}\n`;
  const seen: string[] = [];
  const url = await keyedReplica(seen);
  t = await startTestGateway({ backends: [{ name: 'keyed', url, api_key_env: VAR }] });
  const res = await post(t.url, '/v1/chat/completions', chat({ stream: true }), {
    'x-request-id': 'with-key',
  });
  expect(res.status).toBe(200);
  expect(sseData(res.text).at(-1)).toBe('[DONE]');
  expect(seen).toContain(`POST /v1/chat/completions Bearer ${KEY}`);
  // The catalog asked with the key too: the replica's context length is known.
  const state = (await get(t.url, '/admin/state')).text;
  expect(JSON.parse(state)).toMatchObject({ models: [{ id: MODEL, max_model_len: 777 }] });
  expect(seen.filter((line) => !line.endsWith(`Bearer ${KEY}`))).toEqual([]);
  // Nowhere to be read: not in the state, the metrics or the admission log.
  expect(state).not.toContain(KEY);
  expect((await get(t.url, '/metrics')).text).not.toContain(KEY);
  expect(JSON.stringify(await t.records())).not.toContain(KEY);
});
