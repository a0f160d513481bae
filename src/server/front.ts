// The gateway's front door: node:http's 'request' listener. It serves the two inference routes
// itself and hands every other request to the fastify application (app.ts).
//
//   request ──▶ begin the admission record when the request is inference-shaped:
//       │       /v1/* except GET|HEAD /v1/models (a 404 or 405 under /v1 included)
//       │       + the 'close' safety net (a client that leaves before any path ended the record)
//       │
//       ├── POST /v1/chat/completions, POST /v1/completions ──▶ key (auth.ts) ──▶ body (body.ts)
//       │       ──▶ handleInference
//       │       401 from the head, the body not parsed · 400 not application/json, or compressed ·
//       │       413 ·
//       │       400 bad JSON / __proto__ / nested > 128 deep ·
//       │       504 body not in by the request deadline, and every refusal of the pipeline,
//       │       answered here: the envelope with x-request-id, the record ended refused
//       │
//       └── anything else ──▶ fastify: models, ops routes, dashboard, 404 / 405
//               504 and the connection closed when its body is not all in by the request deadline
//
// Why the inference routes skip fastify: per request it built a request and a reply, routed, ran
// hooks and a content-type parser, and then the handler took the raw response over anyway. Serving
// them here took 0.16 to 0.24 ms off the gateway's added median TTFT and about 0.09 ms of CPU off
// each request, in one A/B run (docs/benchmarks.md, "The inference routes' own door"). Only these
// two routes carry the load; the rest stay in fastify, where a route is a line.
//
// Invariants: a request's record, when it has one, is begun here and nowhere else, and is ended
// exactly once (RequestRecord.end() ignores later calls); an inference request that throws before
// the proxy takes it gets one error envelope and one refused record.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { GatewayError, INTERNAL_MESSAGE, isGatewayError, writeErrorResponse } from '../errors/index.ts';
import type { RequestRecord } from '../telemetry/admission-log.ts';
import { requestLogger } from '../telemetry/logger.ts';
import { markStage } from '../telemetry/stages.ts';
import { type Identity, namedTenant } from './auth.ts';
import { readJsonBody } from './body.ts';
import { handleInference, proxied } from './inference.ts';
import { ENDPOINT_PATHS, type Endpoint } from './inference-request.ts';
import { header } from './intake.ts';
import { endRecord, endRefused } from './record.ts';
import { type Runtime, shuttingDownError } from './runtime.ts';

/** What the front door learnt of a request, for fastify to pick up (app.ts). */
export interface FrontFacts {
  readonly id: string;
  readonly record: RequestRecord | null;
}

const FACTS = Symbol('slagate.front');
/** Set on a request whose client sent `Expect: 100-continue` and waits for the 100 (app.ts). */
const AWAITS_CONTINUE = Symbol('slagate.continue');
type Marked = IncomingMessage & { [FACTS]?: FrontFacts; [AWAITS_CONTINUE]?: boolean };

/**
 * A request whose client sent `Expect: 100-continue`: Node leaves the 100 to the server, and the
 * gateway sends it only when it is about to read the body. A request refused on its head (a key, a
 * length over the limit, a content type) is answered without the body being sent at all.
 */
export function awaitContinue(req: IncomingMessage): void {
  (req as Marked)[AWAITS_CONTINUE] = true;
}

/** Tells a client that waits for it to send its body (a no-op for any other). */
function sendContinue(req: IncomingMessage, res: ServerResponse): void {
  if ((req as Marked)[AWAITS_CONTINUE] !== true) return;
  (req as Marked)[AWAITS_CONTINUE] = false;
  res.writeContinue();
}

/** The facts the front door attached to `req` (every request it handed to fastify has them). */
export function frontFacts(req: IncomingMessage): FrontFacts | undefined {
  return (req as Marked)[FACTS];
}

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** x-request-id is kept when it is a safe token (it reaches logs and upstream headers), else made. */
export function requestId(req: IncomingMessage): string {
  const given = req.headers['x-request-id'];
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
}

