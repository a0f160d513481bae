// The fastify application: the OpenAI routes it proxies (an allowlist), the gateway's own routes,
// and the one place where every /v1 request's admission record is begun and ended.
//
//   onRequest ── /v1/* except GET|HEAD /v1/models ──▶ begin admission record (req_id, arrival time)
//       │
//   body parse ──── 413 body_too_large, 400 bad JSON / __proto__ ──▶ error handler ─┐
//       │           (json-body.ts: parsed, then its objects walked for the keys)    │
//       │           (unknown route: 404 route_not_found, not-found handler) ─────▶─┤
//       │           (known path, other method: 405 method_not_allowed + Allow) ──▶─┤
//   handler: shutting_down? → auth (401) → parse (400) → model (404) → context (400)│
//       │       any refusal here throws a GatewayError ──────────────────────────▶─┤
//       ▼                                                                          │
//   reply.hijack() → proxyRequest (upstream/): attempts, commit, relay, retries     │
//       │            (a shutdown cut before the first token: 503 shutting_down)    ▼
//       └──▶ endRecord(outcome from the proxy)          endRefused(reason = code)
//
//   raw 'close' ──▶ endRecord('client_cancelled') if nothing ended it (safety net; 'refused' with
//                   reason shutting_down when the shutdown cut the connection)
//
// Invariants: a /v1 request's record is ended exactly once (RequestRecord.end() ignores later
// calls, so the safety net can never add a second line); every record is counted in the metrics
// by the same call that writes it (record.ts).

import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import Fastify, {
  type FastifyBaseLogger,
  type FastifyError,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  LogController,
} from 'fastify';
import { GatewayError, INTERNAL_MESSAGE, isGatewayError } from '../errors/index.ts';
import type { RequestRecord } from '../telemetry/admission-log.ts';
import { requestLogger } from '../telemetry/logger.ts';
import { markStage } from '../telemetry/stages.ts';
import { handleInference, proxied } from './inference.ts';
import { ENDPOINT_PATHS, type Endpoint } from './inference-request.ts';
import { parseJsonBody } from './json-body.ts';
import { registerOpsRoutes } from './ops-routes.ts';
import { endRecord, endRefused } from './record.ts';
import type { Runtime } from './runtime.ts';

declare module 'fastify' {
  interface FastifyRequest {
    admission: RequestRecord | null;
    /** A JSON body's bytes as received: the upstream body is built from them (upstream/payload.ts). */
    rawBody: Buffer | null;
  }
}

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** x-request-id is kept when it is a safe token (it reaches logs and upstream headers), else made. */
function requestId(req: IncomingMessage): string {
  const given = req.headers['x-request-id'];
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
}

/** Maps what fastify itself throws (parsing, limits) onto the gateway's stable codes. */
function toGatewayError(err: FastifyError | Error): GatewayError {
  if (isGatewayError(err)) return err;
  const status = (err as FastifyError).statusCode;
  if (status === 413) return new GatewayError('body_too_large', 'Request body is too large.');
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

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'] as const;

const pathOf = (url: string): string => {
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
};

/** The methods a path has routes for (none: the path itself is unknown). */
function allowedMethods(app: FastifyInstance, url: string): string[] {
  const path = pathOf(url);
  return METHODS.filter((method) => app.hasRoute({ method, url: path }));
}

export function buildApp(rt: Runtime): FastifyInstance {
  const app = Fastify({
    loggerInstance: rt.logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: rt.config.server.body_limit_bytes,
    genReqId: requestId,
    requestIdHeader: false,
    return503OnClosing: false,
    // No child logger per request (a pino child with the redaction re-applied to its bindings:
    // about 1% of the gateway's CPU at 256 streams, for a logger no healthy request writes to).
    // A line about a request gets the request's context where it is written (requestLogger).
    childLoggerFactory: (logger) => logger,
  });

  app.decorateRequest('admission', null);
  app.decorateRequest('rawBody', null);
  // The gateway's JSON parser (json-body.ts: the poisoning checks without a scan of the text),
  // keeping the bytes it parsed.
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    request.rawBody = body as Buffer;
    let parsed: unknown;
    try {
      parsed = parseJsonBody(body as Buffer);
    } catch (err) {
      done(err as Error, undefined);
      return;
    }
    done(null, parsed);
  });

  // A callback hook, not an async one: fastify goes on in the same turn, with no promise to settle.
  app.addHook('onRequest', (request, reply, done) => {
    // Every request under /v1 is inference-shaped (a 404 there included) except listing models.
    if (
      !request.url.startsWith('/v1/') ||
      (request.method !== 'POST' && request.routeOptions.url === '/v1/models')
    ) {
      done();
      return;
    }
    const record = rt.admissionLog.begin({ req_id: request.id });
    request.admission = record;
    markStage(request.id, 'received');
    // Safety net: a client that leaves before any path ended the record (e.g. mid-upload) still
    // gets its one line, and so does one whose connection the shutdown cut. A record handed to the
    // proxy is the proxy's to end, even after 'close'.
    reply.raw.once('close', () => {
      if (record.ended || proxied.has(record)) return;
      if (rt.lifecycle.connectionsCut) {
        endRecord(rt, record, 'refused', { decision: 'refused', reason: 'shutting_down' });
      } else {
        endRecord(rt, record, 'client_cancelled', { reason: 'client_cancelled' });
      }
    });
    done();
  });

  app.setErrorHandler((err: FastifyError | Error, request, reply) => {
    const gErr = toGatewayError(err);
    if (gErr.code === 'internal_error') {
      // The request's admission record has its tenant and class; this line only needs to find it.
      requestLogger(rt.logger, { req_id: request.id, tenant: null, class: null }).error(
        { err },
        'unhandled error',
      );
    }
    if (request.admission) endRefused(rt, request.admission, gErr);
    return sendError(reply, gErr);
  });

  app.setNotFoundHandler((request, reply) => {
    const allow = allowedMethods(app, request.url);
    const err =
      allow.length > 0
        ? new GatewayError(
            'method_not_allowed',
            `Method ${request.method} is not allowed on ${pathOf(request.url)}; use ${allow.join(' or ')}.`,
          )
        : new GatewayError('route_not_found', `Route ${request.method} ${request.url} not found.`);
    if (allow.length > 0) reply.header('allow', allow.join(', '));
    if (request.admission) endRefused(rt, request.admission, err);
    return sendError(reply, err);
  });

  for (const endpoint of Object.keys(ENDPOINT_PATHS) as Endpoint[]) {
    app.post(ENDPOINT_PATHS[endpoint], (request: FastifyRequest, reply: FastifyReply) =>
      handleInference(rt, endpoint, request, reply),
    );
  }

  // Listing models is not an inference request: no admission record.
  app.get('/v1/models', async (request, reply) =>
    reply.header('x-request-id', request.id).send(rt.models.list()),
  );

  registerOpsRoutes(app, rt);
  return app;
}
