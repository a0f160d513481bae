import { spawn } from 'node:child_process';
import { once } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import { asksForUsage } from '../../src/server/inference-request.ts';
import type { Backend } from '../../src/upstream/backend.ts';
import { BackendSet, type BackendSetOptions } from '../../src/upstream/backends.ts';
import { Cancel } from '../../src/upstream/cancel.ts';
import { DEFAULT_BACKEND_SET_OPTIONS, DEFAULT_RETRY_BUDGET } from '../../src/upstream/options.ts';
import { upstreamPayload } from '../../src/upstream/payload.ts';
import { type ProxyConfig, type ProxyResult, proxyRequest } from '../../src/upstream/proxy.ts';
import type { ClientMode } from '../../src/upstream/relay.ts';
import { RetryBudget } from '../../src/upstream/retry-budget.ts';
import type { AcquireSlot, Slot } from '../../src/upstream/slot.ts';
import { listenLoopback, send } from '../helpers/http.ts';

export interface Hit {
  index: number;
  headers: http.IncomingHttpHeaders;
  body: Record<string, unknown>;
  /** performance.now() when the upstream saw the request's socket close (null while open). */
  closedAt: number | null;
  /** Settles with closedAt when the upstream sees the request's socket close. */
  closed: Promise<number>;
  /** Bytes the script managed to hand to the socket. */
  bytesWritten: number;
}

export type Script = (req: http.IncomingMessage, res: http.ServerResponse, hit: Hit) => void | Promise<void>;

export interface Upstream {
  url: string;
  hits: Hit[];
  /** Resolves with the `index`-th request (from 0) once the upstream has it. */
  arrived(index: number): Promise<Hit>;
  close(): Promise<void>;
}

/** A backend whose n-th request plays scripts[n] (the last script repeats). */
export async function upstream(...scripts: Script[]): Promise<Upstream> {
  const hits: Hit[] = [];
  const waiting: { index: number; resolve: (hit: Hit) => void }[] = [];
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks).toString('utf8');
    let closed!: (at: number) => void;
    const hit: Hit = {
      index: hits.length,
      headers: req.headers,
      body: raw ? (JSON.parse(raw) as Record<string, unknown>) : {},
      closedAt: null,
      closed: new Promise<number>((resolve) => {
        closed = resolve;
      }),
      bytesWritten: 0,
    };
    hits.push(hit);
    for (const w of waiting.filter((x) => x.index === hit.index)) w.resolve(hit);
    res.on('close', () => {
      hit.closedAt = performance.now();
      closed(hit.closedAt);
    });
    const script = scripts[Math.min(hit.index, scripts.length - 1)]!;
    try {
      await script(req, res, hit);
    } catch {
      res.destroy();
    }
  });
  server.keepAliveTimeout = 5_000;
  const arrived = (index: number): Promise<Hit> => {
    const hit = hits[index];
    if (hit !== undefined) return Promise.resolve(hit);
    return new Promise((resolve) => waiting.push({ index, resolve }));
  };
  return { ...(await listenLoopback(server)), hits, arrived };
}

/**
 * When the upstream saw the hit's socket close, or null if it is still open after `withinMs` (the
 * bound only keeps a failing test from hanging; the caller asserts how soon the close came).
 */
