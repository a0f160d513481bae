// A JSON request body: its bytes as text, parsed, and refused when it carries a key that a later
// merge or copy could turn into prototype pollution: an own `__proto__` key on any object, or a
// `constructor` key holding an object that has a `prototype` (fastify's default parser refuses the
// same two, with secure-json-parse).
//
// The check walks the parsed value, visiting its objects and arrays, never the text: a prompt's
// characters are one string value, so an 8,000-token prompt costs what a short one does. (A scan
// of the text for those keys, written plainly or with \u escapes, read all 42 KB of such a body
// twice: about 35 µs on the event loop, more than parsing it.)
import { GatewayError } from '../errors/index.ts';

/** The parsed body; throws GatewayError('invalid_request') for empty or malformed JSON and for a forbidden key. */
export function parseJsonBody(bytes: Buffer): unknown {
  let text = bytes.toString('utf8');
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  if (text.length === 0) throw invalidBody('Request body is empty; it must be a JSON object.');
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw invalidBody('Request body is not valid JSON.');
  }
  if (hasForbiddenKey(value)) {
    throw invalidBody(
      'Request body has a forbidden key: `__proto__`, or `constructor` holding a `prototype`.',
    );
  }
  return value;
}

function invalidBody(message: string): GatewayError {
  return new GatewayError('invalid_request', message, { param: 'body' });
}

/** Any object inside `value` (itself included) has an own `__proto__`, or a `constructor` object with a `prototype`. */
export function hasForbiddenKey(value: unknown): boolean {
  if (value === null || typeof value !== 'object') return false;
  const stack: object[] = [value];
  while (stack.length > 0) {
    const node = stack.pop()!;
    if (Array.isArray(node)) {
      // Index order, not for…in: a token-id prompt is thousands of numbers, none of them visited twice.
      for (let i = 0; i < node.length; i++) {
        const v: unknown = node[i];
        if (v !== null && typeof v === 'object') stack.push(v);
      }
      continue;
    }
    if (Object.hasOwn(node, '__proto__')) return true;
    const ctor = Object.hasOwn(node, 'constructor')
      ? (node as { constructor: unknown }).constructor
      : undefined;
    if (ctor !== null && typeof ctor === 'object' && Object.hasOwn(ctor, 'prototype')) return true;
    for (const key of Object.keys(node)) {
      const v: unknown = (node as Record<string, unknown>)[key];
      if (v !== null && typeof v === 'object') stack.push(v);
    }
  }
  return false;
}
