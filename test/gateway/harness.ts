// A real gateway for the gateway-level tests: startGateway on 127.0.0.1:0 in front of a simulated
// fleet (or scripted node:http backends), its admission log in a temporary file, and raw HTTP
// clients that can read a stream incrementally and hang up mid-way.
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { type Config, parseConfig } from '../../src/config/index.ts';
import { type Gateway, startGateway } from '../../src/gateway.ts';
import { type Fleet, startFleet } from '../../src/sim/fleet.ts';
import type { AdmissionRecord } from '../../src/telemetry/admission-log.ts';
import { listenLoopback, send } from '../helpers/http.ts';

export const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Objects merge key by key; anything else in `over` replaces. */
export function merge(base: Json, over: Json): Json {
  const out: Json = { ...base };
  for (const [k, v] of Object.entries(over)) {
    const b = out[k];
    out[k] = isObject(b) && isObject(v) ? merge(b, v) : v;
  }
  return out;
}

/** A temporary directory removed by the returned function. */
export function tempDir(): { dir: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), 'slagate-gw-'));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** Test defaults: quiet logs, short timeouts, probes often, no ejection unless a test asks. */
export function baseConfig(
  backends: { name: string; url: string; api_key_env?: string }[],
  admissionLog: string,
): Json {
  return {
    server: { host: '127.0.0.1', port: 0, shutdown_grace_ms: 3000 },
    models: [MODEL],
    backends,
    router: { policy: 'round_robin' },
    upstream: {
      connect_timeout_ms: 500,
      first_token_timeout_ms: 2000,
      idle_timeout_ms: 2000,
      health_interval_ms: 100,
      outlier: { consecutive_failures: 100 },
      breaker: { volume_threshold: 1000 },
    },
    logging: { level: 'error', admission_log: admissionLog },
  };
}

/**
 * Classes named like methods every object inherits (`toString`, `constructor`), which the config
 * accepts: whatever reads a record by class name must read own keys only.
 */
export const METHOD_NAMED_CLASSES: Json = {
  sla: {
    default_class: 'toString',
    classes: {
      toString: { ttft_p99_ms: 5000, tpot_p99_ms: 500, priority: 0 },
      constructor: { ttft_p99_ms: 5000, tpot_p99_ms: 500, priority: 1, sheddable: true },
    },
  },
};

export function toConfig(obj: Json): Config {
  return parseConfig(stringify(obj), 'test.yaml');
}

export interface TestGatewayOptions {
  /** Simulated replicas named r0, r1, ...; ignored when `backends` is given. */
  replicas?: number;
  timeScale?: number;
  /** Backends instead of a fleet (e.g. scripted servers). */
  backends?: { name: string; url: string; api_key_env?: string }[];
  /** Deep-merged over baseConfig. */
  config?: Json;
  /** Start from a file (watched) instead of a Config object. */
  viaFile?: boolean;
}

export interface TestGateway {
  gw: Gateway;
  url: string;
  fleet: Fleet | null;
  dir: string;
  configPath: string;
  /** Every admission record written so far (flushes first). */
  records(): Promise<AdmissionRecord[]>;
  /** The record of one request id (exactly one must exist). */
  recordOf(reqId: string): Promise<AdmissionRecord>;
  close(): Promise<void>;
}

/**
 * Puts a routing policy that throws in place of the gateway's (a gateway bug after the hand-off);
 * the returned function puts the real one back.
 */
export function breakPolicy(gw: Gateway): () => void {
  const rt = gw.runtime;
  const policy = rt.policy;
  rt.policy = {
    name: 'broken',
    rank: () => {
      throw new Error('policy bug');
    },
  };
  return () => {
    rt.policy = policy;
  };
}

