// Turns a client's JSON body into the few facts the gateway decides on, and rejects what no
// backend could serve. The body itself is forwarded unchanged (bar stream_options), so this file
// checks only what the gateway reads; vLLM validates the rest.

import { GatewayError } from './errors.ts';

export type Endpoint = 'chat' | 'completions';

export const ENDPOINT_PATHS: Readonly<Record<Endpoint, string>> = Object.freeze({
  chat: '/v1/chat/completions',
  completions: '/v1/completions',
});

export interface InferenceRequest {
  endpoint: Endpoint;
  model: string;
  stream: boolean;
  /** The client asked for the usage chunk (stream_options.include_usage). */
  wantsUsage: boolean;
  /** max_completion_tokens ?? max_tokens, or null when the client set none. */
  maxTokens: number | null;
  /** The text the prompt is made of, in order: one entry per message (chat) or prompt. */
  promptParts: string[];
  /** The body as received; proxied with stream_options rewritten. */
  body: Record<string, unknown>;
}

function invalid(message: string, param: string): GatewayError {
  return new GatewayError('invalid_request', message, { param });
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
    let text = '';
    for (const part of content) {
      if (isRecord(part) && part.type === 'text' && typeof part.text === 'string') text += part.text;
    }
    return text;
  }
  throw invalid(`'messages[${index}].content' must be a string or an array of parts`, `messages`);
}

function promptParts(endpoint: Endpoint, body: Record<string, unknown>): string[] {
  if (endpoint === 'chat') {
    const messages = body.messages;
    if (!Array.isArray(messages) || messages.length === 0) {
      throw invalid("'messages' must be a non-empty array", 'messages');
    }
    return messages.map((m, i) => {
      if (!isRecord(m) || typeof m.role !== 'string') {
        throw invalid(`'messages[${i}]' must be an object with a string 'role'`, 'messages');
      }
      return messageText(m.content, i);
    });
  }
  const prompt = body.prompt;
  if (typeof prompt === 'string') return [prompt];
  if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((p) => typeof p === 'string')) {
    return prompt as string[];
  }
  throw invalid("'prompt' must be a string or a non-empty array of strings", 'prompt');
}

/** Throws GatewayError('invalid_request') with the offending field as `param`. */
export function parseInferenceRequest(endpoint: Endpoint, body: unknown): InferenceRequest {
  if (!isRecord(body)) throw invalid('the request body must be a JSON object', 'body');
  if (typeof body.model !== 'string' || body.model === '') {
    throw invalid("'model' must be a non-empty string", 'model');
  }
  if (body.stream !== undefined && body.stream !== null && typeof body.stream !== 'boolean') {
    throw invalid("'stream' must be a boolean", 'stream');
  }
  const so = body.stream_options;
  if (so !== undefined && so !== null && !isRecord(so)) {
    throw invalid("'stream_options' must be an object", 'stream_options');
  }
  const n = body.n;
  if (n !== undefined && n !== null && n !== 1) throw invalid("only 'n': 1 is supported", 'n');
  const maxTokens = positiveInt(body, 'max_completion_tokens') ?? positiveInt(body, 'max_tokens');
  return {
    endpoint,
    model: body.model,
    stream: body.stream === true,
    wantsUsage: isRecord(so) && so.include_usage === true,
    maxTokens,
    promptParts: promptParts(endpoint, body),
    body,
  };
}
