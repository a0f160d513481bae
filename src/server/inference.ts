// POST /v1/chat/completions and /v1/completions: the request pipeline, one stage after another.
//
//   intake (server)      who, which class, what; 401 · 400 · 404          intake.ts
//   payload (upstream)   the client's bytes with stream_options: the      src/upstream/payload.ts
//                        body's last use (handleInference)
//   admit  (admission)   tenant limits, predicted TTFT; 429               src/admission
//   ── from here the upstream layer writes the response ──
//   proxy  (upstream)    every attempt asks the scheduler for a slot      src/upstream/proxy.ts
//            └ slot (scheduler): queue, late dispatch, router's pick       src/scheduler
//   finish (server)      one admission record, samples for the live state  finish.ts
//            └ queued until the loop is past the next request                 afterwork.ts
//
// A refusal before the proxy is a thrown GatewayError (the returned promise rejects), which the
// front door turns into the envelope and the record (front.ts); after it, the proxy answers and
// finish() ends the record.

import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { type Admitted, Refusal } from '../admission/index.ts';
import { GatewayError, INTERNAL_MESSAGE, writeErrorResponse } from '../errors/index.ts';
import type { RouteRequest } from '../router/index.ts';
import type { RequestRecord } from '../telemetry/admission-log.ts';
import { requestLogger } from '../telemetry/logger.ts';
import { markStage } from '../telemetry/stages.ts';
import { type Cancel, proxyRequest, upstreamPayload } from '../upstream/index.ts';
import { type Identity, namedTenant } from './auth.ts';
import { finishProxied, predictionFields } from './finish.ts';
import { ENDPOINT_PATHS, type Endpoint } from './inference-request.ts';
import { header, type Intake, intake, type Served, sessionKey } from './intake.ts';
import { endRecord } from './record.ts';
import type { Runtime } from './runtime.ts';

/** Records whose request is inside proxyRequest: only the proxy's result ends them. */
export const proxied = new WeakSet<RequestRecord>();

/** One inference request as the front door hands it over (front.ts); its body comes apart. */
export interface InferenceCall {
  readonly id: string;
  readonly headers: IncomingHttpHeaders;
  /** Who sent it and in which class, from its key (checked at its head, before the body). */
  readonly identity: Identity;
  readonly res: ServerResponse;
  readonly record: RequestRecord;
  /** Its place among the requests a shutdown waits for (entered at its head, left when its response closes). */
  readonly shutdown: Cancel;
}

/**
 * Serves `call`, whose parsed body is `body` (undefined: it had none) and whose bytes as received
 * are `rawBody`.
 *
 * Invariant: nothing that waits while the request is served holds its body. Intake reads it, the
 * upstream payload is made from it, and admission judges what intake made of it, in one
 * synchronous step (the benchmark-only oracle's question before admission aside); what then waits
 * for the backend (serve) keeps the intake without it and the payload's bytes, which are outside
 * the JavaScript heap. A string alive when the young generation is collected is copied at each
 * collection until it dies, and then moved to the old generation, whose collections are longer: a
 * long prompt's text held for its stream's whole life was copied by every collection in that time
 * (docs/benchmarks.md, "The body dies at the send").
 */
export function handleInference(
  rt: Runtime,
  endpoint: Endpoint,
  call: InferenceCall,
  body: unknown,
  rawBody: Buffer | null,
): Promise<void> {
  try {
    markStage(call.id, 'parsed');
    const got = intake(rt, endpoint, call, body, call.record);
    const route = routeOf(rt, call, got.served);
    // Only the benchmark-only oracle has anything to ask before admission.
    const policy = rt.policy;
    if (policy.prepare === undefined) return admitThenServe(rt, endpoint, call, got, route, rawBody);
    return policy
      .prepare(route, rt.backends.list(), askedBody(got))
      .then((asked) => admitThenServe(rt, endpoint, call, got, asked, rawBody));
  } catch (err) {
    return Promise.reject(err);
  }
}

/** The body the oracle asks the replicas about: under the salt the backend will get. */
function askedBody(got: Intake): unknown {
  const salt = got.served.cacheSalt;
  return salt === null ? got.ir.body : { ...got.ir.body, cache_salt: salt };
}

function routeOf(rt: Runtime, call: InferenceCall, served: Served): RouteRequest {
  const blockSize = rt.config.router.block_size_tokens;
  return {
    reqId: call.id,
    promptTokens: served.promptTokens,
    blocks: served.blocks,
    blockSizeTokens: blockSize,
    tokensPerBlock: served.tokensPerBlock,
    ...(served.readsPrefixCache ? {} : { readsNoCache: true as const }),
    outputTokensPerSequence: served.expectedTokensPerSequence,
    tpotTargetMs: served.cls.tpot_p99_ms,
    sessionId: sessionKey(header(call, rt.config.router.session_header), namedTenant(served.identity)),
  };
}

/**
 * The upstream payload (the body's last use), then admission (a refusal is thrown). Nothing
 * between a request's admission and serve's `finally`, which ends its tenant lease, may throw.
 */