/**
 * The path a request is routed by, as fastify's router reads it: the target's scheme and authority
 * dropped when it came in absolute form (`POST http://host/v1/chat/completions`, which a server
 * must accept: RFC 9112, 3.2.2), cut at '?' or '#', and percent-decoded (reserved characters such
 * as %2F stay encoded); null when the encoding is broken (fastify answers that itself, with 400).
 */
export function routePath(target: string): string | null {
  const url = target.charCodeAt(0) === 0x2f /* / */ ? target : originForm(target);
  const q = url.indexOf('?');
  const h = url.indexOf('#');
  const end = q < 0 ? h : h < 0 ? q : Math.min(q, h);
  const path = end < 0 ? url : url.slice(0, end);
  if (!path.includes('%')) return path;
  try {
    return decodeURI(path);
  } catch {
    return null;
  }
}

/** An http(s) target in absolute form, its authority not empty: what fastify's router takes as one. */
const ABSOLUTE_FORM = /^https?:\/\/[^/?#]+/i;

/**
 * An absolute-form target without its scheme and authority: `http://h/v1/x?y` is `/v1/x?y`. Any
 * other target is returned as it is (fastify answers it: a path, or 400 for what is no URL).
 */
function originForm(target: string): string {
  const m = ABSOLUTE_FORM.exec(target);
  if (m === null || target.includes('#')) return target;
  const rest = target.slice(m[0].length);
  return rest.charCodeAt(0) === 0x2f ? rest : `/${rest}`;
}

const ENDPOINT_OF: ReadonlyMap<string, Endpoint> = new Map(
  (Object.keys(ENDPOINT_PATHS) as Endpoint[]).map((e) => [ENDPOINT_PATHS[e], e]),
);

/** The inference routes' paths, which take POST only (app.ts answers other methods with 405). */
export function isInferencePath(path: string): boolean {
  return ENDPOINT_OF.has(path);
}

/** The server's 'request' listener: inference routes here, the rest to `fallback` (fastify's). */
export function frontDoor(
  rt: Runtime,
  fallback: (req: IncomingMessage, res: ServerResponse) => void,
): (req: IncomingMessage, res: ServerResponse) => void {
  // A restart-only setting (app.ts's body limit for the other routes is fixed when it is built too):
  // read once, so that a reload that changes it changes neither.
  const bodyLimit = rt.config.server.body_limit_bytes;
  const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
    // Invariant: a request is served once its response has the connection. A pipelined request
    // (sent behind another on one connection) gets a response queued behind the one still being
    // written, and on Node 20 a queued response is never told when the connection dies: served
    // early, it would hold its record, its place in the shutdown's count and an upstream stream
    // for good. It waits for its turn; if the connection dies first, it ends as a cancel.
    if (res.socket === null) {
      const turn = () => {
        req.off('close', gone);
        onRequest(req, res);
      };
      const gone = () => {
        res.off('socket', turn);
        if (inferenceShaped(routePath(req.url ?? '/'), req.method)) {
          const record = beginRecord(rt, requestId(req), res);
          endRecord(rt, record, 'client_cancelled', { decision: null, reason: 'client_cancelled' });
        }
      };
      res.once('socket', turn);
      req.once('close', gone);
      return;
    }
    // HTTP/1.1 requires a Host header (RFC 9112, 3.2): 400, as node:http would, in the envelope.
    if (req.headers.host === undefined && req.httpVersion === '1.1') {
      refuseHostless(rt, req, res);
      return;
    }
    const id = requestId(req);
    const path = routePath(req.url ?? '/');
    const method = req.method;
    const record = inferenceShaped(path, method) ? beginRecord(rt, id, res) : null;
    // Marked for whoever meets the request later: fastify (its id, its record), and a framing
    // error in its body (answerClientError, app.ts: the answer and the record are this request's).
    (req as Marked)[FACTS] = { id, record };
    const endpoint = method === 'POST' && path !== null ? ENDPOINT_OF.get(path) : undefined;
    if (endpoint === undefined || record === null) {
      bodyDeadline(rt, req, res, id, record);
      // fastify reads the body of whatever it routes.
      sendContinue(req, res);
      fallback(req, res);
      return;
    }
    serveInference(rt, endpoint, req, res, id, record, bodyLimit);
  };
  return onRequest;
}

