// An inference request's body, read off node:http: its media type, its size, its bytes parsed
// (json-body.ts). What fastify's body stage did for these routes, with the same answers:
//
//   content-type not application/json (with a body)  → 400 invalid_request, param content-type
//     (no content-type and no body: the body is undefined, and intake refuses it; one difference:
//     fastify took a text/plain body as a string, which intake then refused after the API key as
//     not a JSON object, and here it is refused at once by its media type)
//   content-length over the limit                     → 413 body_too_large, before any byte is read
//   bytes over the limit while reading                → 413 body_too_large, the rest discarded
//   the body not all there within the request deadline  → 504 first_token_timeout (a client that
//     stops sending mid-body would otherwise hold its connection for good: the request's deadline,
//     upstream.first_token_timeout_ms, runs from its arrival, and a body still arriving at it
//     could not have been answered in time anyway)
//   bytes that are not a JSON value, poisoned, or nested deeper than 128 → 400 invalid_request, param body
//
// After a refusal made while reading (too large, not JSON, too slow) the front door closes the
// connection, as fastify did, so the rest of an oversized or endless upload is never read. One made
// from the head (media type, encoding, declared length: `unread`) is answered as a refused key is
// (front.ts, dropUnreadBody): a body of a declared length within the limit is let in and dropped,
// so the client reads the answer rather than a reset; any other ends the connection.
//
// Invariants: `done` is called at most once; it is never called for a request whose connection
// closed mid-body (the front door's 'close' safety net ends that record); the bytes handed on are
// the body exactly as received, in one buffer (upstream/payload.ts builds the upstream body from
// them).
import type { IncomingMessage } from 'node:http';
import { GatewayError } from '../errors/index.ts';
import { parseJsonBody } from './json-body.ts';

/**
 * `unread`: the refusal was made from the head, before any byte of the body was asked for (its
 * media type, its encoding, its declared length), so the body is still on its way.
 */
export type BodyDone = (
  err: GatewayError | null,
  body: unknown,
  raw: Buffer | null,
  unread?: boolean,
) => void;

/** The 413's message names the limit, so that the client knows how far over it was (`server.body_limit_bytes`). */
export const bodyTooLarge = (limit: number): GatewayError =>
  new GatewayError('body_too_large', `Request body is over the gateway's limit of ${limit} bytes.`);

/** True when `header` names application/json (any case, parameters allowed). */
export function isJsonMediaType(header: string): boolean {
  const semi = header.indexOf(';');
  return (semi < 0 ? header : header.slice(0, semi)).trim().toLowerCase() === 'application/json';
}

/**
 * `onRead`, if given, is called once the body's last byte is in, before it is parsed;
 * `beforeRead` once the head's checks have passed, before the first byte is asked for (a client
 * that sent `Expect: 100-continue` is told to send it then).
 */
export function readJsonBody(
  req: IncomingMessage,
  limit: number,
  deadlineMs: number,
  done: BodyDone,
  onRead?: () => void,
  beforeRead?: () => void,
): void {
  const { headers } = req;
  const type = headers['content-type'];
  const length = headers['content-length'];
  if (
    type === undefined &&
    headers['transfer-encoding'] === undefined &&
    (length === undefined || length === '0')
  ) {
    done(null, undefined, null);
    return;
  }
  if (type === undefined || !isJsonMediaType(type)) {
    done(
      new GatewayError('invalid_request', "Content-Type must be 'application/json'.", {
        param: 'content-type',
      }),
      undefined,
      null,
      true,
    );
    return;
  }
  // A compressed body would be refused as bytes that are not UTF-8, which names the wrong fault.
  const encoding = headers['content-encoding'];
  if (encoding !== undefined && encoding.trim().toLowerCase() !== 'identity') {
    done(
      new GatewayError(
        'invalid_request',
        `Content-Encoding '${encoding.slice(0, 32)}' is not supported; send the body uncompressed.`,
        {
          param: 'content-encoding',
        },
      ),
      undefined,
      null,
      true,
    );
    return;
  }
  if (length !== undefined && Number(length) > limit) {
    done(bodyTooLarge(limit), undefined, null, true);
    return;
  }
  beforeRead?.();
  const chunks: Buffer[] = [];
  let received = 0;
  const off = (): void => {
    clearTimeout(timer);
    req.off('data', onData);
    req.off('end', onEnd);
    req.off('error', onError);
  };
  const onDeadline = (): void => {
    off();
    done(
      new GatewayError(
        'first_token_timeout',
        `The request body did not arrive within the request deadline (${deadlineMs} ms).`,
      ),
      undefined,
      null,
    );
  };
  const onData = (chunk: Buffer): void => {
    received += chunk.length;
    if (received > limit) {
      off();
      // Node discards the rest of the body once the response has ended.
      done(bodyTooLarge(limit), undefined, null);
      return;
    }
    chunks.push(chunk);
  };
  const onEnd = (): void => {
    off();
    onRead?.();
    const raw = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, received);
    let body: unknown;
    try {
      body = parseJsonBody(raw);
    } catch (err) {
      done(err as GatewayError, undefined, null);
      return;
    }
    done(null, body, raw);
  };
  const onError = (): void => {
    off();
    // The connection is gone: there is no one to answer, and the safety net ends the record.
    if (req.socket === null || req.socket.destroyed) return;
    done(
      new GatewayError('invalid_request', 'Request body could not be read.', { param: 'body' }),
      undefined,
      null,
    );
  };
  const timer = setTimeout(onDeadline, deadlineMs);
  timer.unref();
  req.on('data', onData);
  req.on('end', onEnd);
  req.on('error', onError);
}
