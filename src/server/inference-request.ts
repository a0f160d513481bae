// Turns a client's JSON body into the few facts the gateway decides on, and rejects what no
// backend could serve. The body itself is forwarded unchanged (bar stream and stream_options), so
// this file checks only what the gateway reads; vLLM validates the rest.

import { GatewayError } from '../errors/index.ts';
import { partText } from '../prompt/canonical.ts';
import { type AssembleKind, assemblable, type ClientMode } from '../upstream/index.ts';

/** vLLM's (and OpenAI's) max_tokens for /v1/completions when the request leaves it out. */
export const COMPLETION_DEFAULT_MAX_TOKENS = 16;

/** The most content parts (texts, images) a chat request's messages may hold together. */
export const MAX_CONTENT_PARTS = 4096;

/** The most choices one request may ask for (`n`), as OpenAI's API allows. */
export const MAX_N = 128;

/**
 * The most sequences one completion may fan out into: its prompts times `n`. vLLM sets no bound;
 * the gateway schedules, admits and counts a request as one, so a list of a million prompts (a
 * few MiB of JSON) would be a replica's whole batch, and more, taken as one request.
 */
export const MAX_SEQUENCES = 256;

export type Endpoint = 'chat' | 'completions';

export const ENDPOINT_PATHS: Readonly<Record<Endpoint, string>> = Object.freeze({
  chat: '/v1/chat/completions',
  completions: '/v1/completions',
});

/** A prompt's text, or its token ids when the client sent ids (completions only). */
export type PromptPart = string | readonly number[];

export interface InferenceRequest {
  endpoint: Endpoint;
  /**
   * The model the body names, or null when it names none (absent, null or empty): vLLM then
   * serves its one model, and so does the gateway when it serves only one (intake.ts).
   */
  model: string | null;
  stream: boolean;
  /**
   * How the answer is made: a relayed stream; a non-streamed body assembled from a stream (so it
   * is measured like one); or, for shapes the assembler does not cover, a body passed through.
   */
  mode: ClientMode;
  assembleKind: AssembleKind;
  /** The client asked for the usage chunk (stream_options.include_usage). */
  wantsUsage: boolean;
  /** max_completion_tokens ?? max_tokens, or null when the client set none. */
  maxTokens: number | null;
  /**
   * The most output tokens the backend will generate per prompt, as vLLM reads the request:
   * maxTokens, or vLLM's default of 16 for a completion that leaves max_tokens out; null for a chat
   * request without a limit, or a completion that sends it as null (vLLM fills the context).
   */
  outputLimit: number | null;
  /**
   * What the prompt is made of, in order: one text per message (chat), or per prompt
   * (completions), where a completion prompt may also be given as token ids.
   */
  promptParts: PromptPart[];
  /** The sequences the backend will generate: `n` (chat), or prompts × `n` (completions); ≤ MAX_SEQUENCES. */
  sequences: number;
  /**
   * Whether vLLM reads its prefix cache for it: not for a request that asks for its prompt's
   * logprobs, which it prefills whole (it still caches the blocks for others). vLLM asks for them
   * when `prompt_logprobs` is set, or on `echo` from `logprobs` (completions, default none) or
   * `top_logprobs` (chat, default 0, so chat's echo alone does).
   */
  readsPrefixCache: boolean;
  /** The body as received; proxied with stream_options rewritten. */
  body: Record<string, unknown>;
}

function invalid(message: string, param: string): GatewayError {
  return new GatewayError('invalid_request', message, { param });
}

function tooManySequences(sequences: number, param: string): GatewayError {
  return invalid(
    `A request may ask for at most ${MAX_SEQUENCES} sequences (prompts × n); this one asks for ${sequences}. Send the prompts in smaller batches.`,
    param,
  );
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function positiveInt(body: Record<string, unknown>, key: string): number | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1) {
    throw invalid(`'${key}' must be a positive integer`, key);
  }
  return v;
}

function messageText(content: unknown, index: number): string {
  if (typeof content === 'string') return content;
  if (content === null || content === undefined) return '';
  if (Array.isArray(content)) {
    // Text parts joined by newlines, as vLLM renders them; other parts (images) are the backend's.
    const texts: string[] = [];
    for (const part of content) {
      const text = partText(part);
      if (text !== null) texts.push(text);
    }
    return texts.join('\n');
  }
  throw invalid(`'messages[${index}].content' must be a string or an array of parts`, `messages`);
}

