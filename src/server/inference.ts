// POST /v1/chat/completions and /v1/completions: the request pipeline, one stage after another.
//
//   intake (server)      who, which class, what; 401 · 400 · 404          intake.ts
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
import { type Cancel, proxyRequest } from '../upstream/index.ts';
import { type Identity, namedTenant } from './auth.ts';
import { finishProxied, predictionFields } from './finish.ts';
import { ENDPOINT_PATHS, type Endpoint } from './inference-request.ts';
import { header, intake, sessionKey } from './intake.ts';
import { endRecord } from './record.ts';
import type { Runtime } from './runtime.ts';

/** Records whose request is inside proxyRequest: only the proxy's result ends them. */
export const proxied = new WeakSet<RequestRecord>();

/** One inference request as the front door hands it over (front.ts). */
export interface InferenceCall {
  readonly id: string;
  readonly headers: IncomingHttpHeaders;
  /** Who sent it and in which class, from its key (checked at its head, before the body). */
  readonly identity: Identity;
  /** The parsed body (undefined: the request had none). */
  readonly body: unknown;
  /** The body's bytes as received: the upstream body is built from them (upstream/payload.ts). */
  readonly rawBody: Buffer | null;
  readonly res: ServerResponse;
  readonly record: RequestRecord;
  /** Its place among the requests a shutdown waits for (entered at its head, left when its response closes). */
  readonly shutdown: Cancel;
}

export async function handleInference(
  rt: Runtime,
  endpoint: Endpoint,
  request: InferenceCall,
): Promise<void> {
  const { record, res } = request;
  markStage(request.id, 'parsed');
  const got = intake(rt, endpoint, request, record);
  const { identity, cls, ir, promptTokens, prompt } = got;
  let route: RouteRequest = {
    reqId: request.id,
    promptTokens,
    blocks: got.blocks,
    blockSizeTokens: rt.config.router.block_size_tokens,
    tokensPerBlock: rt.tokens.tokensPerBlock(prompt, rt.config.router.block_size_tokens),
    outputTokensPerSequence: got.outputTokensPerSequence,
    tpotTargetMs: cls.tpot_p99_ms,
    sessionId: sessionKey(header(request, rt.config.router.session_header)),
  };
  // Only the benchmark-only oracle has anything to ask before admission.
  const policy = rt.policy;
  if (policy.prepare !== undefined) route = await policy.prepare(route, rt.backends.list(), ir.body);

  let admitted: Admitted;
  try {
    admitted = rt.admission.admit({
      reqId: request.id,
      className: identity.class,
      priority: cls.priority,
      sheddable: cls.sheddable,
      tenant: identity.tenant,
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
      promptTokens,
      expectedOutputTokens: got.expectedOutputTokens,
      budgetTokens: promptTokens + got.expectedOutputTokens,
      noQueue: header(request, 'x-slagate-no-queue') === '1',
      route,
    });
  } catch (err) {
    if (err instanceof Refusal && err.prediction !== null) record.set(predictionFields(err.prediction, null));
    throw err;
  }

  rt.metrics.observeOverheadMs(record.ownMs());
  markStage(request.id, 'admitted');
  proxied.add(record);
  const { shutdown } = request;
  const ticket = rt.scheduler.ticket(admitted.scheduled);
  const responseHeaders = { 'x-request-id': request.id, 'x-slagate-class': identity.class };
  // A request that never reached an engine (refused or cancelled while it waited, no backend,
  // every attempt refused a connection) is not charged to its tenant's tokens per minute: a tenant
  // retrying through an overload, as Retry-After tells it to, would otherwise spend its budget
  // without being served once.
  let reachedEngine = true;
  // What the backend counted the request used (its usage), when it said: charged to the tenant
  // over what admission charged (TenantLease.end).
  let usedTokens: number | null = null;
  try {
    const result = await proxyRequest(
      {
        res,
        body: ir.body,
        rawBody: request.rawBody,
        path: ENDPOINT_PATHS[endpoint] as '/v1/chat/completions' | '/v1/completions',
        mode: ir.mode,
        assembleKind: ir.assembleKind,
        clientWantsUsage: ir.wantsUsage,
        model: ir.model === null ? got.model : null,
        requestId: request.id,
        responseHeaders,
        startedAt: record.startedAt,
        deadlineAt: admitted.scheduled.deadlineAt,
        priority: rt.config.upstream.forward_priority ? cls.priority : null,
        signal: shutdown,
        acquire: ticket.acquire,
      },
      rt.proxy,
      rt.retryBudget,
    );
    reachedEngine = result.reachedEngine;
    if (result.completionTokens !== null)
      usedTokens = (result.promptTokens ?? promptTokens) + result.completionTokens;
    // The client has its answer: the record and what it teaches wait for the next request (afterwork.ts).
    rt.afterwork.defer(() => finishProxied(rt, record, got, admitted, ticket, result));
  } catch (err) {
    // Upstream failures are results, never throws: this is a bug (in a routing policy, say). The
    // client still gets an answer and the request its one record.
    requestLogger(rt.logger, {
      req_id: request.id,
      tenant: namedTenant(identity),
      class: identity.class,
    }).error({ err }, 'proxying failed');
    const committed = res.headersSent;
    if (committed) res.destroy();
    else writeErrorResponse(res, new GatewayError('internal_error', INTERNAL_MESSAGE), responseHeaders);
    endRecord(rt, record, committed ? 'failed_after_commit' : 'failed_before_commit', {
      decision: 'admitted',
      reason: 'internal_error',
      error: err instanceof Error ? err.message : String(err),
    });
  } finally {
    admitted.tenantLease.end(!reachedEngine, usedTokens);
  }
}