export async function closedWithin(hit: Hit, withinMs = 2_000): Promise<number | null> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), withinMs);
  });
  try {
    return await Promise.race([hit.closed, expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** A port with nothing listening (connection refused). */
/**
 * A URL every connection to is refused, a different one each call. Invariant: nothing listens
 * there while the suite runs: a privileged port below 20 (no test or service here takes one; a
 * port freed by a server of this process could be taken again by another test file's server,
 * running in parallel, and then answer).
 */
let deadPort = 0;
export async function deadUrl(): Promise<string> {
  deadPort = (deadPort % 19) + 1;
  return `http://127.0.0.1:${deadPort}`;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * A URL where a connection is never completed: a host gone dark that drops every SYN. A socket
 * listening with a backlog of one that nobody accepts from (Node accepts every connection itself,
 * so a python3 process holds it), its queue filled by one connection of ours: Linux drops the
 * SYNs of every later one, which then waits for its connect timeout. Needs python3 on Linux (the
 * README's test requirements). `cleanups` gets the process's stop before anything can throw.
 */
export async function blackholeUrl(cleanups: (() => Promise<void>)[]): Promise<string> {
  const child = spawn(
    'python3',
    [
      '-c',
      'import socket, sys\ns = socket.socket()\ns.bind(("127.0.0.1", 0))\ns.listen(0)\nprint(s.getsockname()[1], flush=True)\nsys.stdin.read()',
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const exited = once(child, 'exit');
  let filler: net.Socket | null = null;
  cleanups.push(async () => {
    filler?.destroy();
    if (child.exitCode === null && child.signalCode === null) {
      child.stdin!.end();
      await exited;
    }
  });
  // once() rejects on the child's 'error' (python3 missing), so the test fails with it.
  const [line] = (await once(child.stdout!, 'data')) as [Buffer];
  const port = Number(line.toString().trim());
  filler = net.connect(port, '127.0.0.1');
  await once(filler, 'connect');
  return `http://127.0.0.1:${port}`;
}

// ---- vLLM-shaped SSE ----

export function frame(obj: unknown): string {
  return `data: ${JSON.stringify(obj)}\n\n`;
}

export const DONE = 'data: [DONE]\n\n';

export function roleChunk(): string {
  return frame({
    id: 'chatcmpl-1',
    object: 'chat.completion.chunk',
    model: 'm',
    choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
  });
}

export function tokenChunk(text: string, finish: string | null = null): string {
  return frame({
    id: 'chatcmpl-1',
    object: 'chat.completion.chunk',
    model: 'm',
    choices: [{ index: 0, delta: { content: text }, logprobs: null, finish_reason: finish }],
  });
}

export function usageChunk(prompt: number, completion: number): string {
  return frame({
    id: 'chatcmpl-1',
    object: 'chat.completion.chunk',
    model: 'm',
    choices: [],
    usage: { prompt_tokens: prompt, total_tokens: prompt + completion, completion_tokens: completion },
  });
}

/** A whole healthy chat stream of `n` tokens, as vLLM sends it when usage is asked for. */
export function chatStream(n: number, prompt = 7): string[] {
  const out = [roleChunk()];
  for (let i = 0; i < n; i++) out.push(tokenChunk(`t${i}`, i === n - 1 ? 'stop' : null));
  out.push(usageChunk(prompt, n), DONE);
  return out;
}

export function sseHead(res: http.ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
  res.flushHeaders();
}

/** Script: a healthy stream, each frame `gapMs` apart. */
export function healthy(n = 3, gapMs = 0): Script {
  return async (_req, res, hit) => {
    sseHead(res);
    for (const f of chatStream(n)) {
      if (gapMs > 0) await sleep(gapMs);
      res.write(f);
      hit.bytesWritten += f.length;
    }
    res.end();
  };
}

export const status =
  (
    code: number,
    body = '{"error":{"message":"boom secret-trace","type":"InternalServerError","code":500}}',
  ): Script =>
  (_req, res) => {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(body);
  };

export const destroy: Script = (req) => {
  req.socket.destroy();
};

/** Headers sent, then nothing (or only keep-alive comments every `commentMs`). */
export function hang(commentMs = 0): Script {
  return (_req, res) => {
    sseHead(res);
    if (commentMs > 0) {
      const t = setInterval(() => res.write(': keep-alive\n\n'), commentMs);
      res.on('close', () => clearInterval(t));
    }
  };
}

// ---- gateway under test ----

export const FAST: ProxyConfig = {
  firstTokenTimeoutMs: 400,
  passthroughTimeoutMs: 400,
  idleTimeoutMs: 400,
  clientStallTimeoutMs: 400,
  retries: 2,
  maxEventBytes: 64 * 1024,
  maxBodyBytes: 1024 * 1024,
};

export function setOptions(over: Partial<BackendSetOptions> = {}): BackendSetOptions {
  return {
    ...DEFAULT_BACKEND_SET_OPTIONS,
    pool: { connections: 16, connectTimeoutMs: 500, keepAliveTimeoutMs: 2_000 },
    health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: 0 },
    ...over,
  };
}

/** A slot on `b` with no queue and no limit: the upstream layer's contract, nothing more. */
export function slotOn(b: Backend, firstTokenTimeoutMs = Number.POSITIVE_INFINITY): Slot {
  return {
    backend: b,
    predictedTtftMs: null,
    prefixHit: null,
    firstTokenTimeoutMs,
    meter: null,
    prefillDone() {},
    expectNoFirstToken() {},
    release() {},
  };
}

/** The scheduler stand-in: available backends in list order, skipping excluded ones. */
export function inOrder(set: BackendSet): AcquireSlot {
  return async ({ excluded }) => {
    const b = set.list().find((x) => x.available && !excluded.has(x.name));
    return b === undefined ? null : slotOn(b);
  };
}

export interface GatewayOpts {
  set: BackendSet;
  cfg?: ProxyConfig;
  acquire?: AcquireSlot;
  deadlineMs?: number;
  /** How a non-streamed request is answered (streamed ones are always 'stream'); default passthrough. */
  nonStreamMode?: Exclude<ClientMode, 'stream'>;
  responseHeaders?: http.OutgoingHttpHeaders;
  /**
   * A shutdown switch: aborting it aborts every request's own ProxyRequest.signal with its reason,
   * as the gateway's Lifecycle does.
   */
  signal?: Cancel;
}

export interface Gateway {
  url: string;
  /** Results in completion order. */
  results: ProxyResult[];
  budget: RetryBudget;
  /** Requests inside proxyRequest now. */
  active(): number;
  /** Resolves with the next result not yet taken. */
  nextResult(): Promise<ProxyResult>;
  close(): Promise<void>;
}

/** A node:http gateway: reads the body like fastify would, then hands `res` to proxyRequest. */
export async function gateway(opts: GatewayOpts): Promise<Gateway> {
  const results: ProxyResult[] = [];
  const waiters: ((r: ProxyResult) => void)[] = [];
  let taken = 0;
  let active = 0;
  const budget = new RetryBudget(DEFAULT_RETRY_BUDGET, () => active);
  const server = http.createServer(async (req, res) => {
    const startedAt = performance.now();
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const rawBody = Buffer.concat(chunks);
    const body = JSON.parse(rawBody.toString('utf8')) as Record<string, unknown>;
    const so = body.stream_options as { include_usage?: boolean } | undefined;
    const path = (req.url ?? '/v1/chat/completions') as '/v1/chat/completions' | '/v1/completions';
    active++;
    const signal = new Cancel();
    const shutdown = opts.signal;
    const onCut = (): void => signal.abort(shutdown?.reason);
    if (shutdown?.aborted) onCut();
    else shutdown?.onAbort(onCut);
    const mode = body.stream === true ? 'stream' : (opts.nonStreamMode ?? 'passthrough');
    const clientWantsUsage = asksForUsage(so);
    let result: ProxyResult;
    try {
      result = await proxyRequest(
        {
          res,
          payload: upstreamPayload({
            raw: rawBody,
            body,
            streamed: mode !== 'passthrough',
            priority: null,
            clientWantsUsage,
            model: null,
            cacheSalt: null,
          }),
          bodyFields: Object.keys(body),
          path,
          mode,
          assembleKind: path === '/v1/completions' ? 'completion' : 'chat',
          clientWantsUsage,
          // As intake counts them: n, times the prompts of a completion.
          sequences:
            (Array.isArray(body.prompt) && typeof body.prompt[0] !== 'number' ? body.prompt.length : 1) *
            (typeof body.n === 'number' ? body.n : 1),
          requestId: String(req.headers['x-request-id'] ?? 'req-1'),
          responseHeaders: opts.responseHeaders ?? { 'x-request-id': 'req-1' },
          startedAt,
          deadlineAt: startedAt + (opts.deadlineMs ?? 60_000),
          signal,
          acquire: opts.acquire ?? inOrder(opts.set),
        },
        opts.cfg ?? FAST,
        budget,
      );
    } finally {
      active--;
      shutdown?.offAbort(onCut);
    }
    results.push(result);
    waiters.shift()?.(result);
  });
  const { url, close } = await listenLoopback(server);
  return {
    url,
    results,
    budget,
    active: () => active,
    nextResult: () => {
      const i = taken++;
      if (i < results.length) return Promise.resolve(results[i]!);
      return new Promise((resolve) => waiters.push(resolve));
    },
    close,
  };
}

export interface ClientResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
}

/** A real client request through the gateway; reads the whole response. */
export function post(
  url: string,
  body: Record<string, unknown>,
  headers: http.OutgoingHttpHeaders = {},
  path = '/v1/chat/completions',
): Promise<ClientResponse> {
  return send(url, 'POST', path, body, headers);
}

export const chatBody = (extra: Record<string, unknown> = {}) => ({
  model: 'm',
  messages: [{ role: 'user', content: 'hi' }],
  stream: true,
  ...extra,
});

/** The data payloads of an SSE body, in order. */
export function dataEvents(text: string): string[] {
  return text
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice(6));
}

/** Builds a set over the given upstream URLs named b0, b1, ... */
export function makeSet(urls: string[], over: Partial<BackendSetOptions> = {}): BackendSet {
  return new BackendSet(
    setOptions(over),
    urls.map((url, i) => ({ name: `b${i}`, url })),
  );
}
