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

/** A chunk choice with generated output: text, content, reasoning or a tool call (not the role chunk). */
export function carriesOutput(choices: unknown[]): boolean {
  for (const c of choices) {
    if (c === null || typeof c !== 'object') continue;
    const { text, delta } = c as { text?: unknown; delta?: Record<string, unknown> | null };
    if (typeof text === 'string' && text.length > 0) return true;
    if (delta != null && typeof delta === 'object') {
      const { content, reasoning_content: reasoning, tool_calls: calls } = delta;
      if (typeof content === 'string' && content.length > 0) return true;
      if (typeof reasoning === 'string' && reasoning.length > 0) return true;
      if (Array.isArray(calls) && calls.length > 0) return true;
    }
  }
  return false;
}

/** vLLM's in-band error: `{"error":{...}}`, or the flat `{"object":"error",...}` of older versions. */
export function isErrorPayload(msg: StreamChunk | null): boolean {
  return msg !== null && typeof msg === 'object' && (msg.error != null || msg.object === 'error');
}