const isTokenIds = (v: unknown): v is number[] =>
  Array.isArray(v) && v.length > 0 && v.every((t) => Number.isInteger(t) && t >= 0);

function promptParts(endpoint: Endpoint, body: Record<string, unknown>): PromptPart[] {
  if (endpoint === 'chat') {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) {
      throw invalid("'messages' must be a non-empty array", 'messages');
    }
    // Each part is rendered and hashed on the event loop (src/prompt): a body of millions of
    // tiny parts would hold it for seconds.
    let parts = 0;
    for (const m of messages) if (isRecord(m) && Array.isArray(m.content)) parts += m.content.length;
    if (parts > MAX_CONTENT_PARTS) {
      throw invalid(`'messages' may hold at most ${MAX_CONTENT_PARTS} content parts in all`, 'messages');
    }
    return messages.map((m, i) => {
      if (!isRecord(m) || typeof m.role !== 'string') {
        throw invalid(`'messages[${i}]' must be an object with a string 'role'`, 'messages');
      }
      return messageText(m.content, i);
    });
  }
  // vLLM's shapes: a string, a list of strings, a list of token ids, or a list of such lists.
  const prompt = body.prompt;
  // vLLM (with --enable-prompt-embeds) also takes embeddings in place of a prompt: the gateway
  // could neither count nor route them, and says so rather than call the prompt malformed.
  if (body.prompt_embeds !== undefined && body.prompt_embeds !== null) {
    throw invalid(
      "'prompt_embeds' is not supported by this gateway; send 'prompt' as text or token ids",
      'prompt_embeds',
    );
  }
  if (typeof prompt === 'string') return [prompt];
  if (isTokenIds(prompt)) return [prompt];
  // More prompts than sequences allowed: refused before each is looked at (see below, MAX_SEQUENCES).
  if (Array.isArray(prompt) && prompt.length > MAX_SEQUENCES) throw tooManySequences(prompt.length, 'prompt');
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === 'string')) return prompt as string[];
    if (prompt.every(isTokenIds)) return prompt as number[][];
  }
  throw invalid(
    "'prompt' must be a string, a list of strings, a list of token ids, or a list of token-id lists",
    'prompt',
  );
}

type FieldType = 'number' | 'integer' | 'boolean' | 'stop';

// Sampling parameters by the JSON type vLLM's schema gives them. Only the type is checked here
// (a wrong type is the gateway's own 400, with the field named); ranges are the engine's to
// judge, and its 4xx message reaches the client (DESIGN section 4).
const SAMPLING: Readonly<Record<string, FieldType>> = Object.freeze({
  temperature: 'number',
  top_p: 'number',
  min_p: 'number',
  top_k: 'integer',
  frequency_penalty: 'number',
  presence_penalty: 'number',
  repetition_penalty: 'number',
  seed: 'integer',
  min_tokens: 'integer',
  top_logprobs: 'integer',
  // Read by the gateway too (intake.ts): a value it would misread is refused, not guessed at.
  truncate_prompt_tokens: 'integer',
  ignore_eos: 'boolean',
  stop: 'stop',
});

const TYPE_TEXT: Readonly<Record<FieldType, string>> = {
  number: 'a number',
  integer: 'an integer',
  boolean: 'a boolean',
  stop: 'a string or a list of strings',
};

function hasType(v: unknown, t: FieldType): boolean {
  switch (t) {
    case 'number':
      return typeof v === 'number' && Number.isFinite(v);
    case 'integer':
      return Number.isInteger(v);
    case 'boolean':
      return typeof v === 'boolean';
    case 'stop':
      return typeof v === 'string' || (Array.isArray(v) && v.every((x) => typeof x === 'string'));
  }
}

function checkSamplingTypes(endpoint: Endpoint, body: Record<string, unknown>): void {
  for (const [field, t] of Object.entries(SAMPLING)) {
    const v = body[field];
    if (v !== undefined && v !== null && !hasType(v, t))
      throw invalid(`'${field}' must be ${TYPE_TEXT[t]}`, field);
  }
  // `logprobs`: a boolean in chat, a count in completions.
  const lp = body.logprobs;
  const lpType: FieldType = endpoint === 'chat' ? 'boolean' : 'integer';
  if (lp !== undefined && lp !== null && !hasType(lp, lpType))
    throw invalid(`'logprobs' must be ${TYPE_TEXT[lpType]}`, 'logprobs');
}

