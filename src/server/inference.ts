// POST /v1/chat/completions and /v1/completions: everything the gateway decides before the
// upstream layer takes over, and the admission record of what happened. Each refusal is a thrown
// GatewayError, which the app's error handler turns into the envelope and the record; once the
// request is handed to proxyRequest, the proxy writes the response and this file ends the record.

import type { FastifyReply, FastifyRequest } from 'fastify';
import type { BackendView } from '../router/index.ts';
import type { Lease } from '../state/index.ts';
import type { AdmissionFields, RequestRecord, RouteCandidate } from '../telemetry/admission-log.ts';
import { requestLogger } from '../telemetry/logger.ts';
import type { Outcome } from '../telemetry/outcome.ts';
import type { Backend } from '../upstream/index.ts';
import { proxyRequest } from '../upstream/index.ts';
import { writeErrorResponse } from '../upstream/respond.ts';
import { GatewayError, INTERNAL_MESSAGE } from './errors.ts';
import {
  ENDPOINT_PATHS,
  type Endpoint,
  type InferenceRequest,
  parseInferenceRequest,
} from './inference-request.ts';
import { endRecord } from './record.ts';
import type { Runtime } from './runtime.ts';

/** Records whose request is inside proxyRequest: only the proxy's result ends them. */
export const proxied = new WeakSet<RequestRecord>();

/** Upstream messages (e.g. vLLM's 400 text) go to the log only, cut short: they may quote input. */
const MAX_ERROR_CHARS = 200;

function truncate(text: string | null): string | null {
  return text === null || text.length <= MAX_ERROR_CHARS ? text : `${text.slice(0, MAX_ERROR_CHARS)}…`;
}

/** How many ranked candidates go into a debug-level record. */
const LOGGED_CANDIDATES = 3;

/**
 * Output tokens a request without max_tokens is expected to take, for the in-flight token counts
 * (ShareGPT's mean output is about 200 tokens; research/vllm.md F).
 */
const EXPECTED_OUTPUT_TOKENS = 256;

function header(request: FastifyRequest, name: string): string | undefined {
  const v = request.headers[name];
  return typeof v === 'string' ? v : undefined;
}

/** Prompt tokens as the backend will count them (Llama 3 template, cl100k BPE), cached per text. */
function estimatePromptTokens(rt: Runtime, ir: InferenceRequest): number {
  if (ir.endpoint === 'completions') {
    let n = 0;
    // Token ids are used as given; text gets BOS, as vLLM's add_special_tokens default does.
    for (const p of ir.promptParts) n += typeof p === 'string' ? 1 + rt.tokenizer.encode(p).length : p.length;
    return n;
  }
  const messages = (ir.body.messages as { role: string }[]).map((m, i) => ({
    role: m.role,
    content: (ir.promptParts[i] as string | undefined) ?? '',
  }));
  return rt.tokenizer.countChat(messages);
}

