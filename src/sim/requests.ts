// Validation of the simulator's request bodies into what the engine needs. Only what a
// stand-in for vLLM must honour is read (model, messages/prompt, max_tokens,
// max_completion_tokens, ignore_eos, stream, stream_options.include_usage, truncate_prompt_tokens,
// seed, n, cache_salt); other sampling fields are accepted and ignored, as they do not change timing.

import type { ChatMessageInput, ContentPart, Tokenizer } from '../tokenizer/tokenizer.ts';
import { TokenizeError } from '../tokenizer/tokenizer.ts';
import { HttpError, type Kind } from './wire.ts';

/** vLLM's CompletionRequest.max_tokens default (chat has none: to the end of the context). */
const COMPLETION_DEFAULT_MAX_TOKENS = 16;

export interface GenerationRequest {
  kind: Kind;
  model: string;
  promptTokens: number[];
  /** From the body; undefined = up to the context limit. */
  maxTokens: number | undefined;
  ignoreEos: boolean;
  stream: boolean;
  includeUsage: boolean;
  seed: number | undefined;
  /** Choices to generate: n engine requests of one prompt, as vLLM fans a request out. */
  n: number;
  /** vLLM's cache_salt: its prompt shares cached blocks only with requests under the same salt. */
  cacheSalt: string | undefined;
  /**
   * vLLM's skip_reading_prefix_cache: set when the request wants its prompt's logprobs
   * (`prompt_logprobs`, or on `echo` the completion's `logprobs` or chat's `top_logprobs`,
   * default 0): such a prompt is prefilled whole, its blocks cached for others.
   */
  skipReadingPrefixCache: boolean;
}

type Body = Record<string, unknown>;

/** Most choices one simulated request may ask for. */
const MAX_N = 256;

/** FastAPI's validation errors carry the type phrase "Bad Request", not "BadRequestError". */
export function validationError(message: string, param: string | null = null): HttpError {
  return new HttpError(400, message, 'Bad Request', param);
}

export function parseJsonBody(raw: string): Body {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (e) {
    throw validationError(`JSON decode error: ${e instanceof Error ? e.message : String(e)}`);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw validationError('Input should be a valid dictionary or object to extract fields from');
  }
  return body as Body;
}

/** The served model the body names; an absent, null or empty model means the (only) served one, as in vLLM. */
export function resolveModel(body: Body, served: string): string {
  const model = body.model;
  if (model === undefined || model === null || model === '') return served;
  if (typeof model !== 'string') throw validationError('model: Input should be a valid string', 'model');
  if (model !== served)
    throw new HttpError(404, `The model \`${model}\` does not exist.`, 'NotFoundError', 'model');
  return model;
}

export function parseGeneration(
  kind: Kind,
  body: Body,
  served: string,
  tokenizer: Tokenizer,
  maxModelLen = Number.POSITIVE_INFINITY,
): GenerationRequest {
  const model = resolveModel(body, served);
  const n = optionalInt(body, 'n') ?? 1;
  if (n < 1) throw validationError(`n must be at least 1, got ${n}.`, 'n');
  // vLLM sets no bound; a simulated replica keeps its one loop to a size a real engine could batch.
  if (n > MAX_N) throw validationError(`The simulator serves at most ${MAX_N} choices, got ${n}.`, 'n');
  const stream = optionalBool(body, 'stream') ?? false;
  const options = body.stream_options;
  let includeUsage = false;
  if (options !== undefined && options !== null) {
    if (typeof options !== 'object' || Array.isArray(options)) {
      throw validationError('stream_options: Input should be an object', 'stream_options');
    }
    // vLLM tests the options for truth: an empty object passes a request that does not stream.
    if (!stream && Object.keys(options).length > 0)
      throw validationError('Stream options can only be defined when `stream=True`.', 'stream_options');
    // include_usage defaults to true once stream_options is sent, as in vLLM's StreamOptions.
    includeUsage = optionalBool(options as Body, 'include_usage') ?? !('include_usage' in options);
  }
  // Chat prefers max_completion_tokens (OpenAI's newer name) over max_tokens, as vLLM does. A
  // completion that leaves max_tokens out gets vLLM's default of 16; sent as null (as a chat
  // request's absent limit) it may generate to the end of the context.
  const maxTokens =
    (kind === 'chat' ? optionalInt(body, 'max_completion_tokens') : undefined) ??
    optionalInt(body, 'max_tokens') ??
    (kind !== 'chat' && body.max_tokens === undefined ? COMPLETION_DEFAULT_MAX_TOKENS : undefined);
  if (maxTokens !== undefined && maxTokens < 1) {
    throw new HttpError(
      400,
      `max_tokens must be at least 1, got ${maxTokens}.`,
      'BadRequestError',
      'max_tokens',
    );
  }
  return {
    kind,
    model,
    promptTokens: truncated(promptTokensOf(kind, body, tokenizer), body, maxModelLen),
    maxTokens,
    ignoreEos: optionalBool(body, 'ignore_eos') ?? false,
    stream,
    includeUsage,
    seed: optionalInt(body, 'seed'),
    n,
    cacheSalt: cacheSaltOf(body),
    skipReadingPrefixCache:
      body.prompt_logprobs != null ||
      (body.echo === true && (kind === 'chat' ? body.top_logprobs !== null : body.logprobs != null)),
  };
}

