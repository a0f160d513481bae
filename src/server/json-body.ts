// A JSON request body: its bytes as text, parsed, and refused when it carries a key that a later
// merge or copy could turn into prototype pollution: an own `__proto__` key on any object, or a
// `constructor` key holding an object that has a `prototype` (fastify's default parser refuses the
// same two, with secure-json-parse); refused too when its objects and arrays nest deeper than
// MAX_DEPTH. JSON.parse takes any depth, but the gateway stringifies parts of the body again (the
// canonical prompt's tool definitions and content parts, a re-serialised upstream body), and
// JSON.stringify recurses: a 10 KB body nested 5,000 deep overflowed the stack there, a 500 after
// admission instead of a 400 before it.
//
// The check walks the parsed value, visiting its objects and arrays, never the text: a prompt's
// characters are one string value, so an 8,000-token prompt costs what a short one does. (A scan
// of the text for those keys, written plainly or with \u escapes, read all 42 KB of such a body
// twice: about 35 µs on the event loop, more than parsing it.)
//
// Parsing an object or array and walking it costs about a microsecond each, and an object's key
// about as much: a body of 4 MiB made of a million `[1],` (in any field, a known one or not) held
// every other stream for seconds, and one object of 360,000 keys for most of a second, before
// admission could refuse anything (where a plain 4 MiB prompt parses in about 30 ms). A body of more
// than MAX_CONTAINERS objects and arrays, or MAX_KEYS keys, is refused before it is parsed. A body
// too short to hold more than a cap is not counted (an object or array takes two bytes at least,
// `[]`, nested; a key five, `"":0,` with the comma its next one needs): an 8,000-token prompt's body
// is counted for its brackets alone, and only one of 250,000 bytes or more for its colons, whose
// count costs about a microsecond per hundred of them. A longer one is counted: its `{` and `[` bytes, or its `:` bytes
// (Buffer.indexOf, at memchr's pace), settle it for nearly every body, and
// only one with more than a cap of them, strings included (a long prompt of code, say), is read
// byte by byte to count those outside strings. What is left is bounded by the size limit: an array
// of two million numbers parses in under 0.1 s.
import { isUtf8 } from 'node:buffer';
import { GatewayError } from '../errors/index.ts';

/** Deepest nesting of objects and arrays a body may have (the body itself is depth 1). */
export const MAX_DEPTH = 128;
/**
 * Most objects and arrays a body may hold in all: a conversation of thousands of turns with
 * content parts, or a hundred tools with their schemas, holds a few thousand.
 */
export const MAX_CONTAINERS = 10_000;
/** Most keys a body's objects may hold in all: a `logit_bias` of a few hundred, schemas of thousands. */
export const MAX_KEYS = 50_000;

/** The parsed body; throws GatewayError('invalid_request') for empty or malformed JSON and for a forbidden key. */
export function parseJsonBody(bytes: Buffer): unknown {
  // Decoding would put U+FFFD in place of a bad byte, and the backend would get another text than
  // the client sent; vLLM refuses such a body, and so does the gateway.
  if (!isUtf8(bytes)) throw invalidBody('Request body is not valid UTF-8.');
  if (bytes.length > 2 * MAX_CONTAINERS && bytesOver(bytes, OPENERS, MAX_CONTAINERS)) {
    if (outsideStringsOver(bytes, OPENERS, MAX_CONTAINERS))
      throw invalidBody(`Request body holds more than ${MAX_CONTAINERS} JSON objects and arrays.`);
  }
  if (bytes.length > 5 * MAX_KEYS && bytesOver(bytes, COLON, MAX_KEYS)) {
    if (outsideStringsOver(bytes, COLON, MAX_KEYS))
      throw invalidBody(`Request body holds more than ${MAX_KEYS} keys in its objects.`);
  }
  let text = bytes.toString('utf8');
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  if (text.length === 0) throw invalidBody('Request body is empty; it must be a JSON object.');
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalidBody('Request body is not valid JSON.');
  }
  const problem = shapeProblem(value);
  if (problem !== null) throw invalidBody(problem);
  return value;
}

const OPEN_BRACE = 0x7b;
const OPEN_BRACKET = 0x5b;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** The bytes that open an object or an array. */
const OPENERS = [OPEN_BRACE, OPEN_BRACKET] as const;
/** The byte that ends each key. */
const COLON = [0x3a] as const;

/** Whether `bytes` hold more than `cap` bytes of `which`, wherever they are. */
function bytesOver(bytes: Buffer, which: readonly number[], cap: number): boolean {
  let n = 0;
  for (const b of which) {
    for (let at = bytes.indexOf(b); at !== -1; at = bytes.indexOf(b, at + 1)) {
      if (++n > cap) return true;
    }
  }
  return false;
}

/**
 * Whether `bytes` hold more than `cap` bytes of `which` outside strings. A JSON string ends at a
 * quote no backslash escapes (the text may be malformed: then JSON.parse refuses it, whatever this
 * counts).
 */
function outsideStringsOver(bytes: Buffer, which: readonly number[], cap: number): boolean {
  const [a, b = a] = which;
  let n = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const c = bytes[i];
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) inString = true;
    else if ((c === a || c === b) && ++n > cap) return true;
  }
  return false;
}

function invalidBody(message: string): GatewayError {
  return new GatewayError('invalid_request', message, { param: 'body' });
}

/**
 * Why the parsed `value` must be refused, or null: an object inside it (itself included) has an own
 * `__proto__`, or a `constructor` object with a `prototype`; or it nests deeper than MAX_DEPTH.
 */
export function shapeProblem(value: unknown): string | null {
  if (value === null || typeof value !== 'object') return null;
  const stack: object[] = [value];
  // The depth of each node on `stack`, at the same index.
  const depths: number[] = [1];
  while (stack.length > 0) {
    const node = stack.pop()!;
    const depth = depths.pop()!;
    if (depth > MAX_DEPTH) return `Request body nests objects and arrays deeper than ${MAX_DEPTH} levels.`;
    if (Array.isArray(node)) {
      // Index order, not for…in: a token-id prompt is thousands of numbers, none of them visited twice.
      for (let i = 0; i < node.length; i++) {
        const v: unknown = node[i];
        if (v !== null && typeof v === 'object') {
          stack.push(v);
          depths.push(depth + 1);
        }
      }
      continue;
    }
    if (Object.hasOwn(node, '__proto__')) return FORBIDDEN;
    const ctor = Object.hasOwn(node, 'constructor')
      ? (node as { constructor: unknown }).constructor
      : undefined;
    if (ctor !== null && typeof ctor === 'object' && Object.hasOwn(ctor, 'prototype')) return FORBIDDEN;
    for (const key of Object.keys(node)) {
      const v: unknown = (node as Record<string, unknown>)[key];
      if (v !== null && typeof v === 'object') {
        stack.push(v);
        depths.push(depth + 1);
      }
    }
  }
  return null;
}

const FORBIDDEN = 'Request body has a forbidden key: `__proto__`, or `constructor` holding a `prototype`.';
