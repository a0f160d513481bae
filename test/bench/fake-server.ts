// A real node:http server on 127.0.0.1 whose responses are scripted step by step (raw writes
// and pauses), so tests control exactly how SSE bytes are split and spaced in time.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { monotonicMs } from '../../src/bench/run.ts';
import { listenLoopback } from '../helpers/http.ts';

export type Step = string | { wait: number };

export interface Seen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: Record<string, unknown> | null;
  /** Requests in flight when this one arrived (itself included). */
  inflight: number;
  /** ms since the server started. */
  at: number;
  /** When it arrived on the system's monotonic clock, ms (process.hrtime). */
  monotonicMs: number;
}

export type Handler = (seen: Seen, res: ServerResponse) => Promise<void>;

export interface FakeServer {
  url: string;
  seen: Seen[];
  maxInflight: number;
  close(): Promise<void>;
}

export function sseHead(res: ServerResponse, extra: Record<string, string> = {}): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', ...extra });
  res.flushHeaders();
}

export async function play(res: ServerResponse, steps: readonly Step[]): Promise<void> {
  for (const step of steps) {
    if (typeof step === 'string') res.write(step);
    else await new Promise((r) => setTimeout(r, step.wait));
  }
  res.end();
}

export async function startServer(handler: Handler): Promise<FakeServer> {
  const started = performance.now();
  let inflight = 0;
  const state = { seen: [] as Seen[], maxInflight: 0 };
  const server: Server = createServer(async (req, res) => {
    inflight++;
    state.maxInflight = Math.max(state.maxInflight, inflight);
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const text = Buffer.concat(chunks).toString('utf8');
    const seen: Seen = {
      method: req.method ?? '',
      url: req.url ?? '',
      headers: req.headers,
      body: text ? (JSON.parse(text) as Record<string, unknown>) : null,
      inflight,
      at: performance.now() - started,
      monotonicMs: monotonicMs(),
    };
    state.seen.push(seen);
    try {
      await handler(seen, res);
    } finally {
      inflight--;
    }
  });
  const { url, close } = await listenLoopback(server);
  return {
    url,
    get seen() {
      return state.seen;
    },
    get maxInflight() {
      return state.maxInflight;
    },
    close,
  };
}

/** vLLM-shaped chat chunks. */
export const chat = {
  role: (id = 'c1') =>
    `data: {"id":"${id}","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n`,
  token: (text: string, id = 'c1') =>
    `data: {"id":"${id}","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":${JSON.stringify(text)}},"finish_reason":null}]}\n\n`,
  finish: (id = 'c1') =>
    `data: {"id":"${id}","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":""},"finish_reason":"length"}]}\n\n`,
  usage: (prompt: number, completion: number, id = 'c1') =>
    `data: {"id":"${id}","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":${prompt},"completion_tokens":${completion},"total_tokens":${prompt + completion}}}\n\n`,
  done: 'data: [DONE]\n\n',
};

/** A plausible answer for any chat request: role chunk, `n` tokens `gap` ms apart, usage. */
export async function answer(seen: Seen, res: ServerResponse, n: number, gap: number): Promise<void> {
  sseHead(res, { 'x-slagate-backend': 'sim-0' });
  const steps: Step[] = [chat.role()];
  for (let i = 0; i < n; i++) steps.push({ wait: gap }, chat.token(`t${i}`));
  const prompt = Array.isArray(seen.body?.messages) ? 42 : 41;
  steps.push(chat.usage(prompt, n), chat.done);
  await play(res, steps);
}
