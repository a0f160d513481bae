// What a streamed chunk is, decided two ways that agree: from its parsed JSON (carriesOutput,
// isErrorPayload) and, for the relay's hot path, from its bytes alone (isPlainOutput), which says
// yes only when the parse would find a chunk with choices carrying output and no usage (a null
// usage counts as none) or error.
// Inside a JSON string every quote is escaped, so a quoted key searched for in the bytes can only
// match a real key; a serialisation these byte patterns do not know simply takes the parse.

import type { StreamChunk } from './assemble.ts';

export const DONE = Buffer.from('[DONE]');
const CHOICES = Buffer.from('"choices":[{');
const USAGE = Buffer.from('"usage"');
const USAGE_NULL = Buffer.from('"usage":null');
const ERROR = Buffer.from('"error"');
const CONTENT = Buffer.from('"content":"');
const TEXT = Buffer.from('"text":"');
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN = 0x7b;
const CLOSE = 0x7d;

/**
 * True when `data` is certainly a chunk with choices, carrying output, with no usage and no error:
 * what JSON.parse + carriesOutput would find, read from the bytes (see the header comment).
 */
export function isPlainOutput(data: Buffer): boolean {
  if (data[0] !== OPEN || data[data.length - 1] !== CLOSE) return false;
  const choices = data.indexOf(CHOICES);
  if (choices < 0 || data.indexOf(ERROR) >= 0 || !noUsage(data)) return false;
  return nonEmptyString(data, CONTENT, choices) || nonEmptyString(data, TEXT, choices);
}

/** No usage key, or only `"usage":null` (vLLM's completion chunks carry it on every token). */
function noUsage(data: Buffer): boolean {
  const at = data.indexOf(USAGE);
  if (at < 0) return true;
  return data.indexOf(USAGE_NULL) === at && data.indexOf(USAGE, at + 1) < 0;
}

function nonEmptyString(data: Buffer, key: Buffer, from: number): boolean {
  const at = data.indexOf(key, from);
  return at >= 0 && data[at + key.length] !== QUOTE;
}

/**
 * The byte shape of one stream's plain output chunks: a backend serialises every token chunk of a
 * stream the same way, so they differ only inside the output string (the id, the model, the
 * keys around it are the stream's own). test() is isPlainOutput, and a cheaper way to the same
 * yes: the bytes before and after the output string of the last chunk it accepted in full are
 * compared with this chunk's, and what lies between them must be a non-empty string body without
 * a quote or a backslash. Such a chunk is that chunk with other output text: it parses to the same
 * structure, with output. (isPlainOutput, which matches its keys anywhere in the bytes, leaves a
 * chunk whose text is `usage` or `error` to the parse; this accepts it, rightly.) Anything else
 * (another shape, an escape in the text, no text) takes isPlainOutput.
 */
export class OutputShape {
  #head: Buffer | null = null;
  #tail: Buffer | null = null;

  test(data: Buffer): boolean {
    const head = this.#head;
    const tail = this.#tail;
    if (head !== null && tail !== null) {
      const end = data.length - tail.length;
      if (
        end > head.length &&
        data.compare(head, 0, head.length, 0, head.length) === 0 &&
        data.compare(tail, 0, tail.length, end, data.length) === 0 &&
        plainText(data, head.length, end)
      ) {
        return true;
      }
    }
    if (!isPlainOutput(data)) return false;
    this.#learn(data);
    return true;
  }

  /** Keeps the bytes around the output string isPlainOutput found non-empty (content, else text). */
  #learn(data: Buffer): void {
    const choices = data.indexOf(CHOICES);
    let start = data.indexOf(CONTENT, choices);
    if (start >= 0 && data[start + CONTENT.length] !== QUOTE) start += CONTENT.length;
    else start = data.indexOf(TEXT, choices) + TEXT.length;
    let end = start;
    while (end < data.length && data[end] !== QUOTE) {
      if (data[end] === BACKSLASH) return; // an escape: the end of the string is not this quote
      end++;
    }
    if (end === data.length) return;
    // isPlainOutput reads keys, not the JSON: it accepts some broken JSON (an unescaped quote in
    // the text). A shape is learned only from a chunk that parses, once per shape: then the bytes
    // around the text are a real key's string and the structure around it.
    let msg: StreamChunk | null;
    try {
      msg = JSON.parse(data.toString('utf8')) as StreamChunk | null;
    } catch {
      return;
    }
    if (isErrorPayload(msg) || msg?.usage != null || !Array.isArray(msg?.choices)) return;
    if (!carriesOutput(msg.choices)) return;
    this.#head = Buffer.from(data.subarray(0, start));
    this.#tail = Buffer.from(data.subarray(end));
  }
}

/** No quote and no backslash in data[from, to): a string body with no escape and no end. */
function plainText(data: Buffer, from: number, to: number): boolean {
  for (let i = from; i < to; i++) {
    const c = data[i];
    if (c === QUOTE || c === BACKSLASH) return false;
  }
  return true;
}

/** A chunk choice with generated output: text, content, reasoning or a tool call (not the role chunk). */
export function carriesOutput(choices: unknown[]): boolean {
  for (const c of choices) {
    if (c === null || typeof c !== 'object') continue;
    const { text, delta } = c as { text?: unknown; delta?: Record<string, unknown> | null };
    if (typeof text === 'string' && text.length > 0) return true;
    if (delta != null && typeof delta === 'object') {
      // The reasoning channel is `reasoning` in current vLLM, `reasoning_content` in earlier releases.
      const { content, reasoning, reasoning_content: reasoningContent, tool_calls: calls } = delta;
      if (typeof content === 'string' && content.length > 0) return true;
      if (typeof reasoning === 'string' && reasoning.length > 0) return true;
      if (typeof reasoningContent === 'string' && reasoningContent.length > 0) return true;
      if (Array.isArray(calls) && calls.length > 0) return true;
    }
  }
  return false;
}

/** vLLM's in-band error: `{"error":{...}}`, or the flat `{"object":"error",...}` of older versions. */
export function isErrorPayload(msg: StreamChunk | null): boolean {
  return msg !== null && typeof msg === 'object' && (msg.error != null || msg.object === 'error');
}

/**
 * The HTTP status an error body names and its message: from `error` when it is an object (vLLM's
 * envelope), else from the body itself (vLLM's older flat error), and for a body whose `error` is
 * a string (vLLM's 401), that string as the message. Each null when absent or not of its type.
 * Read for an in-band error and for a 4xx body alike.
 */
export function errorPayloadFacts(msg: StreamChunk | null): {
  code: number | null;
  message: string | null;
  param: string | null;
} {
  if (msg === null || typeof msg !== 'object') return { code: null, message: null, param: null };
  const inner = msg.error;
  const e = (inner !== null && typeof inner === 'object' ? inner : msg) as {
    code?: unknown;
    message?: unknown;
    param?: unknown;
  };
  const message = typeof e.message === 'string' ? e.message : typeof inner === 'string' ? inner : null;
  // The field vLLM names (a request field: short); anything longer is not one.
  const param = typeof e.param === 'string' && e.param.length <= 128 ? e.param : null;
  return { code: Number.isInteger(e.code) ? (e.code as number) : null, message, param };
}