export async function startTestGateway(opts: TestGatewayOptions = {}): Promise<TestGateway> {
  const tmp = tempDir();
  const fleet =
    opts.backends === undefined
      ? await startFleet({
          replicas: opts.replicas ?? 2,
          profile: 'llama3-8b-h100',
          timeScale: opts.timeScale ?? 0.1,
        })
      : null;
  const backends = opts.backends ?? fleet!.urls.map((url, i) => ({ name: `r${i}`, url }));
  const admissionLog = join(tmp.dir, 'admission.log');
  const obj = merge(baseConfig(backends, admissionLog), opts.config ?? {});
  const configPath = join(tmp.dir, 'gateway.yaml');
  writeFileSync(configPath, stringify(obj));
  let gw: Gateway;
  try {
    gw = opts.viaFile
      ? await startGateway({ configPath })
      : await startGateway({ config: toConfig(obj), watch: false });
  } catch (err) {
    await fleet?.close();
    tmp.remove();
    throw err;
  }
  const records = async (): Promise<AdmissionRecord[]> => {
    await gw.flushLogs();
    return readRecords(admissionLog);
  };
  return {
    gw,
    url: gw.url,
    fleet,
    dir: tmp.dir,
    configPath,
    records,
    async recordOf(reqId) {
      const mine = (await records()).filter((r) => r.req_id === reqId);
      if (mine.length !== 1) throw new Error(`${mine.length} records for ${reqId}`);
      return mine[0]!;
    },
    async close() {
      await gw.close();
      await fleet?.close();
      tmp.remove();
    },
  };
}

export function readRecords(path: string): AdmissionRecord[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as AdmissionRecord & { kind?: string })
    .filter((r) => r.kind === 'admission');
}

/** Polls until `fn` holds; throws after `timeoutMs`. */
export async function waitFor(fn: () => boolean | Promise<boolean>, timeoutMs = 5000, what = 'condition') {
  const deadline = Date.now() + timeoutMs;
  while (!(await fn())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

// ---- raw HTTP clients (no pooling: every request its own connection) ----

export { type RawResponse, send } from '../helpers/http.ts';

export const post = (base: string, path: string, body: unknown, headers?: http.OutgoingHttpHeaders) =>
  send(base, 'POST', path, body, headers);

export const get = (base: string, path: string) => send(base, 'GET', path);

/** vllm:prefix_cache_hits_total of each replica. */
export async function cacheHits(urls: readonly string[]): Promise<number[]> {
  return Promise.all(
    urls.map(async (u) => {
      const m = /^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$/m.exec((await get(u, '/metrics')).text);
      return m ? Number(m[1]) : 0;
    }),
  );
}

export function chat(extra: Json = {}): Json {
  return {
    model: MODEL,
    messages: [{ role: 'user', content: 'Tell me about the sea.' }],
    max_tokens: 8,
    ...extra,
  };
}

/** The `data:` payloads of an SSE body, in order. */
export function sseData(text: string): string[] {
  return text
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice('data: '.length));
}

export { type OpenStream, openStream } from '../helpers/http.ts';

// ---- the simulated replicas, seen from outside ----

/** Requests that have reached a replica's engine since it started (the simulator's /sim/stats). */
export async function replicaRequests(replicaUrl: string): Promise<number> {
  return (JSON.parse((await get(replicaUrl, '/sim/stats')).text) as { requests: number }).requests;
}

/**
 * Engine requests the replica aborted because its client went away (the simulator's /sim/stats:
 * vLLM's own metrics do not count them).
 */
export async function replicaAborts(replicaUrl: string): Promise<number> {
  return (JSON.parse((await get(replicaUrl, '/sim/stats')).text) as { client_aborts: number }).client_aborts;
}

// ---- scripted backends ----

export interface Hit {
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  url: string;
  body: string;
}

export type Script = (req: http.IncomingMessage, res: http.ServerResponse, hit: Hit) => void;

/** A node:http "backend" that records every request and answers with `script` (GET /health: 200). */
export async function scripted(
  script: Script,
): Promise<{ url: string; hits: Hit[]; close(): Promise<void> }> {
  const hits: Hit[] = [];
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (req.method === 'GET') {
      res.writeHead(req.url === '/health' ? 200 : 404, { 'content-type': 'application/json' });
      res.end(req.url === '/v1/models' ? '{"object":"list","data":[]}' : '');
      return;
    }
    const hit: Hit = {
      headers: req.headers,
      rawHeaders: req.rawHeaders,
      url: req.url ?? '',
      body: Buffer.concat(chunks).toString('utf8'),
    };
    hits.push(hit);
    script(req, res, hit);
  });
  return { ...(await listenLoopback(server)), hits };
}

/**
 * A scripted backend that streams a chat answer of `tokens` tokens (chatStreamText), sends its
 * first `events` events at once and holds the rest until `release()`: a stream caught mid-way.
 */
