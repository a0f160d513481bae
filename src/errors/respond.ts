// Everything the upstream layer writes to the client that is not an upstream byte: the error
// envelope when no attempt committed, and the SSE error event after the commit point. No
// upstream body, message or stack ever goes into either (checklist item 30).
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { GatewayError } from './gateway-error.ts';

const DONE = Buffer.from('data: [DONE]\n\n');

/**
 * A new header object: `base`'s headers, then `extra`'s. Built by assignment, not as
 * `{ ...base, more }`: in Node 20's V8, properties added to an object cloned by a spread take a
 * slow path (about 5 µs for a handful of headers, 20 µs for twenty fields; docs/benchmarks.md).
 * The request path builds no object that way.
 */
export function headersWith(base: OutgoingHttpHeaders, extra: OutgoingHttpHeaders): OutgoingHttpHeaders {
  return Object.assign({}, base, extra);
}

/**
 * Sends `err` as the whole response; returns the status sent, or null when the client is gone.
 * `status` is the code's own unless an HTTP-level refusal names another (417 for an unmet Expect).
 */
export function writeErrorResponse(
  res: ServerResponse,
  err: GatewayError,
  headers: OutgoingHttpHeaders,
  status: number = err.status,
): number | null {
  if (res.headersSent || res.destroyed) return null;
  const body = JSON.stringify(err.toJSON());
  const head = headersWith(headers, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  if (err.retryAfterS !== undefined) head['retry-after'] = String(err.retryAfterS);
  res.writeHead(status, head);
  res.end(body);
  return status;
}

/** The frames that end a committed stream that failed: one error event, then [DONE] (as vLLM does). */
export function sseErrorFrames(err: GatewayError): Buffer {
  return Buffer.concat([Buffer.from(`data: ${JSON.stringify(err.toJSON())}\n\n`), DONE]);
}