/**
 * Every request under /v1 is inference-shaped (a 404 there included) except listing models; it
 * has an admission record. A path whose encoding is broken gets a 400 from fastify
 * (frameworkErrors, app.ts), no record.
 */
function inferenceShaped(path: string | null, method: string | undefined): boolean {
  return (
    path?.startsWith('/v1/') === true && !(path === '/v1/models' && (method === 'GET' || method === 'HEAD'))
  );
}

/**
 * node:http's 'checkExpectation': a request whose `Expect` asks for anything but 100-continue, which
 * the gateway cannot meet (RFC 9110, 10.1.1: answered 417). The envelope with the request's id and
 * its record (when it has one) ended refused; its body is not read, and the connection is kept or
 * closed as for any request refused on its head (dropUnreadBody).
 */
export function refuseExpectation(
  rt: Runtime,
  req: IncomingMessage,
  res: ServerResponse,
  bodyLimit: number,
): void {
  const err = new GatewayError(
    'invalid_request',
    'The request asks for an expectation the gateway cannot meet: Expect takes only 100-continue.',
  );
  const id = refusedAtHead(rt, req, res, err);
  dropUnreadBody(rt, req, res, bodyLimit);
  writeErrorResponse(res, err, { 'x-request-id': id }, 417);
}

/** An HTTP/1.1 request without Host: 400 in the envelope, its record refused; the connection goes. */
function refuseHostless(rt: Runtime, req: IncomingMessage, res: ServerResponse): void {
  const err = new GatewayError('invalid_request', 'An HTTP/1.1 request must carry a Host header.', {
    param: 'host',
  });
  const id = refusedAtHead(rt, req, res, err);
  res.setHeader('connection', 'close');
  writeErrorResponse(res, err, { 'x-request-id': id });
}

/**
 * A request refused from its head before the front door routed it: its id, and its record (an
 * inference-shaped one has one) ended refused with `err`. Returns the id its answer carries.
 */
function refusedAtHead(rt: Runtime, req: IncomingMessage, res: ServerResponse, err: GatewayError): string {
  const id = requestId(req);
  const record = inferenceShaped(routePath(req.url ?? '/'), req.method) ? beginRecord(rt, id, res) : null;
  noteRefusal(rt, id, record, err, err);
  return id;
}

/**
 * Invariant: no request holds its connection by never finishing its body. fastify waits for a
 * body before it routes (a POST to /healthz, or to a /v1 path it answers 404), with no deadline of
 * its own, and node:http's requestTimeout is off (app.ts); so a request fastify gets that is not
 * all in by the request deadline (upstream.first_token_timeout_ms, as for the inference routes'
 * bodies, body.ts) is answered 504 and its connection closed.
 */
function bodyDeadline(
  rt: Runtime,
  req: IncomingMessage,
  res: ServerResponse,
  id: string,
  record: RequestRecord | null,
): void {
  const timer = setTimeout(() => {
    if (req.complete) return;
    // Answered (fastify answers some requests without their body: a 405, a 404) while the body
    // still trickles in, which Node reads and drops for as long as it comes: the connection goes.
    if (res.writableEnded) {
      req.socket.destroy();
      return;
    }
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const err = new GatewayError(
      'first_token_timeout',
      'The request body did not arrive within the request deadline.',
    );
    noteRefusal(rt, id, record, err, err);
    // fastify never gets the rest of the body (its handler would answer a second time) and the
    // connection goes as soon as the answer is written.
    req.removeAllListeners('data');
    req.removeAllListeners('end');
    res.once('finish', () => req.socket.destroy());
    writeErrorResponse(res, err, { 'x-request-id': id, connection: 'close' });
  }, rt.config.upstream.first_token_timeout_ms);
  // Until the body is all in (or the connection gone), not until the answer: an answer may come first.
  untilBodyIn(req, timer);
}

/**
 * Clears `timer` once `req`'s body is all in or its connection is gone. Removes itself: a kept
 * connection would otherwise gather one listener per request.
 */