/** vLLM's rule: a cache_salt, when given (not null), is a non-empty string. */
export function cacheSaltOf(body: Body): string | undefined {
  const salt = body.cache_salt;
  if (salt === undefined || salt === null) return undefined;
  if (typeof salt !== 'string' || salt.length === 0) {
    throw validationError("Parameter 'cache_salt' must be a non-empty string if provided.", 'cache_salt');
  }
  return salt;
}

/**
 * vLLM's truncate_prompt_tokens: the prompt's last N tokens, or its last max_model_len with -1; it
 * is applied before the context length is checked.
 */
function truncated(tokens: number[], body: Body, maxModelLen: number): number[] {
  const n = optionalInt(body, 'truncate_prompt_tokens');
  if (n === undefined) return tokens;
  if (n < -1 || n === 0) {
    throw validationError(
      'truncate_prompt_tokens: Input should be greater than or equal to -1',
      'truncate_prompt_tokens',
    );
  }
  const keep = n === -1 ? maxModelLen : n;
  return tokens.length > keep ? tokens.slice(tokens.length - keep) : tokens;
}

/** Prompt token ids of a chat (`messages`) or completion (`prompt`) body. */
export function promptTokensOf(
  kind: Kind,
  body: Body,
  tokenizer: Tokenizer,
  addGenerationPrompt = true,
): number[] {
  try {
    if (kind === 'chat') return tokenizer.encodeChat(parseMessages(body.messages), addGenerationPrompt);
    return parsePrompt(body.prompt, tokenizer);
  } catch (e) {
    if (e instanceof TokenizeError) throw new HttpError(400, e.message, 'BadRequestError', 'messages');
    throw e;
  }
}

function parseMessages(messages: unknown): ChatMessageInput[] {
  if (!Array.isArray(messages) || messages.length === 0) {
    throw validationError('messages: must be a non-empty list of messages', 'messages');
  }
  return messages.map((m, i) => {
    if (typeof m !== 'object' || m === null || typeof (m as Body).role !== 'string') {
      throw validationError(`messages[${i}]: each message needs a string "role"`, 'messages');
    }
    const content = (m as Body).content;
    if (
      content !== undefined &&
      content !== null &&
      typeof content !== 'string' &&
      !(Array.isArray(content) && content.every((p) => typeof p === 'object' && p !== null))
    ) {
      throw validationError(
        `messages[${i}].content: must be a string or a list of content parts`,
        'messages',
      );
    }
    return {
      role: (m as Body).role as string,
      content: content as string | ContentPart[] | null | undefined,
    };
  });
}

function parsePrompt(prompt: unknown, tokenizer: Tokenizer): number[] {
  // One prompt only: a string, a list of token ids, or a one-element list of either.
  const single =
    Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] !== 'number' ? prompt[0] : prompt;
  if (typeof single === 'string') return tokenizer.encodePrompt(single);
  if (Array.isArray(single) && single.length > 0 && single.every((t) => Number.isInteger(t) && t >= 0)) {
    return single as number[];
  }
  if (Array.isArray(prompt) && prompt.length > 1) {
    throw new HttpError(400, 'The simulator supports one prompt per request.', 'BadRequestError', 'prompt');
  }
  throw validationError('prompt: must be a string or a list of token ids', 'prompt');
}

function optionalInt(body: Body, key: string): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v)) {
    throw validationError(`${key}: Input should be a valid integer`, key);
  }
  return v;
}

function optionalBool(body: Body, key: string): boolean | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw validationError(`${key}: Input should be a valid boolean`, key);
  return v;
}