export async function handleInference(
  rt: Runtime,
  endpoint: Endpoint,
  request: FastifyRequest,
  reply: FastifyReply,
): Promise<void> {
  const record = request.admission!;
  if (rt.lifecycle.shuttingDown) throw new GatewayError('shutting_down', 'The gateway is shutting down.');

  const id = rt.auth.identify(request.headers.authorization, header(request, 'x-slagate-class'));
  const cls = rt.config.sla.classes[id.class]!;
  record.set({
    tenant: id.tenant,
    class: id.class,
    ttft_target_ms: cls.ttft_p99_ms,
    tpot_target_ms: cls.tpot_p99_ms,
  });

  const ir = parseInferenceRequest(endpoint, request.body);
  record.set({ model: ir.model, stream: ir.stream, max_tokens: ir.maxTokens });
  if (!rt.models.has(ir.model)) {
    throw new GatewayError('model_not_found', `The model \`${ir.model}\` does not exist.`, {
      param: 'model',
    });
  }
  const promptTokens = estimatePromptTokens(rt, ir);
  record.set({ prompt_tokens_est: promptTokens });
  const maxLen = rt.models.maxModelLen(ir.model);
  if (promptTokens + (ir.maxTokens ?? 1) > maxLen) {
    throw new GatewayError(
      'invalid_request',
      `This model's maximum context length is ${maxLen} tokens. However, you requested ` +
        `${promptTokens + (ir.maxTokens ?? 0)} tokens (about ${promptTokens} in the messages, ` +
        `${ir.maxTokens ?? 0} in the completion).`,
      { param: ir.endpoint === 'chat' ? 'messages' : 'prompt' },
    );
  }

  const routeReq = {
    reqId: request.id,
    promptTokensEst: promptTokens,
    sessionId: header(request, rt.config.router.session_header),
  };
  let candidates: RouteCandidate[] | undefined;
  // One lease at a time: it follows the request to each backend an attempt is sent to, so the
  // shared in-flight counts (all gateway instances) always name where the request is now.
  let lease = null as Lease | null;
  let loadAtDispatch = 0;
  const leaseTokens = { promptTokens, expectedOutputTokens: ir.maxTokens ?? EXPECTED_OUTPUT_TOKENS };
  const pick = (excluded: ReadonlySet<string>): Backend | null => {
    const views: BackendView[] = [];
    for (const b of rt.backends.available()) {
      if (!excluded.has(b.name))
        views.push({ name: b.name, weight: b.weight, inflight: rt.live.load(b.name) });
    }
    const ranked = rt.policy.rank(routeReq, views);
    candidates ??= ranked.slice(0, LOGGED_CANDIDATES).map((c) => ({ backend: c.backend, cost_s: c.cost }));
    const best = ranked[0] === undefined ? undefined : rt.backends.get(ranked[0].backend);
    if (best === undefined) return null;
    lease?.end();
    loadAtDispatch = rt.live.load(best.name);
    lease = rt.live.lease(best.name, leaseTokens);
    return best;
  };

  const overheadMs = record.elapsedMs();
  rt.metrics.observeOverheadMs(overheadMs);
  reply.hijack();
  proxied.add(record);
  const shutdown = rt.lifecycle.enter();
  const responseHeaders = {
    'x-request-id': request.id,
    'x-slagate-class': id.class,
    'x-slagate-queue-ms': '0',
  };
  try {
    const result = await proxyRequest(
      {
        res: reply.raw,
        body: ir.body,
        path: ENDPOINT_PATHS[endpoint] as '/v1/chat/completions' | '/v1/completions',
        stream: ir.stream,
        clientWantsUsage: ir.wantsUsage,
        requestId: request.id,
        responseHeaders,
        startedAt: record.startedAt,
        signal: shutdown.signal,
        pick,
        // The prompt is in the backend's KV now: its prefill no longer waits ahead of others.
        onCommit: () => lease?.prefillDone(),
      },
      rt.proxy,
      rt.backends.retryBudget,
    );
    const outcome: Outcome = result.outcome;
    // A shutdown cut comes back as the proxy's 'cut' with errorCode 'shutting_down'.
    const reason: string = result.errorCode ?? result.reason ?? 'ok';
    const error =
      outcome === 'ok'
        ? null
        : result.reason === 'cut'
          ? 'cut at the end of the shutdown grace period'
          : truncate(result.upstreamMessage ?? result.reason);
    const fields: AdmissionFields = {
      decision: 'admitted',
      reason,
      backend: result.backend,
      attempts: result.attempts,
      queue_ms: 0,
      ttft_ms: result.ttftMs,
      tpot_ms: result.tpotMs,
      e2e_ms: result.e2eMs,
      prompt_tokens: result.promptTokens,
      completion_tokens: result.completionTokens,
      error,
    };
    if (candidates !== undefined) fields.candidates = candidates;
    if (outcome === 'ok' && ir.stream && result.backend !== null && result.ttftMs !== null) {
      // Only complete streamed requests teach the windows and the rate fits: failures and cancels
      // would bias them (a cut stream has a short, meaningless TPOT), and a non-streamed request's
      // "first token" is its whole generation.
      rt.live.record({
        backend: result.backend,
        class: id.class,
        queueMs: 0,
        ttftMs: result.ttftMs,
        tpotMs: result.tpotMs,
        uncachedPromptTokens: result.promptTokens ?? promptTokens,
        promptTokens: result.promptTokens ?? promptTokens,
        completionTokens: result.completionTokens ?? 0,
        loadAtDispatch,
      });
    }
    endRecord(rt, record, outcome, fields, result.itlMs);
  } catch (err) {
    // Upstream failures are results, never throws: this is a bug (in a routing policy, say). The
    // client still gets an answer and the request its one record.
    requestLogger(rt.logger, { req_id: request.id, tenant: id.tenant, class: id.class }).error(
      { err },
      'proxying failed',
    );
    const committed = reply.raw.headersSent;
    if (committed) reply.raw.destroy();
    else writeErrorResponse(reply.raw, new GatewayError('internal_error', INTERNAL_MESSAGE), responseHeaders);
    endRecord(rt, record, committed ? 'failed_after_commit' : 'failed_before_commit', {
      decision: 'admitted',
      reason: 'internal_error',
      error: err instanceof Error ? err.message : String(err),
    });
  } finally {
    lease?.end();
    rt.lifecycle.leave(shutdown);
  }
}