function untilBodyIn(req: IncomingMessage, timer: NodeJS.Timeout): void {
  timer.unref();
  const clear = () => {
    clearTimeout(timer);
    req.off('end', clear);
    req.socket.off('close', clear);
  };
  req.once('end', clear);
  req.socket.once('close', clear);
}

function beginRecord(rt: Runtime, id: string, res: ServerResponse): RequestRecord {
  const record = rt.admissionLog.begin({ req_id: id });
  markStage(id, 'received');
  // Safety net: a client that leaves before any path ended the record (e.g. mid-upload) still
  // gets its one line, and so does one whose connection the shutdown cut. A record handed to the
  // proxy is the proxy's to end, even after 'close'.
  res.once('close', () => {
    if (record.ended || proxied.has(record)) return;
    if (rt.lifecycle.connectionsCut) {
      endRecord(rt, record, 'refused', { decision: 'refused', reason: 'shutting_down' });
    } else {
      // Gone before admission decided anything: no decision, not an admission.
      endRecord(rt, record, 'client_cancelled', { decision: null, reason: 'client_cancelled' });
    }
  });
  return record;
}

function serveInference(
  rt: Runtime,
  endpoint: Endpoint,
  req: IncomingMessage,
  res: ServerResponse,
  id: string,
  record: RequestRecord,
  bodyLimit: number,
): void {
  // New work is refused from the moment the shutdown begins, judged at the request's head (after
  // its key: a bad one is still a 401): a request whose upload was under way then is read and
  // served like any in flight. The refusal also ends the connection, so that a keep-alive client
  // cannot hold the shutdown open with its next request (fastify does the same once it closes).
  const arrivedClosing = rt.lifecycle.shuttingDown;
  if (arrivedClosing) res.setHeader('connection', 'close');
  // The key first, from the head: a client without a valid one costs no body parse (OpenAI and
  // vLLM answer 401 before the body too).
  const auth = rt.auth;
  const identify = (): Identity =>
    rt.auth.identify(req.headers.authorization, header(req, 'x-slagate-class'));
  let identity: Identity;
  try {
    identity = identify();
  } catch (err) {
    refuseBeforeBody(rt, req, res, id, record, err, bodyLimit);
    return;
  }
  recordIdentity(rt, identity, record);
  // Arrived after the shutdown began and waiting for a 100 before it sends its body: refused from
  // its head, with no 100 (nothing of its body is on the way, so closing the connection resets
  // nothing). One whose body is already coming is read first and then refused: a connection closed
  // under a body still arriving answers it with a reset, not the 503.
  if (arrivedClosing && (req as Marked)[AWAITS_CONTINUE] === true) {
    refuseBeforeBody(rt, req, res, id, record, shuttingDownError(), bodyLimit);
    return;
  }
  // A request in flight from its head on: a shutdown waits for it (and cuts it at the end of its
  // grace period) even while its body is still coming. Left when its response closes, whichever
  // way it ends.
  const shutdown = arrivedClosing ? null : rt.lifecycle.enter();
  if (shutdown !== null) res.once('close', () => rt.lifecycle.leave(shutdown));
  // Invariant: one answer. The grace period may end while the body is still coming: the request
  // is answered 503 shutting_down then, as every request the drain cuts is, and what the body
  // read brings later is dropped.
  let answered = false;
  const cut = () => {
    if (answered || res.headersSent) return;
    answered = true;
    res.setHeader('connection', 'close');
    refuse(rt, res, id, record, shutdown!.reason);
  };
  shutdown?.onAbort(cut);
  readJsonBody(
    req,
    bodyLimit,
    rt.config.upstream.first_token_timeout_ms,
    (err, body, raw, unread) => {
      shutdown?.offAbort(cut);
      if (answered) return;
      answered = true;
      if (err !== null) {
        // Refused from its head (its media type, its encoding, its declared length): the body is
        // still coming, and is let in and dropped, or the connection ends, as for a refused key.
        if (unread === true) {
          refuseBeforeBody(rt, req, res, id, record, err, bodyLimit);
          return;
        }
        // The connection ends after a body the gateway refused (as fastify's body stage did): the
        // rest of an oversized or endless upload is not read and discarded.
        res.setHeader('connection', 'close');
        refuse(rt, res, id, record, err);
        return;
      }
      if (shutdown === null) {
        refuse(rt, res, id, record, shuttingDownError());
        return;
      }
      // A reload while the body came may have changed the keys or removed the class the key
      // named: the request is judged by the configuration it will run under.
      if (rt.auth !== auth) {
        try {
          identity = identify();
        } catch (e) {
          // Refused for its key now: what the head's key settled no longer holds.
          record.set({ tenant: null, class: null, ttft_target_ms: null, tpot_target_ms: null });
          refuse(rt, res, id, record, e);
          return;
        }
        recordIdentity(rt, identity, record);
      }
      handleInference(
        rt,
        endpoint,
        { id, headers: req.headers, identity, res, record, shutdown },
        body,
        raw,
      ).catch((e: unknown) => refuse(rt, res, id, record, e));
    },
    record.bodyRead,
    // No closure for a request that waits for no 100 (nearly every one).
    (req as Marked)[AWAITS_CONTINUE] === true ? () => sendContinue(req, res) : undefined,
  );
}

