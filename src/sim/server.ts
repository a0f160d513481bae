// The HTTP front end of one simulated vLLM replica, on node:http so every byte is ours:
// vLLM's OpenAI routes, /health, /metrics, /tokenize, /version, and the simulator's own
// /sim/fault and /sim/cached-tokens. Requests become EngineRequestSpecs after the
// profile's front-end delay (vLLM's API server tokenizes before the engine sees a request);
// engine tokens become SSE chunks or one JSON body.

import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Tokenizer } from '../tokenizer/tokenizer.ts';
import type { GpuProfile } from './engine/profile-types.ts';
import type { Engine, FinishReason } from './engine/types.ts';
import {
  type FaultSpec,
  FaultSpecError,
  parseFaultHeader,
  parseFaultJson,
  type RequestFault,
} from './faults.ts';
import type { ReplicaMetrics } from './metrics.ts';
import {
  cacheSaltOf,
  type GenerationRequest,
  parseGeneration,
  parseJsonBody,
  promptTokensOf,
  resolveModel,
} from './requests.ts';
import { generatedText, generatedToken, naturalLength, requestSeed } from './textgen.ts';
import {
  contextLengthError,
  DONE_EVENT,
  errorBody,
  errorEvent,
  type Finish,
  HttpError,
  type Kind,
  modelList,
  ResponseFrame,
} from './wire.ts';

export const VLLM_VERSION = '0.11.0';
const MAX_BODY_BYTES = 64 * 1024 * 1024;
const JSON_TYPE = 'application/json';
const SSE_TYPE = 'text/event-stream; charset=utf-8';

/** What the front end needs from its replica. */
export interface ReplicaContext {
  readonly engine: Engine;
  readonly profile: GpuProfile;
  readonly metrics: ReplicaMetrics;
  readonly tokenizer: Tokenizer;
  readonly fleetSeed: number;
  readonly timeScale: number;
  /** The replica-wide fault new requests inherit (hang, error, drop, inband_error). */
  requestFault(): RequestFault | null;
  /** Set a replica-wide fault (from POST /sim/fault or a request header). */
  applyFault(spec: FaultSpec): Promise<void>;
}

type Req = IncomingMessage;
type Handler = (ctx: ReplicaContext, req: Req, res: ServerResponse) => void;

const ROUTES_BY_PATH: Record<string, Record<string, Handler>> = {
  '/v1/chat/completions': { POST: (c, q, s) => generate(c, q, s, 'chat') },
  '/v1/completions': { POST: (c, q, s) => generate(c, q, s, 'completion') },
  '/v1/models': { GET: models },
  '/health': { GET: (_c, _q, s) => send(s, 200, '', undefined) },
  '/ping': {
    GET: (_c, _q, s) => send(s, 200, '', undefined),
    POST: (_c, _q, s) => send(s, 200, '', undefined),
  },
  '/version': { GET: (_c, _q, s) => send(s, 200, JSON.stringify({ version: VLLM_VERSION })) },
  '/metrics': {
    GET: (c, _q, s) =>
      send(s, 200, c.metrics.render(c.engine.stats()), 'text/plain; version=0.0.4; charset=utf-8'),
  },
  '/tokenize': { POST: tokenize },
  '/sim/fault': {
    POST: setFault,
    DELETE: (c, _q, s) => afterResponse(s, 200, '{"fault":null}', () => c.applyFault({ mode: 'reset' })),
  },
  '/sim/cached-tokens': { POST: cachedTokens },
  '/sim/stats': { GET: (c, _q, s) => send(s, 200, JSON.stringify(c.metrics.simStats())) },
};
const ROUTES = new Map(
  Object.entries(ROUTES_BY_PATH).map(([path, methods]) => [path, new Map(Object.entries(methods))]),
);

export function handleRequest(ctx: ReplicaContext, req: Req, res: ServerResponse): void {
  const path = (req.url ?? '/').split('?', 1)[0] as string;
  const route = ROUTES.get(path);
  const handler = route?.get(req.method ?? 'GET');
  if (handler !== undefined) {
    handler(ctx, req, res);
    return;
  }
  req.resume();
  const err =
    route === undefined ? new HttpError(404, 'Not Found') : new HttpError(405, 'Method Not Allowed');
  sendError(res, err);
}

