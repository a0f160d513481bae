// The benchmark client against a real HTTP server that scripts SSE byte by byte.
import type { ServerResponse } from 'node:http';
import { Agent } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type ClientContext, sendRequest } from '../../src/bench/client.ts';
import type { WorkloadRequest } from '../../src/bench/workloads.ts';
import { chat, type FakeServer, play, type Seen, sseHead, startServer } from './fake-server.ts';

const scripts: Record<string, (seen: Seen, res: ServerResponse) => Promise<void>> = {
  // Role chunk, then tokens spaced 60 ms; one token's event split across two writes 30 ms
  // apart; usage 120 ms after the last token.
  normal: (_s, res) => {
    sseHead(res, { 'x-slagate-backend': 'gpu-1', 'x-slagate-queue-ms': '3', 'x-other': 'no' });
    const split = chat.token('b');
    return play(res, [
      chat.role(),
      { wait: 60 },
      chat.token('a'),
      { wait: 60 },
      split.slice(0, 25),
      { wait: 30 },
      split.slice(25),
      { wait: 60 },
      chat.finish(),
      { wait: 120 },
      chat.usage(17, 3),
      chat.done,
    ]);
  },
  inband: (_s, res) => {
    sseHead(res);
    return play(res, [
      chat.role(),
      chat.token('a'),
      { wait: 20 },
      'data: {"error":{"message":"backend dropped","type":"upstream_error","param":null,"code":502}}\n\n',
      chat.done,
    ]);
  },
  http500: async (_s, res) => {
    res.writeHead(500, { 'content-type': 'application/json', 'x-slagate-backend': 'gpu-0' });
    res.end('{"error":{"message":"engine crashed","type":"internal_error","param":null,"code":500}}');
  },
  refused429: async (_s, res) => {
    res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '2' });
    res.end('{"error":{"message":"sla_unattainable","type":"rate_limit","param":null,"code":429}}');
  },
  // Two tokens after the role chunk, then the connection dies mid-stream (no [DONE], no last chunk).
  reset: async (_s, res) => {
    sseHead(res);
    res.write(chat.role());
    await new Promise((r) => setTimeout(r, 20));
    res.write(chat.token('a'));
    await new Promise((r) => setTimeout(r, 20));
    res.write(chat.token('b'));
    await new Promise((r) => setTimeout(r, 20));
    res.socket?.destroy();
  },
  nochoices: (_s, res) => {
    sseHead(res);
    return play(res, [chat.usage(10, 0), chat.done]);
  },
  // Completions chunks with CRLF line ends, a comment ping, no usage and no final blank line.
  completions: (_s, res) => {
    sseHead(res);
    const t = (x: string) =>
      `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"${x}"}]}`;
    return play(res, [
      ': ping\r\n\r\n',
      `${t('x')}\r\n\r`,
      { wait: 20 },
      `\n${t('y')}\r\n\r\n`,
      `${t('z')}\r\n\r\ndata: [DONE]`,
    ]);
  },
  // vLLM before 0.10: an in-band error as a flat object, then [DONE].
  flatError: (_s, res) => {
    sseHead(res);
    return play(res, [
      chat.role(),
      chat.token('a'),
      'data: {"object":"error","message":"engine died","type":"InternalServerError","param":null,"code":500}\n\n',
      chat.done,
    ]);
  },
  // Tokens, then the response ends cleanly without [DONE]: cut on its way.
  noDone: (_s, res) => {
    sseHead(res);
    return play(res, [chat.role(), chat.token('a'), chat.token('b')]);
  },
};

let server: FakeServer;
let dispatcher: Agent;

beforeAll(async () => {
  server = await startServer((seen, res) => {
    const script = scripts[String(seen.headers['x-script'])];
    if (!script) throw new Error('no script');
    return script(seen, res);
  });
  dispatcher = new Agent();
});

afterAll(async () => {
  await dispatcher.close();
  await server.close();
});

const t0 = performance.now();
function ctx(script: string, over: Partial<ClientContext> = {}): ClientContext {
  return {
    dispatcher,
    url: `${server.url}/v1/chat/completions`,
    endpoint: 'chat',
    model: 'm',
    ignoreEos: true,
    headers: { 'x-script': script },
    sendClassHint: false,
    sendSessionId: true,
    clock: () => (performance.now() - t0) / 1000,
    timeoutMs: 10_000,
    ...over,
  };
}

const REQ: WorkloadRequest = {
  index: 7,
  messages: [{ role: 'user', content: 'hello there' }],
  promptTokens: 2,
  outputTokens: 3,
  classHint: 'batch',
  sessionId: 's-1',
  tenant: 'tenant-0',
};