/**
 * The tenant, class and targets the key and the class header settled, on the record: from the
 * request's head on, so that a refusal of its body (too large, malformed, too slow) is counted to
 * them too.
 */
function recordIdentity(rt: Runtime, identity: Identity, record: RequestRecord): void {
  const cls = rt.config.sla.classes[identity.class]!;
  record.set({
    tenant: namedTenant(identity),
    class: identity.class,
    ttft_target_ms: cls.ttft_p99_ms,
    tpot_target_ms: cls.tpot_p99_ms,
  });
}

/** A refusal made from the head, before the body is read (its body: dropUnreadBody). */
function refuseBeforeBody(
  rt: Runtime,
  req: IncomingMessage,
  res: ServerResponse,
  id: string,
  record: RequestRecord,
  err: unknown,
  bodyLimit: number,
): void {
  dropUnreadBody(rt, req, res, bodyLimit);
  refuse(rt, res, id, record, err);
}

/**
 * The body of a request answered before it was read. Invariant: the client sees the answer, not a
 * reset. Node reads and discards the rest of a body once the response has ended, and keeps the
 * connection, so a body of a declared length within the limit is let in (and cut at the request
 * deadline if it stalls); one of unknown or excessive length ends the connection with the answer.
 * Called before the answer's head is written.
 */
function dropUnreadBody(rt: Runtime, req: IncomingMessage, res: ServerResponse, bodyLimit: number): void {
  const length = Number(req.headers['content-length'] ?? Number.NaN);
  // A client still waiting for a 100 may never send the body: the connection goes with the answer.
  const awaited = (req as Marked)[AWAITS_CONTINUE] === true;
  if (!awaited && Number.isInteger(length) && length >= 0 && length <= bodyLimit && !req.complete) {
    const timer = setTimeout(() => {
      if (!req.complete) req.socket.destroy();
    }, rt.config.upstream.first_token_timeout_ms);
    untilBodyIn(req, timer);
  } else if (!req.complete) {
    res.setHeader('connection', 'close');
  }
}

/** A request answered before the proxy took it: the envelope, and the record ended refused. */
function refuse(rt: Runtime, res: ServerResponse, id: string, record: RequestRecord, err: unknown): void {
  const gErr = isGatewayError(err) ? err : new GatewayError('internal_error', INTERNAL_MESSAGE);
  noteRefusal(rt, id, record, gErr, err);
  writeErrorResponse(res, gErr, { 'x-request-id': id });
}

/**
 * What every answer the gateway gives itself does before it is sent (here and in fastify's error
 * handler, app.ts): an internal error is logged, and the request's record, if it has one, is ended
 * refused with the error's code.
 */
export function noteRefusal(
  rt: Runtime,
  id: string,
  record: RequestRecord | null,
  gErr: GatewayError,
  cause: unknown,
): void {
  if (gErr.code === 'internal_error') {
    // The request's admission record has its tenant and class; this line only needs to find it.
    requestLogger(rt.logger, { req_id: id, tenant: null, class: null }).error(
      { err: cause },
      'unhandled error',
    );
  }
  if (record !== null) endRefused(rt, record, gErr);
}
