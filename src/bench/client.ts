// One benchmark request, measured the way vLLM's benchmark client measures it
// (vllm/benchmarks/lib/endpoint_request_func.py): always streamed with usage included; the first
// SSE event with non-empty `choices` sets TTFT (for chat that is the role chunk, whose content
// is empty); each later such event appends one ITL gap (one per chunk, not per token); latency
// ends at the last `choices` event, so the trailing usage chunk does not stretch it.
import { randomUUID } from 'node:crypto';
import { type Dispatcher, request } from 'undici';
import { SseDecoder } from './sse.ts';
import type { WorkloadRequest } from './workloads.ts';
import { completionPrompt } from './workloads.ts';

export type EndpointKind = 'chat' | 'completions';

/** What one request did, in seconds (vLLM's units); the metrics are computed from these alone. */
export interface RequestRecord {
  index: number;
  requestId: string;
  /** When the request was sent, seconds since the run started. */
  startTime: number;
  /** Time spent waiting for a free slot under --concurrency, seconds. */
  queueTime: number;
  /** 0 when no token arrived. */
  ttft: number;
  itl: number[];
  latency: number;
  /** usage.prompt_tokens when the server sent it, else the workload's content token count. */
  promptLen: number;
  /** usage.completion_tokens when sent, else the number of chunks that carried text. */
  outputLen: number;
  success: boolean;
  error: string;
  /** HTTP status, or null when no response arrived. */
  status: number | null;
  /** The gateway's headers (x-slagate-*, x-request-id, retry-after) when present. */
  headers: Record<string, string>;
  classHint?: string;
  sessionId?: string;
  tenant?: string;
}

export interface ClientContext {
  dispatcher: Dispatcher;
  /** Full endpoint URL (…/v1/chat/completions or …/v1/completions). */
  url: string;
  endpoint: EndpointKind;
  model: string;
  ignoreEos: boolean;
  /** Sent with every request; these win over per-request hints of the same name. */
  headers: Record<string, string>;
  sendClassHint: boolean;
  sendSessionId: boolean;
  /** Seconds since the run started. */
  clock: () => number;
  /** Limit on waiting for headers and between body chunks (undici), ms. */
  timeoutMs: number;
  signal?: AbortSignal;
}

const KEPT_HEADERS = /^(x-slagate-.*|x-request-id|retry-after)$/;
const ERROR_BODY_LIMIT = 64 * 1024;

function payloadOf(ctx: ClientContext, req: WorkloadRequest): Record<string, unknown> {
  const common = {
    model: ctx.model,
    stream: true,
    stream_options: { include_usage: true },
    ...(ctx.ignoreEos ? { ignore_eos: true } : {}),
  };
  if (ctx.endpoint === 'chat') {
    return { ...common, messages: req.messages, max_completion_tokens: req.outputTokens };
  }
  return { ...common, prompt: completionPrompt(req.messages), max_tokens: req.outputTokens };
}

function headersOf(ctx: ClientContext, req: WorkloadRequest, requestId: string): Record<string, string> {
  const out: Record<string, string> = { 'content-type': 'application/json', 'x-request-id': requestId };
  if (ctx.sendSessionId && req.sessionId !== undefined) out['x-session-id'] = req.sessionId;
  if (ctx.sendClassHint && req.classHint !== undefined) out['x-slagate-class'] = req.classHint;
  for (const [k, v] of Object.entries(ctx.headers)) out[k.toLowerCase()] = v;
  return out;
}

function keptHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v !== undefined && KEPT_HEADERS.test(k)) out[k] = Array.isArray(v) ? v.join(', ') : v;
  }
  return out;
}

/** The message of an OpenAI error envelope, else the text itself (shortened). */
function errorMessage(text: string): string {
  try {
    const body = JSON.parse(text) as { error?: { message?: unknown } | string; message?: unknown };
    if (typeof body.error === 'string') return body.error;
    if (typeof body.error?.message === 'string') return body.error.message;
    if (typeof body.message === 'string') return body.message;
  } catch {
    // Not JSON: fall through to the raw text.
  }
  return text.trim().slice(0, 500);
}

async function readLimited(body: AsyncIterable<Uint8Array>): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    if (size < ERROR_BODY_LIMIT) chunks.push(Buffer.from(chunk));
    size += chunk.length;
  }
  return Buffer.concat(chunks).toString('utf8').slice(0, ERROR_BODY_LIMIT);
}

