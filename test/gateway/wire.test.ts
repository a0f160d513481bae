// The bytes of a streamed response as the client's socket receives them: the relay frames its own
// HTTP/1.1 chunks after the first write (src/upstream/chunked-writer.ts), so the framing, the
// keep-alive connection after it, and the HTTP/1.0 case (no chunks at all) are read here raw.
import net from 'node:net';
import { afterEach, expect, it } from 'vitest';
import {
  chat,
  chatStreamText,
  type Script,
  scripted,
  sseData,
  startTestGateway,
  waitFor,
} from './harness.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/**
 * A backend that sends a stream of `n` tokens: the role chunk alone, then the tokens in groups of
 * `group` events, each group in one write after a 5 ms pause, then usage and [DONE].
 */
function groupedStream(n: number, group: number): Script {
  return (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    const events = chatStreamText(n)
      .split('\n\n')
      .filter((e) => e !== '')
      .map((e) => `${e}\n\n`);
    const [role, ...rest] = events;
    res.write(role);
    const next = () => {
      if (rest.length === 0) {
        res.end();
        return;
      }
      res.write(rest.splice(0, group).join(''));
      setTimeout(next, 5);
    };
    setTimeout(next, 5);
  };
}

async function gatewayWith(script: Script) {
  const b = await scripted(script);
  cleanups.push(() => b.close());
  const t = await startTestGateway({ backends: [{ name: 'b0', url: b.url }] });
  cleanups.push(() => t.close());
  return t;
}

function requestBytes(version: '1.0' | '1.1', host: string, body: string): string {
  return (
    `POST /v1/chat/completions HTTP/${version}\r\nhost: ${host}\r\ncontent-type: application/json\r\n` +
    `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  );
}

interface Parsed {
  head: string;
  /** Each HTTP chunk's data, in order (empty for a body not sent in chunks). */
  chunks: string[];
  body: string;
  /** Bytes after the end of this response. */
  rest: Buffer;
}

/**
 * One HTTP/1.1 chunked response from the start of `buf`, parsed strictly (every size line, every
 * CRLF); null while incomplete. Throws on a framing error.
 */
function parseChunked(buf: Buffer): Parsed | null {
  const headEnd = buf.indexOf('\r\n\r\n');
  if (headEnd < 0) return null;
  const head = buf.subarray(0, headEnd).toString('latin1');
  expect(head.toLowerCase()).toContain('transfer-encoding: chunked');
  let at = headEnd + 4;
  const chunks: string[] = [];
  for (;;) {
    const lineEnd = buf.indexOf('\r\n', at);
    if (lineEnd < 0) return null;
    const sizeText = buf.subarray(at, lineEnd).toString('latin1');
    if (!/^[0-9a-f]+$/i.test(sizeText)) throw new Error(`bad chunk size line ${JSON.stringify(sizeText)}`);
    const size = Number.parseInt(sizeText, 16);
    const dataStart = lineEnd + 2;
    if (buf.length < dataStart + size + 2) return null;
    if (buf.subarray(dataStart + size, dataStart + size + 2).toString('latin1') !== '\r\n')
      throw new Error('chunk data not followed by CRLF');
    at = dataStart + size + 2;
    if (size === 0) break;
    chunks.push(buf.subarray(dataStart, dataStart + size).toString('utf8'));
  }
  return { head, chunks, body: chunks.join(''), rest: buf.subarray(at) };
}

it('a streamed response is well-framed chunks, events that arrive together share one, and the connection serves the next request', async () => {
  const t = await gatewayWith(groupedStream(12, 3));
  const { host } = new URL(t.url);
  const socket = net.connect(Number(new URL(t.url).port), '127.0.0.1');
  cleanups.push(async () => {
    socket.destroy();
  });
  let buf: Buffer = Buffer.alloc(0);
  let wake: (() => void) | null = null;
  socket.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    wake?.();
  });
  const response = async (): Promise<Parsed> => {
    for (;;) {
      const parsed = parseChunked(buf);
      if (parsed !== null) {
        buf = parsed.rest;
        return parsed;
      }
      await new Promise<void>((resolve) => {
        wake = resolve;
      });
    }
  };
  const body = JSON.stringify(chat({ stream: true, max_tokens: 12 }));

  for (const round of [1, 2]) {
    socket.write(requestBytes('1.1', host, body));
    const r = await response();
    expect(r.head, `round ${round}`).toMatch(/^HTTP\/1\.1 200/);
    const data = sseData(r.body);
    expect(data.at(-1)).toBe('[DONE]');
    // 12 tokens and the role chunk; the usage chunk the client did not ask for is dropped.
    expect(data.filter((d) => d.includes('"choices":[{'))).toHaveLength(13);
    expect(data.some((d) => d.includes('"usage"'))).toBe(false);
    // The backend wrote three token events at a time: after the head, they leave together.
    const perChunk = r.chunks.map((c) => sseData(c).length);
    expect(Math.max(...perChunk)).toBeGreaterThanOrEqual(3);
  }
  expect(buf.length).toBe(0);
});

it('an HTTP/1.0 client gets the stream unchunked, ended by the connection closing', async () => {
  const t = await gatewayWith(groupedStream(6, 2));
  const { host } = new URL(t.url);
  const socket = net.connect(Number(new URL(t.url).port), '127.0.0.1');
  const chunks: Buffer[] = [];
  socket.on('data', (d: Buffer) => chunks.push(d));
  const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
  socket.write(requestBytes('1.0', host, JSON.stringify(chat({ stream: true, max_tokens: 6 }))));
  await closed;
  const text = Buffer.concat(chunks).toString('utf8');
  const headEnd = text.indexOf('\r\n\r\n');
  const head = text.slice(0, headEnd).toLowerCase();
  expect(head).toMatch(/^http\/1\.1 200/);
  expect(head).not.toContain('transfer-encoding');
  const data = sseData(text.slice(headEnd + 4));
  expect(data.at(-1)).toBe('[DONE]');
  expect(data.filter((d) => d.includes('"choices":[{'))).toHaveLength(7);
});

it('a first event of megabytes (a long prompt echoed with its logprobs) is relayed whole', async () => {
  // vLLM sends the prompt's logprobs with the first chunk: 3 MiB of them here.
  const big = 'x'.repeat(3 * 1024 * 1024);
  const t = await gatewayWith((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    const [role, ...rest] = chatStreamText(2).split('\n\n');
    const first = JSON.parse(role!.slice('data: '.length)) as { choices: { delta: { content: string } }[] };
    first.choices[0]!.delta.content = big;
    res.end(`data: ${JSON.stringify(first)}\n\n${rest.join('\n\n')}`);
  });
  const res = await fetch(`${t.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(chat({ stream: true })),
  });
  expect(res.status).toBe(200);
  const events = sseData(await res.text());
  expect(events.at(-1)).toBe('[DONE]');
  expect(events[0]!.length).toBeGreaterThan(big.length);
});