function send(res: ServerResponse, status: number, body: string, type: string | undefined = JSON_TYPE): void {
  if (res.destroyed) return;
  const headers: Record<string, string | number> = { 'content-length': Buffer.byteLength(body) };
  if (type !== undefined) headers['content-type'] = type;
  res.writeHead(status, headers);
  res.end(body);
}

function sendError(res: ServerResponse, err: HttpError): void {
  send(res, err.status, errorBody(err));
}

/** Runs `then` once the response has been handed to the socket (faults that kill sockets). */
function afterResponse(res: ServerResponse, status: number, body: string, then: () => Promise<void>): void {
  res.once('finish', () => void then());
  send(res, status, body);
}

function readBody(req: Req, res: ServerResponse, onBody: (raw: string) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  req.on('data', (c: Buffer) => {
    size += c.length;
    if (size <= MAX_BODY_BYTES) chunks.push(c);
  });
  req.on('end', () => {
    if (size > MAX_BODY_BYTES) {
      sendError(res, new HttpError(413, 'Request body too large.'));
      return;
    }
    try {
      onBody(Buffer.concat(chunks).toString('utf8'));
    } catch (e) {
      sendError(res, toHttpError(e));
    }
  });
}

function toHttpError(e: unknown): HttpError {
  if (e instanceof HttpError) return e;
  if (e instanceof FaultSpecError) return new HttpError(400, e.message);
  return new HttpError(500, e instanceof Error ? e.message : String(e));
}

function models(ctx: ReplicaContext, req: Req, res: ServerResponse): void {
  req.resume();
  const id = `modelperm-${randomUUID().replace(/-/g, '')}`;
  send(res, 200, modelList(ctx.profile.model, ctx.profile.maxModelLen, Math.floor(Date.now() / 1000), id));
}

function tokenize(ctx: ReplicaContext, req: Req, res: ServerResponse): void {
  readBody(req, res, (raw) => {
    const body = parseJsonBody(raw);
    resolveModel(body, ctx.profile.model);
    const kind: Kind = body.messages !== undefined ? 'chat' : 'completion';
    const addSpecial = body.add_special_tokens;
    let tokens = promptTokensOf(kind, body, ctx.tokenizer, body.add_generation_prompt !== false);
    // vLLM: add_special_tokens defaults to true for a prompt (BOS) and false for messages
    // (the template already has it).
    if (kind === 'completion' && addSpecial === false) tokens = tokens.slice(1);
    send(
      res,
      200,
      JSON.stringify({
        count: tokens.length,
        max_model_len: ctx.profile.maxModelLen,
        tokens,
        token_strs: null,
      }),
    );
  });
}

function cachedTokens(ctx: ReplicaContext, req: Req, res: ServerResponse): void {
  readBody(req, res, (raw) => {
    const body = parseJsonBody(raw);
    const tokens = promptTokensOf(body.messages !== undefined ? 'chat' : 'completion', body, ctx.tokenizer);
    const cached = ctx.engine.cachedPrefixTokens(tokens, cacheSaltOf(body));
    send(res, 200, JSON.stringify({ cached_tokens: cached, prompt_tokens: tokens.length }));
  });
}

function setFault(ctx: ReplicaContext, req: Req, res: ServerResponse): void {
  readBody(req, res, (raw) => {
    const spec = parseFaultJson(parseJsonBody(raw));
    afterResponse(res, 200, JSON.stringify({ fault: spec }), () => ctx.applyFault(spec));
  });
}

let requestCounter = 0;