interface StreamChunk {
  choices?: { delta?: { content?: unknown }; text?: unknown }[];
  usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } | null;
  error?: { message?: unknown } | string;
  /** An old vLLM's flat in-band error: `object: "error"` with its `message` beside it. */
  object?: unknown;
  message?: unknown;
}

export async function sendRequest(
  ctx: ClientContext,
  req: WorkloadRequest,
  queueTime = 0,
): Promise<RequestRecord> {
  const requestId = randomUUID();
  const record: RequestRecord = {
    index: req.index,
    requestId,
    startTime: 0,
    queueTime,
    ttft: 0,
    itl: [],
    latency: 0,
    promptLen: req.promptTokens,
    outputLen: 0,
    success: false,
    error: '',
    status: null,
    headers: {},
    ...(req.classHint !== undefined ? { classHint: req.classHint } : {}),
    ...(req.sessionId !== undefined ? { sessionId: req.sessionId } : {}),
    ...(req.tenant !== undefined ? { tenant: req.tenant } : {}),
  };
  const body = JSON.stringify(payloadOf(ctx, req));
  const headers = headersOf(ctx, req, requestId);
  const start = ctx.clock();
  record.startTime = start;
  // Outside the try: a stream cut after its first token keeps the latency up to its last one,
  // beside the TTFT and gaps it already holds.
  let lastChoiceAt = start;
  let sawChoice = false;
  try {
    const res = await request(ctx.url, {
      method: 'POST',
      headers,
      body,
      dispatcher: ctx.dispatcher,
      headersTimeout: ctx.timeoutMs,
      bodyTimeout: ctx.timeoutMs,
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    record.status = res.statusCode;
    record.headers = keptHeaders(res.headers);
    if (res.statusCode !== 200) {
      record.error = `HTTP ${res.statusCode}: ${errorMessage(await readLimited(res.body))}`;
      return record;
    }
    const sse = new SseDecoder();
    let textChunks = 0;
    let usageOutput: number | null = null;
    let inBandError: string | null = null;
    let done = false;
    const handle = (data: string, at: number) => {
      if (data === '[DONE]') {
        done = true;
        return;
      }
      const chunk = JSON.parse(data) as StreamChunk;
      if (chunk.error !== undefined) {
        inBandError ??=
          typeof chunk.error === 'string' ? chunk.error : String(chunk.error.message ?? 'error');
        return;
      }
      // vLLM before 0.10 sends an in-band error as a flat object: {"object": "error", "message": …}.
      if (chunk.object === 'error') {
        inBandError ??= typeof chunk.message === 'string' ? chunk.message : 'error';
        return;
      }
      if (Array.isArray(chunk.choices) && chunk.choices.length > 0) {
        if (sawChoice) record.itl.push(at - lastChoiceAt);
        else record.ttft = at - start;
        sawChoice = true;
        lastChoiceAt = at;
        const first = chunk.choices[0];
        const text = ctx.endpoint === 'chat' ? first?.delta?.content : first?.text;
        if (typeof text === 'string' && text.length > 0) textChunks++;
      }
      if (chunk.usage) {
        if (typeof chunk.usage.completion_tokens === 'number') usageOutput = chunk.usage.completion_tokens;
        if (typeof chunk.usage.prompt_tokens === 'number') record.promptLen = chunk.usage.prompt_tokens;
      }
    };
    for await (const piece of res.body) {
      // All events completed by one network read share its arrival time.
      const at = ctx.clock();
      for (const data of sse.push(piece)) handle(data, at);
    }
    const at = ctx.clock();
    for (const data of sse.end()) handle(data, at);
    record.latency = lastChoiceAt - start;
    record.outputLen = usageOutput ?? textChunks;
    if (inBandError !== null) record.error = `stream error: ${inBandError}`;
    else if (!sawChoice) record.error = 'no choices chunk in the stream';
    // vLLM ends every stream it finishes with [DONE], after an error too: one that ended without
    // it was cut (by a proxy, or a dropped connection that closed cleanly), its answer partial.
    else if (!done) record.error = 'stream ended without [DONE]';
    else record.success = true;
  } catch (err) {
    record.error = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    if (sawChoice) record.latency = lastChoiceAt - start;
  }
  return record;
}