describe('sendRequest', () => {
  it('measures TTFT from the role chunk, one ITL per later choices chunk, usage for lengths', async () => {
    const before = performance.now();
    const r = await sendRequest(ctx('normal'), REQ, 0.25);
    const wall = (performance.now() - before) / 1000;
    expect(r.success).toBe(true);
    expect(r.error).toBe('');
    expect(r.status).toBe(200);
    expect(r.index).toBe(7);
    expect(r.queueTime).toBe(0.25);
    // TTFT is the role chunk (empty content): three choices chunks follow it (token a, token b
    // split in two writes, finish), so three gaps. Timing from the first token would give two.
    expect(r.itl).toHaveLength(3);
    for (const gap of r.itl) expect(gap).toBeGreaterThanOrEqual(0);
    // Latency ends at the last choices chunk: exactly TTFT plus the gaps. The usage chunk that
    // followed 120 ms later is not a choices event (it added no gap) and does not extend it.
    expect(r.latency).toBeCloseTo(r.ttft + r.itl.reduce((a, b) => a + b, 0), 9);
    // The finish chunk left the server 210 ms after the request arrived.
    expect(r.latency).toBeGreaterThanOrEqual(0.2);
    expect(wall).toBeGreaterThanOrEqual(r.latency);
    expect(r.outputLen).toBe(3);
    expect(r.promptLen).toBe(17);
    expect(r.headers).toEqual({ 'x-slagate-backend': 'gpu-1', 'x-slagate-queue-ms': '3' });
    expect(r.classHint).toBe('batch');
    expect(r.sessionId).toBe('s-1');
  });

  it('sends what vLLM sends: stream with usage, max_completion_tokens, ignore_eos, unique ids', async () => {
    const a = await sendRequest(ctx('normal'), REQ);
    const b = await sendRequest(ctx('normal', { sendClassHint: true }), REQ);
    const [sa, sb] = server.seen.slice(-2) as [Seen, Seen];
    expect(sa.url).toBe('/v1/chat/completions');
    expect(sa.body).toEqual({
      model: 'm',
      stream: true,
      stream_options: { include_usage: true },
      ignore_eos: true,
      messages: REQ.messages,
      max_completion_tokens: 3,
    });
    expect(sa.headers['x-request-id']).toBe(a.requestId);
    expect(sb.headers['x-request-id']).toBe(b.requestId);
    expect(a.requestId).not.toBe(b.requestId);
    expect(sa.headers['x-session-id']).toBe('s-1');
    expect(sa.headers['x-slagate-class']).toBeUndefined();
    expect(sb.headers['x-slagate-class']).toBe('batch');
  });

  it('explicit headers win over hints; hints can be turned off', async () => {
    await sendRequest(
      ctx('normal', {
        sendClassHint: true,
        sendSessionId: false,
        headers: { 'x-script': 'normal', 'X-Slagate-Class': 'interactive' },
      }),
      REQ,
    );
    const s = server.seen.at(-1) as Seen;
    expect(s.headers['x-slagate-class']).toBe('interactive');
    expect(s.headers['x-session-id']).toBeUndefined();
  });

  it('an in-band error event fails the request even after tokens', async () => {
    const r = await sendRequest(ctx('inband'), REQ);
    expect(r.success).toBe(false);
    expect(r.error).toContain('backend dropped');
    expect(r.ttft).toBeGreaterThan(0);
  });

  it("an old vLLM's flat in-band error fails the request too", async () => {
    const r = await sendRequest(ctx('flatError'), REQ);
    expect(r.success).toBe(false);
    expect(r.error).toBe('stream error: engine died');
  });

  it('a stream that ends without [DONE] was cut: a failure, its partial answer not a success', async () => {
    const r = await sendRequest(ctx('noDone'), REQ);
    expect(r.success).toBe(false);
    expect(r.error).toBe('stream ended without [DONE]');
    expect(r.ttft).toBeGreaterThan(0);
  });

  it('a stream cut by the network keeps what was measured: TTFT, gaps, and the latency to its last token', async () => {
    const r = await sendRequest(ctx('reset'), REQ);
    expect(r.success).toBe(false);
    expect(r.error).not.toBe('');
    expect(r.itl).toHaveLength(2);
    expect(r.ttft).toBeGreaterThan(0);
    // Latency ends at the last choices chunk seen, as for a whole stream: TTFT plus every gap.
    expect(r.latency).toBeCloseTo(r.ttft + r.itl[0]! + r.itl[1]!, 9);
  });

  it('a non-200 fails with the OpenAI error message and keeps the gateway headers', async () => {
    const r = await sendRequest(ctx('http500'), REQ);
    expect(r.success).toBe(false);
    expect(r.status).toBe(500);
    expect(r.error).toBe('HTTP 500: engine crashed');
    expect(r.headers['x-slagate-backend']).toBe('gpu-0');
    const q = await sendRequest(ctx('refused429'), REQ);
    expect(q.error).toBe('HTTP 429: sla_unattainable');
    expect(q.headers['retry-after']).toBe('2');
  });

  it('a stream without any choices chunk fails', async () => {
    const r = await sendRequest(ctx('nochoices'), REQ);
    expect(r.success).toBe(false);
    expect(r.error).toMatch(/no choices/);
  });

  it('completions: prompt and max_tokens, CRLF framing, comments, unterminated last event', async () => {
    const r = await sendRequest(
      ctx('completions', { url: `${server.url}/v1/completions`, endpoint: 'completions', ignoreEos: false }),
      { ...REQ, messages: [...REQ.messages, { role: 'user', content: 'more' }] },
    );
    const s = server.seen.at(-1) as Seen;
    expect(s.url).toBe('/v1/completions');
    expect(s.body).toMatchObject({ prompt: 'hello there\n\nmore', max_tokens: 3, stream: true });
    expect(s.body).not.toHaveProperty('ignore_eos');
    expect(s.body).not.toHaveProperty('max_completion_tokens');
    expect(r.success).toBe(true);
    // x, y, z: three choices chunks → two gaps; no usage → output = chunks with text.
    expect(r.itl).toHaveLength(2);
    expect(r.outputLen).toBe(3);
    expect(r.promptLen).toBe(2);
  });

  it('a refused connection is a failure, not a throw', async () => {
    const gone = await startServer(async () => {});
    const url = `${gone.url}/v1/chat/completions`;
    await gone.close();
    const r = await sendRequest(ctx('normal', { url }), REQ);
    expect(r.success).toBe(false);
    expect(r.status).toBeNull();
    expect(r.error).toMatch(/ECONNREFUSED|connect/i);
  });
});