it('a stream read at once (every token within a read of the first) keeps its TPOT in the record and teaches the backend nothing of its pace', async () => {
  let atOnce = true;
  const t = await gatewayWith((req, res, hit) => {
    if (atOnce) {
      // The whole stream in one piece, as a proxy that buffers it hands it on: one read, one
      // timestamp for every event at the gateway (events of one read that come one HTTP chunk
      // each are microseconds apart: test/upstream/measure.test.ts).
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      res.end(chatStreamText(4));
    } else groupedStream(4, 1)(req, res, hit);
  });
  const send = async (id: string) => {
    const res = await fetch(`${t.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': id },
      body: JSON.stringify(chat({ stream: true })),
    });
    expect(sseData(await res.text()).at(-1)).toBe('[DONE]');
    // The record is written as the response closes, which may follow the client's last read.
    await waitFor(async () => (await t.records()).some((r) => r.req_id === id), 2000, `${id}'s record`);
    return t.recordOf(id);
  };
  const tpot = () => {
    t.gw.runtime.afterwork.settle();
    return t.gw.runtime.live.backendView('b0')!.latency;
  };
  const atOnceRecord = await send('at-once');
  expect(atOnceRecord).toMatchObject({ outcome: 'ok' });
  expect(atOnceRecord.tpot_ms).toBeLessThan(1);
  expect(tpot()).toMatchObject({ requests: 1, tpot: { p50: null } });
  // Tokens 5 ms apart: their pace is learnt.
  atOnce = false;
  expect((await send('paced')).tpot_ms).toBeGreaterThan(1);
  const seen = tpot();
  expect(seen.requests).toBe(2);
  expect(seen.tpot.p50).toBeGreaterThan(1);
});
