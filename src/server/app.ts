// The fastify application: every route but the two inference routes, which the front door serves
// itself (front.ts), and the answers for what no route takes.
//
//   front door (front.ts) ── not POST to an inference route ──▶ fastify
//       │   (a /v1 request's admission record is already begun: frontFacts(request.raw))
//   body parse ──── 413 body_too_large, 400 bad JSON / __proto__ ──▶ error handler ─┐
//       │           (json-body.ts: parsed, then its objects walked for the keys)    │
//       │           (unknown route: 404 route_not_found, not-found handler) ─────▶─┤
//       │           (known path, other method: 405 method_not_allowed + Allow) ──▶─┤
//   handler: /v1/models, /healthz, /readyz, /metrics, /admin/state, the dashboard   │
//                                                                                    ▼
//                                                              endRefused(reason = code)
//
// Invariant: a /v1 request's record is ended exactly once (RequestRecord.end() ignores later
// calls, so the front door's safety net can never add a second line); every record is counted in
// the metrics by the same call that writes it (record.ts).

import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  LogController,
} from 'fastify';
import { GatewayError, INTERNAL_MESSAGE, isGatewayError } from '../errors/index.ts';
import { bodyTooLarge } from './body.ts';
import {
  awaitContinue,
  frontDoor,
  frontFacts,
  isInferencePath,
  noteRefusal,
  refuseExpectation,
  requestId,
  routePath,
} from './front.ts';
import { parseJsonBody } from './json-body.ts';
import { registerOpsRoutes } from './ops-routes.ts';
import { endRefused } from './record.ts';
import type { Runtime } from './runtime.ts';

/** Maps what fastify itself throws (parsing, limits) onto the gateway's stable codes. */
function toGatewayError(err: FastifyError | Error, bodyLimit: number): GatewayError {
  if (isGatewayError(err)) return err;
  const status = (err as FastifyError).statusCode;
  if (status === 413) return bodyTooLarge(bodyLimit);
  if (status === 415) {
    return new GatewayError('invalid_request', "Content-Type must be 'application/json'.", {
      param: 'content-type',
    });
  }
  if (status !== undefined && status >= 400 && status < 500) {
    return new GatewayError('invalid_request', 'Request body is not valid JSON.', { param: 'body' });
  }
  return new GatewayError('internal_error', INTERNAL_MESSAGE);
}

export function sendError(reply: FastifyReply, err: GatewayError): FastifyReply {
  reply.code(err.status).header('x-request-id', reply.request.id);
  if (err.retryAfterS !== undefined) reply.header('retry-after', String(err.retryAfterS));
  return reply.send(err.toJSON());
}

/** Marks a client connection that has not yet sent its first request. */
const AWAITING_REQUEST = Symbol('slagate.awaitingRequest');
type ClientSocket = Socket & { [AWAITING_REQUEST]?: boolean };

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;

/** The methods a path has routes for (none: the path itself is unknown). */
function allowedMethods(app: FastifyInstance, url: string): string[] {
  const path = routePath(url);
  if (path === null) return [];
  if (isInferencePath(path)) return ['POST'];
  return METHODS.filter((method) => app.hasRoute({ method, url: path }));
}

/**
 * A request node:http could not parse (a malformed head, headers over its size limit, a head too
 * slow to arrive, a body whose framing breaks): answered in the gateway's error envelope, not
 * fastify's, and logged with its code alone. A body's framing error is the request's own: its
 * answer carries its id, and its admission record ends as that refusal (not as a client that
 * left, which the connection's close would make it). Invariant: the raw bytes Node attaches to the
 * error (`rawPacket`, the request's head with its Authorization header) reach no log line.
 */