/** Throws GatewayError('invalid_request') with the offending field as `param`. */
export function parseInferenceRequest(endpoint: Endpoint, body: unknown): InferenceRequest {
  if (!isRecord(body)) throw invalid('the request body must be a JSON object', 'body');
  const model = body.model;
  if (model !== undefined && model !== null && typeof model !== 'string') {
    throw invalid("'model' must be a string", 'model');
  }
  if (body.stream !== undefined && body.stream !== null && typeof body.stream !== 'boolean') {
    throw invalid("'stream' must be a boolean", 'stream');
  }
  const so = body.stream_options;
  if (so !== undefined && so !== null && !isRecord(so)) {
    throw invalid("'stream_options' must be an object", 'stream_options');
  }
  const usage = isRecord(so) ? so.include_usage : undefined;
  if (usage !== undefined && usage !== null && typeof usage !== 'boolean')
    throw invalid("'stream_options.include_usage' must be a boolean", 'stream_options');
  // vLLM refuses stream options (a non-empty object) on a request that does not stream.
  if (isRecord(so) && Object.keys(so).length > 0 && body.stream !== true) {
    throw invalid('Stream options can only be defined when `stream=True`.', 'stream_options');
  }
  // vLLM's rule: a salt, when given, is a non-empty string (null is none). It keys the backend's
  // prefix cache and the router's chain of block hashes alike (canonical.ts, cacheRoot).
  const salt = body.cache_salt;
  if (salt !== undefined && salt !== null && (typeof salt !== 'string' || salt.length === 0)) {
    throw invalid("'cache_salt' must be a non-empty string", 'cache_salt');
  }
  const n = body.n;
  if (n !== undefined && n !== null && !(Number.isInteger(n) && (n as number) >= 1)) {
    throw invalid("'n' must be an integer of at least 1", 'n');
  }
  // OpenAI's own bound. vLLM sets none and fans a request out into n sequences: `"n": 1e300`, an
  // integer to JSON, would be work no replica can hold, and a count no ledger can add exactly.
  if (typeof n === 'number' && n > MAX_N) {
    throw invalid(`'n' must be at most ${MAX_N}`, 'n');
  }
  // max_completion_tokens is chat's; vLLM's completions request has no such field (it is ignored).
  // A completion may ask for no output at all when it echoes the prompt (prompt scoring).
  const maxTokens =
    endpoint === 'chat'
      ? (positiveInt(body, 'max_completion_tokens') ?? positiveInt(body, 'max_tokens'))
      : body.echo === true && body.max_tokens === 0
        ? 0
        : positiveInt(body, 'max_tokens');
  checkSamplingTypes(endpoint, body);
  const parts = promptParts(endpoint, body);
  const sequences = (endpoint === 'chat' ? 1 : parts.length) * (typeof n === 'number' ? n : 1);
  if (sequences > MAX_SEQUENCES) {
    throw tooManySequences(sequences, endpoint === 'completions' && parts.length > 1 ? 'prompt' : 'n');
  }
  const stream = body.stream === true;
  const assembleKind: AssembleKind = endpoint === 'chat' ? 'chat' : 'completion';
  return {
    endpoint,
    model: typeof model === 'string' && model !== '' ? model : null,
    stream,
    mode: stream ? 'stream' : assemblable(assembleKind, body) ? 'assemble' : 'passthrough',
    assembleKind,
    wantsUsage: asksForUsage(so),
    maxTokens,
    outputLimit:
      maxTokens ??
      (endpoint !== 'chat' && body.max_tokens === undefined ? COMPLETION_DEFAULT_MAX_TOKENS : null),
    promptParts: parts,
    sequences,
    readsPrefixCache: !wantsPromptLogprobs(endpoint, body),
    body,
  };
}

/** vLLM's to_sampling_params: prompt_logprobs, or on echo the (top_)logprobs count. */
function wantsPromptLogprobs(endpoint: Endpoint, body: Record<string, unknown>): boolean {
  if (body.prompt_logprobs != null) return true;
  if (body.echo !== true) return false;
  return endpoint === 'chat' ? body.top_logprobs !== null : body.logprobs != null;
}

/**
 * Whether `stream_options` asks for the usage chunk. vLLM's include_usage defaults to true once the
 * options are sent: `{}` and `{"continuous_usage_stats": true}` ask for it, `false` and `null` do
 * not. Any other value is refused when the request is parsed: `"true"`, which vLLM's lax models
 * read as true, was taken here as not asking, and the usage chunk the client asked for withheld.
 */
export function asksForUsage(so: unknown): boolean {
  return isRecord(so) && (so.include_usage === undefined || so.include_usage === true);
}