function generate(ctx: ReplicaContext, req: Req, res: ServerResponse, kind: Kind): void {
  const xRequestId = header(req, 'x-request-id');
  const baseId = xRequestId ?? randomUUID().replace(/-/g, '');
  res.setHeader('x-request-id', baseId);
  readBody(req, res, (raw) => {
    const faultHeader = header(req, 'x-sim-fault');
    const headerFault = faultHeader === undefined ? null : parseFaultHeader(faultHeader);
    const body = parseJsonBody(raw);
    const g = parseGeneration(kind, body, ctx.profile.model, ctx.tokenizer, ctx.profile.maxModelLen);
    const prompt = g.promptTokens.length;
    const maxModelLen = ctx.profile.maxModelLen;
    if (prompt >= maxModelLen) throw contextLengthError(maxModelLen, prompt);
    if (g.maxTokens !== undefined && prompt + g.maxTokens > maxModelLen) {
      throw contextLengthError(maxModelLen, prompt, g.maxTokens);
    }
    let fault: RequestFault | null = ctx.requestFault();
    let slowFactor = 1;
    if (headerFault !== null) {
      if (headerFault.mode === 'slow') {
        slowFactor = headerFault.factor ?? 1;
        fault = null;
      } else if (
        headerFault.mode === 'crash' ||
        headerFault.mode === 'refuse' ||
        headerFault.mode === 'reset'
      ) {
        void ctx.applyFault(headerFault);
        if (headerFault.mode === 'crash') return;
        // Overridden for this request too: it is served (the fault read above was the replica's).
        fault = null;
      } else fault = headerFault as RequestFault;
    }
    if (fault?.mode === 'error') {
      const status = fault.status ?? 500;
      throw new HttpError(status, fault.message ?? `Simulated fault: error ${status}`);
    }
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${baseId}`;
    new Generation(ctx, res, g, id, fault, slowFactor).start();
  });
}

function header(req: Req, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/**
 * One generation request from the front-end delay to the last byte. A request for n choices is n
 * engine requests of one prompt (vLLM's fan-out: each child its own seed, the prompt's blocks
 * shared through the prefix cache), streamed interleaved as their tokens come, each event naming
 * its choice; it ends when the last choice does.
 */
class Generation {
  private readonly frame: ResponseFrame;
  /** Per choice: its engine id, seed, text so far (non-streamed), tokens so far, finish. */
  private readonly choices: {
    engineId: string;
    seed: number;
    text: string;
    tokens: number;
    finish: Finish | null;
  }[];
  private readonly limit: number;
  private added = false;
  /** Set once the response is complete or the connection is gone: later tokens are ignored. */
  private done = false;
  private delay: NodeJS.Timeout | null = null;
  private roleSent = false;

  constructor(
    private readonly ctx: ReplicaContext,
    private readonly res: ServerResponse,
    private readonly g: GenerationRequest,
    id: string,
    private readonly fault: RequestFault | null,
    private readonly slowFactor: number,
  ) {
    this.frame = new ResponseFrame(g.kind, id, Math.floor(Date.now() / 1000), g.model);
    const seed = requestSeed(ctx.fleetSeed, g.promptTokens, g.seed);
    // Engine ids must be unique even when a client reuses an x-request-id.
    const base = `${id}#${++requestCounter}`;
    this.choices = Array.from({ length: g.n }, (_, i) => ({
      engineId: i === 0 ? base : `${base}.${i}`,
      // vLLM's children of one request: the parent's seed plus their index.
      seed: (seed + i) >>> 0,
      text: '',
      tokens: 0,
      finish: null,
    }));
    this.limit = g.maxTokens ?? ctx.profile.maxModelLen - g.promptTokens.length;
  }

  start(): void {
    this.res.once('close', () => this.onClose());
    this.delay = setTimeout(() => this.admit(), this.ctx.profile.frontendOverheadMs * this.ctx.timeScale);
  }

  private onClose(): void {
    if (this.delay !== null) clearTimeout(this.delay);
    // The client went away (or the socket was destroyed) before the response ended.
    if (!this.done && this.added) this.abortEngine(true);
    this.done = true;
  }

  /**
   * Aborts every choice the engine still holds; `byClient` when the client went away, the one
   * cause /sim/stats counts (an injected fault's abort is the simulator's own doing).
   */
  private abortEngine(byClient = false): void {
    for (const c of this.choices) {
      // A request a crash dropped is not an abort of the process that comes back.
      if (this.ctx.engine.abort(c.engineId) && byClient) this.ctx.metrics.onClientAbort();
    }
  }

  private admit(): void {
    this.delay = null;
    if (this.done) return;
    // vLLM's StreamingResponse sends its headers as soon as the request is in the engine.
    if (this.g.stream || this.fault?.mode === 'hang') {
      this.res.writeHead(200, { 'content-type': this.g.stream ? SSE_TYPE : JSON_TYPE });
      this.res.flushHeaders();
    }
    if (this.fault?.mode === 'hang') return;
    try {
      this.choices.forEach((c, i) => {
        this.ctx.engine.add(
          {
            id: c.engineId,
            promptTokens: this.g.promptTokens,
            maxTokens: this.limit,
            naturalLength: naturalLength(c.seed),
            ignoreEos: this.g.ignoreEos,
            seed: c.seed,
            slowFactor: this.slowFactor,
            cacheSalt: this.g.cacheSalt,
            skipReadingPrefixCache: this.g.skipReadingPrefixCache,
          },
          { onToken: (_tokenId, index, finish) => this.onToken(i, index, finish) },
        );
        this.added = true;
        this.ctx.metrics.onAdded();
      });
    } catch (e) {
      // The engine refuses a request that could never fit its KV cache (the first choice, before
      // any other is in).
      this.abortEngine();
      this.fail(new HttpError(400, e instanceof Error ? e.message : String(e)));
      return;
    }
  }

  private onToken(choice: number, index: number, finish: FinishReason | null): void {
    if (this.done) return;
    // The contract lets an engine end a request with `abort` (it is not the client's doing).
    if (finish === 'abort') {
      this.abortEngine();
      this.fail(new HttpError(500, 'The engine aborted the request.', 'InternalServerError'));
      return;
    }
    const c = this.choices[choice]!;
    const f = this.fault;
    if (
      (f?.mode === 'drop' || f?.mode === 'inband_error') &&
      choice === 0 &&
      index === (f.afterTokens ?? 1)
    ) {
      // On its last token the engine has already finished the choice: the others are aborted.
      this.abortEngine();
      if (f.mode === 'drop') {
        this.done = true;
        this.res.destroy();
        return;
      }
      const status = f.status ?? 500;
      this.fail(new HttpError(status, f.message ?? 'Simulated fault: in-band error'));
      return;
    }
    const eos = finish === 'stop' && !this.g.ignoreEos;
    const piece = generatedText(generatedToken(c.seed, index, eos));
    c.tokens = index + 1;
    const end: Finish | null = finish;
    if (end !== null) c.finish = end;
    // The response ends with its last choice.
    const last = end !== null && this.choices.every((x) => x.finish !== null);
    if (!this.g.stream) {
      c.text += piece;
      if (last) {
        const all = this.choices.map((x) => ({ text: x.text, finish: x.finish as Finish }));
        this.finish(() =>
          send(this.res, 200, this.frame.fullResponse(all, this.promptLen, this.completionTokens)),
        );
      }
      return;
    }
    let out = '';
    // vLLM's first output of a chat stream comes after a role chunk for every choice.
    if (!this.roleSent && this.g.kind === 'chat') {
      for (let i = 0; i < this.choices.length; i++) out += this.frame.roleEvent(i);
    }
    this.roleSent = true;
    out += this.frame.tokenEvent(piece, end, choice);
    if (!last) {
      this.res.write(out);
      return;
    }
    if (this.g.includeUsage) out += this.frame.usageEvent(this.promptLen, this.completionTokens);
    this.finish(() => this.res.end(out + DONE_EVENT));
  }

  private get completionTokens(): number {
    let n = 0;
    for (const c of this.choices) n += c.tokens;
    return n;
  }

  private get promptLen(): number {
    return this.g.promptTokens.length;
  }

  /** After the stream started: one error event, then [DONE]; before it: an error status. */
  private fail(err: HttpError): void {
    if (this.g.stream) this.finish(() => this.res.end(errorEvent(err) + DONE_EVENT));
    else this.finish(() => sendError(this.res, err));
  }

  private finish(write: () => void): void {
    this.done = true;
    write();
  }
}