export async function heldStream(
  tokens: number,
  events: number,
): Promise<{ url: string; release(): void; close(): Promise<void> }> {
  const text = chatStreamText(tokens);
  let cut = 0;
  for (let i = 0; i < events; i++) cut = text.indexOf('\n\n', cut) + 2;
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  const b = await scripted(async (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    res.write(text.slice(0, cut));
    await released;
    res.end(text.slice(cut));
  });
  return { url: b.url, release, close: () => b.close() };
}

/** A whole vLLM-shaped chat stream of `n` tokens (usage included). */
export function chatStreamText(n: number): string {
  const frame = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
  const chunk = (delta: Json, finish: string | null) => ({
    id: 'chatcmpl-x',
    object: 'chat.completion.chunk',
    created: 1,
    model: MODEL,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  });
  let out = frame(chunk({ role: 'assistant', content: '' }, null));
  for (let i = 0; i < n; i++) out += frame(chunk({ content: ` t${i}` }, i === n - 1 ? 'length' : null));
  out += frame({
    id: 'chatcmpl-x',
    object: 'chat.completion.chunk',
    created: 1,
    model: MODEL,
    choices: [],
    usage: { prompt_tokens: 5, total_tokens: 5 + n, completion_tokens: n },
  });
  return `${out}data: [DONE]\n\n`;
}

// ---- `slagate serve` as a real child process ----

const BIN = join(import.meta.dirname, '../../bin/slagate.js');

export interface ServedGateway {
  child: import('node:child_process').ChildProcess;
  url: string;
  /** The admission log file. */
  log: string;
  /** The config file it was started with (and watches). */
  configPath: string;
  stderr(): string;
  /** The gateway's own log lines (pino JSON on stdout). */
  stdout(): string;
  exited: Promise<number | null>;
  /** SIGKILL unless it has exited; removes its temporary directory. */
  dispose(): Promise<void>;
}

/**
 * Runs `node bin/slagate.js serve` with `config` (admission log and port filled in) and resolves
 * once it prints where it serves.
 */
export async function serveChild(
  config: Json,
  opts: {
    readStdout?: boolean;
    args?: string[];
    /** Called with the child as soon as it is spawned (before it serves). */
    spawned?: (child: ChildProcess) => void;
    /** Spawned with an IPC channel, as the benchmark spawns it. */
    ipc?: boolean;
    /** Node's own options, before the entry. */
    nodeArgs?: string[];
  } = {},
): Promise<ServedGateway> {
  const { spawn } = await import('node:child_process');
  const tmp = tempDir();
  const log = join(tmp.dir, 'admission.log');
  const path = join(tmp.dir, 'gateway.yaml');
  writeFileSync(
    path,
    stringify(
      merge(
        { server: { host: '127.0.0.1', port: 0 }, logging: { level: 'warn', admission_log: log } },
        config,
      ),
    ),
  );
  const child = spawn(
    process.execPath,
    [...(opts.nodeArgs ?? []), BIN, 'serve', '--config', path, ...(opts.args ?? [])],
    {
      stdio: opts.ipc === true ? ['ignore', 'pipe', 'pipe', 'ipc'] : ['ignore', 'pipe', 'pipe'],
    },
  );
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  opts.spawned?.(child);
  let stderr = '';
  let stdout = '';
  child.stderr!.setEncoding('utf8');
  child.stderr!.on('data', (c: string) => {
    stderr += c;
  });
  // Unread, the pipe fills and the child's writes to it stall, as a log reader that stopped does.
  if (opts.readStdout === false) child.stdout!.pause();
  else {
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (c: string) => {
      stdout += c;
    });
  }
  const dispose = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await exited;
    }
    tmp.remove();
  };
  try {
    await waitFor(
      () => /serving on (http:\/\/\S+)/.test(stderr) || child.exitCode !== null || child.signalCode !== null,
      15_000,
      'serving',
    );
  } catch (err) {
    await dispose();
    throw err;
  }
  const url = /serving on (http:\/\/\S+)/.exec(stderr)?.[1];
  if (url === undefined) {
    await dispose();
    throw new Error(`slagate serve did not start:\n${stderr}`);
  }
  return { child, url, log, configPath: path, stderr: () => stderr, stdout: () => stdout, exited, dispose };
}