export function answerClientError(
  rt: Pick<Runtime, 'logger' | 'metrics'>,
  err: NodeJS.ErrnoException,
  socket: Socket,
): void {
  rt.logger.debug({ code: err.code ?? null }, 'unparseable request');
  // The error may be in the body of the request in flight (a bad chunk): the answer is that
  // request's own. Otherwise a request already on this connection (bytes after it, pipelined)
  // must not get this answer as its own, nor an HTTP head in the middle of its response: the
  // connection just goes.
  const inFlight = (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage;
  const itsOwn = inFlight != null && !inFlight.headersSent && inFlight.req?.complete === false;
  if (err.code === 'ECONNRESET' || !socket.writable || (inFlight != null && !itsOwn)) {
    socket.destroy();
    return;
  }
  const [status, phrase, message] =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? [431, 'Request Header Fields Too Large', 'The request headers are too large.']
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? [408, 'Request Timeout', 'The request head did not arrive in time.']
        : [400, 'Bad Request', 'The request is not valid HTTP/1.1.'];
  const gErr = new GatewayError('invalid_request', message);
  const own = inFlight != null && itsOwn ? frontFacts(inFlight.req) : undefined;
  // A body cut short by the client's end of the connection is a client that left (the close ends
  // its record so); a body whose framing breaks is a request refused.
  if (own?.record != null && err.code !== 'HPE_INVALID_EOF_STATE') endRefused(rt, own.record, gErr);
  const body = JSON.stringify(gErr.toJSON());
  // Invariant: the connection is closed, not half-closed. node:http leaves that to this handler,
  // and a client that never closes its side (or a head that timed out) would hold the socket.
  socket.write(
    `HTTP/1.1 ${status} ${phrase}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${own === undefined ? '' : `x-request-id: ${own.id}\r\n`}connection: close\r\n\r\n${body}`,
  );
  socket.destroySoon();
}

export function buildApp(rt: Runtime): FastifyInstance {
  const app = Fastify({
    loggerInstance: rt.logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: rt.config.server.body_limit_bytes,
    // The front door made the id (and the record) before fastify saw the request.
    genReqId: (req) => frontFacts(req)?.id ?? requestId(req),
    requestIdHeader: false,
    return503OnClosing: false,
    // No child logger per request (a pino child with the redaction re-applied to its bindings:
    // about 1% of the gateway's CPU at 256 streams, for a logger no healthy request writes to).
    // A line about a request gets the request's context where it is written (requestLogger).
    childLoggerFactory: (logger) => logger,
    clientErrorHandler: (err, socket) => answerClientError(rt, err, socket),
    // A path whose percent-encoding is broken (or a parameter too long): the gateway's envelope,
    // not fastify's own body, which echoed the whole URL, query string and any credential in it.
    // A record the front door began (a /v1 path as it read it) ends as this refusal.
    frameworkErrors: (_err, request, reply) => {
      const err = new GatewayError('invalid_request', 'The request path is not a valid URL.');
      noteRefusal(rt, request.id, frontFacts(request.raw)?.record ?? null, err, err);
      return sendError(reply, err);
    },
    // The server's requests meet the front door first; fastify gets what the door does not serve.
    serverFactory: (handler) => {
      const door = frontDoor(rt, handler as (req: IncomingMessage, res: ServerResponse) => void);
      const onRequest = (req: IncomingMessage, res: ServerResponse) => {
        const socket = req.socket as ClientSocket;
        if (socket[AWAITING_REQUEST] === true) {
          socket[AWAITING_REQUEST] = false;
          socket.setTimeout(0);
        }
        door(req, res);
      };
      // A request without Host reaches the front door, which answers it in the envelope with its
      // id and record (node:http's own answer is a bare 400 before any listener sees it).
      const server = createServer({ requireHostHeader: false }, onRequest);
      // `Expect: 100-continue`: the 100 goes when the body is about to be read (awaitContinue).
      server.on('checkContinue', (req: IncomingMessage, res: ServerResponse) => {
        awaitContinue(req);
        onRequest(req, res);
      });
      // Any other expectation: 417 in the gateway's envelope, not node:http's bare one.
      // The body limit of the start, as every route's (a restart-only setting).
      const bodyLimit = rt.config.server.body_limit_bytes;
      server.on('checkExpectation', (req: IncomingMessage, res: ServerResponse) =>
        refuseExpectation(rt, req, res, bodyLimit),
      );
      // Invariant: no client connection stays open without a request for longer than the
      // keep-alive timeout. Node closes one idle between requests after it, and one that has
      // started a head after headersTimeout; one that never sends a byte it would keep for good.
      server.on('connection', (socket: ClientSocket) => {
        socket[AWAITING_REQUEST] = true;
        socket.setTimeout(server.keepAliveTimeout);
      });
      server.keepAliveTimeout = rt.config.server.keep_alive_timeout_ms;
      // A request itself has no overall time limit: a generation may stream for many minutes.
      server.requestTimeout = 0;
      server.setTimeout(0);
      return server;
    },
  });

  // The gateway's JSON parser (json-body.ts: the poisoning checks without a scan of the text).
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_request, body, done) => {
    let parsed: unknown;
    try {
      parsed = parseJsonBody(body as Buffer);
    } catch (err) {
      done(err as Error, undefined);
      return;
    }
    done(null, parsed);
  });

  app.setErrorHandler((err: FastifyError | Error, request, reply) => {
    const gErr = toGatewayError(err, rt.config.server.body_limit_bytes);
    noteRefusal(rt, request.id, frontFacts(request.raw)?.record ?? null, gErr, err);
    return sendError(reply, gErr);
  });

  app.setNotFoundHandler((request, reply) => {
    const allow = allowedMethods(app, request.url);
    const err =
      allow.length > 0
        ? new GatewayError(
            'method_not_allowed',
            `Method ${request.method} is not allowed on ${routePath(request.url)}; use ${allow.join(' or ')}.`,
          )
        : // The path only: a query string may carry a credential (?api_key=...), and the
          // message is logged, in the admission log too, where nothing is redacted.
          new GatewayError(
            'route_not_found',
            `Route ${request.method} ${routePath(request.url) ?? '(undecodable path)'} not found.`,
          );
    if (allow.length > 0) reply.header('allow', allow.join(', '));
    noteRefusal(rt, request.id, frontFacts(request.raw)?.record ?? null, err, err);
    return sendError(reply, err);
  });

  // Listing models is not an inference request: no admission record. With tenants it takes a
  // tenant's key, as OpenAI's API and vLLM's --api-key do (a 401 otherwise, through the error
  // handler): the names served are the fleet's, not the public's.
  app.get('/v1/models', async (request, reply) => {
    rt.auth.identify(request.headers.authorization, undefined);
    return reply.header('x-request-id', request.id).send(rt.models.list());
  });

  registerOpsRoutes(app, rt);
  return app;
}