function admitThenServe(
  rt: Runtime,
  endpoint: Endpoint,
  call: InferenceCall,
  got: Intake,
  route: RouteRequest,
  rawBody: Buffer | null,
): Promise<void> {
  const { served, ir } = got;
  const { record } = call;
  const { identity, cls } = served;
  const payload = upstreamPayload({
    raw: rawBody,
    body: ir.body,
    streamed: ir.mode !== 'passthrough',
    priority: rt.config.upstream.forward_priority ? cls.priority : null,
    clientWantsUsage: ir.wantsUsage,
    model: ir.model === null ? served.model : null,
    cacheSalt: served.cacheSalt,
  });
  const bodyFields = Object.keys(ir.body);
  let admitted: Admitted;
  try {
    admitted = rt.admission.admit({
      reqId: call.id,
      className: identity.class,
      priority: cls.priority,
      sheddable: cls.sheddable,
      tenant: identity.tenant,
      model: served.model,
      limits: identity.limits,
      arrivedAt: record.startedAt,
      ttftTargetMs: cls.ttft_p99_ms,
      tpotTargetMs: cls.tpot_p99_ms,
      // By then a first token must have come; for a body passed through, the whole body.
      deadlineAt:
        record.startedAt +
        (ir.mode === 'passthrough'
          ? rt.config.upstream.passthrough_timeout_ms
          : rt.config.upstream.first_token_timeout_ms),
      promptTokens: served.promptTokens,
      expectedOutputTokens: served.expectedOutputTokens,
      budgetTokens: served.promptTokens + served.expectedOutputTokens,
      noQueue: header(call, 'x-slagate-no-queue') === '1',
      route,
    });
  } catch (err) {
    if (err instanceof Refusal && err.prediction !== null) record.set(predictionFields(err.prediction, null));
    throw err;
  }
  rt.metrics.observeOverheadMs(record.ownMs());
  markStage(call.id, 'admitted');
  return serve(rt, endpoint, call, served, admitted, payload, bodyFields);
}

/** The admitted request, proxied and finished. Holds no reference to the body (handleInference). */
async function serve(
  rt: Runtime,
  endpoint: Endpoint,
  call: InferenceCall,
  got: Served,
  admitted: Admitted,
  payload: Buffer,
  bodyFields: readonly string[],
): Promise<void> {
  const { record, res, shutdown } = call;
  const { identity } = got;
  proxied.add(record);
  const ticket = rt.scheduler.ticket(admitted.scheduled);
  const responseHeaders = { 'x-request-id': call.id, 'x-slagate-class': identity.class };
  // A request no engine worked on (refused or cancelled while it waited, no backend, every attempt
  // refused a connection, or refused by the backends before any work: ProxyResult.engineWorked)
  // is not charged to its tenant's tokens per minute: a tenant retrying through an overload, as
  // Retry-After tells it to, would otherwise spend its budget without being served once, and one
  // prompt over the context, which the gateway leaves the backend to judge, a minute's worth.
  let engineWorked = true;
  // What the backend counted the request used (its usage), when it said: charged to the tenant
  // over what admission charged (TenantLease.end).
  let usedTokens: number | null = null;
  try {
    const result = await proxyRequest(
      {
        res,
        payload,
        bodyFields,
        path: ENDPOINT_PATHS[endpoint] as '/v1/chat/completions' | '/v1/completions',
        mode: got.mode,
        assembleKind: got.assembleKind,
        clientWantsUsage: got.wantsUsage,
        sequences: got.sequences,
        requestId: call.id,
        responseHeaders,
        startedAt: record.startedAt,
        deadlineAt: admitted.scheduled.deadlineAt,
        signal: shutdown,
        acquire: ticket.acquire,
      },
      rt.proxy,
      rt.retryBudget,
    );
    engineWorked = result.engineWorked;
    if (result.completionTokens !== null)
      usedTokens = (result.promptTokens ?? got.promptTokens) + result.completionTokens;
    // The client has its answer: the record and what it teaches wait for the next request (afterwork.ts).
    rt.afterwork.defer(() => finishProxied(rt, record, got, admitted, ticket, result));
  } catch (err) {
    // Upstream failures are results, never throws: this is a bug (in a routing policy, say). The
    // client still gets an answer and the request its one record.
    requestLogger(rt.logger, {
      req_id: call.id,
      tenant: namedTenant(identity),
      class: identity.class,
    }).error({ err }, 'proxying failed');
    const committed = res.headersSent;
    // Whether a backend's engine saw it is unknown here: it did when its answer had begun, and
    // one that failed before that is treated as one that never got there (nothing was served).
    engineWorked = committed;
    if (committed) res.destroy();
    else writeErrorResponse(res, new GatewayError('internal_error', INTERNAL_MESSAGE), responseHeaders);
    endRecord(rt, record, committed ? 'failed_after_commit' : 'failed_before_commit', {
      decision: 'admitted',
      reason: 'internal_error',
      error: err instanceof Error ? err.message : String(err),
    });
  } finally {
    admitted.tenantLease.end(!engineWorked, usedTokens);
  }
}
