// The attempt loop for one client request: ask for a slot, run one attempt on the slot's backend;
// before the commit point a backend failure goes back for another slot (never on a backend
// already tried), after it never (no duplicate tokens). Upstream failures are never thrown: the
// result says how the request ended, and when no attempt committed this is the one place that
// writes the error envelope to the client. The caller may cut the request at any time by aborting
// `signal` with a GatewayError: the client is told that error, never reset.
//
// Which failures are retried, and what bounds them:
// - one that never reached the engine (connection refused or timed out): always, on another
//   backend, while the deadline allows: it cannot duplicate work; a reset before the response head
//   the same way once per request, then as below (a request that crashes a server would show so);
// - one the engine may have caused (5xx, timeouts, resets mid-response, in-band errors): at most
//   `retries` times, and only within the shared retry budget (Envoy's 20%), so a fleet-wide
//   failure does not multiply the load;
// - none after the commit point, none of a client cancel, a relayed 4xx, or the deadline.
// An in-band rejection (an in-band error naming a relayable 4xx before the first token, failure.ts)
// is retried like a failure the engine may have caused, but blames nobody yet: a rejection from a
// second backend too ends the loop; a first token (or a whole body) from another backend blames
// the backend that rejected, at that moment. A request that no attempt committed and that was
// rejected on the way is answered with the last rejection (a relayed 4xx), whatever ended the
// loop (no retry left, no other backend, another failure, the deadline), unless the client left,
// the request was cut, or its retry was refused while it waited: the refusal (a 429 with
// Retry-After) is the answer then, since the rejection may have been the backend's and the retry
// would tell.
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import {
  type ErrorCode,
  GatewayError,
  headersWith,
  isGatewayError,
  writeErrorResponse,
} from '../errors/index.ts';
import type { Outcome } from '../telemetry/outcome.ts';
import { markStage } from '../telemetry/stages.ts';
import type { AssembleKind } from './assemble.ts';
import type { Backend } from './backend.ts';
import { Cancel } from './cancel.ts';
import type { AttemptFailure, FailureReason } from './failure.ts';
import type { Latencies } from './measure.ts';
import { Attempt, type AttemptEnd, type ClientMode } from './relay.ts';
import type { RetryBudget } from './retry-budget.ts';
import type { AcquireSlot, Slot } from './slot.ts';

export type UpstreamPath = '/v1/chat/completions' | '/v1/completions';

export interface ProxyRequest {
  /** The client's response (node:http's, from the front door). Nothing else writes to it. */
  res: ServerResponse;
  /**
   * The upstream body (upstreamPayload, payload.ts), made once for every attempt. The proxy holds
   * no reference to the client's parsed body: a long prompt's text is garbage from the send on
   * (see the caller, server/inference.ts).
   */
  payload: Buffer;
  /** The client body's top-level fields: a backend's rejection naming one is passed on as its param. */
  bodyFields: readonly string[];
  path: UpstreamPath;
  /** How the client is answered: relayed stream, a body assembled from a stream, or passed through. */
  mode: ClientMode;
  assembleKind: AssembleKind;
  /** The client's stream_options ask for usage (asksForUsage): the usage chunk is forwarded to it. */
  clientWantsUsage: boolean;
  /** Sequences the backend's stream interleaves (AttemptSpec.sequences): 1 but for n > 1 or several prompts. */
  sequences: number;
  /** Sent upstream as x-request-id. */
  requestId: string;
  /** Extra headers on every response the client gets (x-request-id, x-slagate-class). */
  responseHeaders: OutgoingHttpHeaders;
  /** performance.now() when the request arrived: TTFT and E2E include the gateway's queue. */
  startedAt: number;
  /**
   * performance.now() by which a first token must have arrived, across all attempts (a body
   * passed through: the whole body, which comes at the end of its generation).
   */
  deadlineAt: number;
  /**
   * Extra cancellation. Aborted with a GatewayError as its reason (e.g. `shutting_down` at the end
   * of the shutdown grace period) it is a cut: the upstream attempt is aborted at once and the
   * client is told that error — before the commit point as the error response (its status,
   * envelope and Retry-After; outcome failed_before_commit), after it as one SSE error event then
   * [DONE] and a normal end (failed_after_commit); reason 'cut', errorCode the error's code.
   * Aborted with any other reason it is treated like a client disconnect (client_cancelled).
   * The proxy also aborts it itself, without a reason, when the client leaves, so it is this
   * request's alone: never share one between requests. Without one, the proxy makes its own.
   */
  signal?: Cancel;
  /** Where every attempt's backend comes from (the scheduler). */
  acquire: AcquireSlot;
}

export interface ProxyConfig {
  /** Cap on any attempt's first-token wait. */
  firstTokenTimeoutMs: number;
  /**
   * The whole budget of an attempt whose body is passed through: it arrives only when the
   * generation ends, so the first-token cap would cut every generation longer than it.
   */
  passthroughTimeoutMs: number;
  idleTimeoutMs: number;
  clientStallTimeoutMs: number;
  /** Retries of failures the engine may have caused (failures before it are not counted). */
  retries: number;
  maxEventBytes: number;
  maxBodyBytes: number;
}

export interface AttemptRecord {
  backend: string;
  kind: AttemptEnd['kind'];
  reason: FailureReason | null;
  /** The upstream HTTP status, when its head came. */
  status: number | null;
  /** What failed, for the log only (the client is never told it): e.g. `upstream status 503`. */
  detail: string | null;
}

export type ResultReason = FailureReason | 'upstream_rejected' | 'no_healthy_backend';

export interface ProxyResult {
  outcome: Outcome;
  /** Why it did not succeed (null when outcome is ok). */
  reason: ResultReason | null;
  /** The backend of the last attempt (the one that served the response when committed). */
  backend: string | null;
  attempts: number;
  attemptLog: AttemptRecord[];
  /**
   * Some attempt may have reached an engine (failure.ts, reachedEngine): false when none was made,
   * or every one was refused a connection (or timed out connecting).
   */
  reachedEngine: boolean;
  /**
   * Some attempt may have had an engine work on it: one answered, or one that failed once it may
   * have been running. Not a backend's refusal before any work: a relayed 400, 413 or 422 status
   * before a streamed answer's head (vLLM's API server validates a request, its length against the
   * context included, before the engine sees it) or a 408/429 (shedding load). What a tenant's
   * tokens are charged on.
   */
  engineWorked: boolean;
  /**
   * Answered with a backend's rejection that is surely the client's own error: a 400, 413 or 422
   * status, or an in-band rejection or a 501 a second backend gave alike (same kind, same status).
   * An in-band rejection no second backend confirmed (no retry left, the next one failed otherwise)
   * may be an engine failure vLLM labelled 400 (failure.ts): false. A 404 never is (the gateway
   * sends only models it serves: one missing everywhere is the fleet's).
   */
  clientError: boolean;
  committed: boolean;
  /** Status sent to the client, or null when it was gone before anything was sent. */
  status: number | null;
  errorCode: ErrorCode | null;
  /** A refusal while waiting for a slot (queue_timeout, ...): what the client was told. */
  refusal: GatewayError | null;
  /** The upstream's message of a relayed 4xx (capped; the client is told it too). */
  upstreamMessage: string | null;
  /** Time spent waiting for slots, every attempt together. */
  queueMs: number;
  ttftMs: number | null;
  tpotMs: number | null;
  itlMs: number[];
  e2eMs: number;
  /** The client held the stream back (Latencies.clientPaced): its TPOT is not the backend's pace. */
  clientPaced: boolean;
  /** Its tokens were all read at once (Latencies.decodeUnseen): nor is its TPOT. */
  decodeUnseen: boolean;
  promptTokens: number | null;
  completionTokens: number | null;
}

/**
 * Budget left under which the deadline counts as passed. Node's timers fire up to a millisecond
 * early (libuv's clock is read in whole milliseconds), so an attempt whose own timer ended with the
 * deadline may find a fraction of a millisecond left: not enough for another attempt, which would
 * only send the request to a backend and abort it at once.
 */
const TIMER_SLACK_MS = 1;

export async function proxyRequest(
  req: ProxyRequest,
  cfg: ProxyConfig,
  budget: RetryBudget,
): Promise<ProxyResult> {
  const signal = req.signal ?? new Cancel();
  const dispose = watchClient(req.res, signal);
  try {
    return await attemptLoop(req, cfg, budget, signal);
  } finally {
    dispose();
  }
}

interface LoopState {
  log: AttemptRecord[];
  last: AttemptEnd | null;
  lastBackend: Backend | null;
  stop: ResultReason | null;
  refusal: GatewayError | null;
  /** The last attempt that rejected the request (a relayed 4xx or an in-band rejection). */
  rejection: AttemptEnd | null;
  queueMs: number;
  reachedEngine: boolean;
  engineWorked: boolean;
  /** A second backend rejected the request as the first did (same kind and status). */
  confirmedRejection: boolean;
}

async function attemptLoop(
  req: ProxyRequest,
  cfg: ProxyConfig,
  budget: RetryBudget,
  signal: Cancel,
): Promise<ProxyResult> {
  const { payload } = req;
  const excluded = new Set<string>();
  const s: LoopState = {
    log: [],
    last: null,
    lastBackend: null,
    stop: null,
    refusal: null,
    rejection: null,
    queueMs: 0,
    reachedEngine: false,
    engineWorked: false,
    confirmedRejection: false,
  };
  let engineRetries = 0;
  // Whether this request has had its one free retry of a reset before the response head.
  let resetRetried = false;
  // The backend whose in-band rejection waits for a second backend's answer.
  let rejectedBy: { backend: Backend; failure: AttemptFailure } | null = null;
  while (!signal.aborted) {
    if (req.deadlineAt - performance.now() <= TIMER_SLACK_MS) {
      // No time for another attempt: the last one's failure is the answer (none made: the deadline's).
      if (s.last === null) s.stop = 'deadline';
      break;
    }
    // A retry of a failure the engine may have caused needs a retry and a budget slot; one that
    // never reached the engine needs neither. A reset before the response head is free once per
    // request, and then budgeted: vLLM sends a stream's head only after it has rendered, tokenized
    // and loaded the request's media, so a request that crashes a server there also shows as a
    // reset before the head, and free retries would carry it to every replica in turn. One free
    // retry rides out a replica that resets connections (the breaker and outlier detection then
    // take it out).
    const failed = s.last?.failure;
    const freeReset = failed?.beforeHead === true && !resetRetried;
    const budgeted = failed?.reachedEngine === true && !freeReset;
    if (budgeted) {
      if (engineRetries >= cfg.retries) break;
      // The fleet is retrying too much already: the last failure is the answer.
      if (!budget.tryAcquireRetry()) break;
    }
    const asked = performance.now();
    let slot: Slot | null;
    try {
      slot = await req.acquire({ attempt: s.log.length, excluded, signal });
    } catch (err) {
      if (budgeted) budget.releaseRetry();
      s.queueMs += performance.now() - asked;
      if (signal.aborted) break;
      if (isGatewayError(err)) {
        s.refusal = err;
        break;
      }
      throw err;
    }
    s.queueMs += performance.now() - asked;
    const remaining = req.deadlineAt - performance.now();
    if (slot === null || remaining <= TIMER_SLACK_MS) {
      slot?.release();
      if (budgeted) budget.releaseRetry();
      if (remaining <= TIMER_SLACK_MS) s.stop = 'deadline';
      // None left, and none reached: every backend tried refused a connection (or timed it out), as a
      // fleet restarting does before its probes say so. The client is told to come back, not that a
      // backend failed its request.
      else if (!s.reachedEngine) s.stop = 'no_healthy_backend';
      break;
    }
    markStage(req.requestId, 'granted');
    const backend = slot.backend;
    excluded.add(backend.name);
    const firstTokenMs =
      req.mode === 'passthrough'
        ? cfg.passthroughTimeoutMs
        : Math.min(slot.firstTokenTimeoutMs, cfg.firstTokenTimeoutMs);
    // Every answer of this attempt's, an error before the commit or after it included.
    const answered = headersWith(req.responseHeaders, {
      'x-slagate-backend': backend.name,
      'x-slagate-queue-ms': ms(s.queueMs),
    });
    const attempt = new Attempt({
      authorization: backend.authorization,
      path: req.path,
      payload,
      requestId: req.requestId,
      mode: req.mode,
      assembleKind: req.assembleKind,
      clientWantsUsage: req.clientWantsUsage,
      res: req.res,
      commitHeaders: commitHeaders(answered, slot),
      errorHeaders: answered,
      startedAt: req.startedAt,
      firstTokenMs: Math.min(firstTokenMs, remaining),
      // Cut by the deadline (not the backend's fault) only when earlier attempts or the wait took a
      // real share of the budget: over half of it. An attempt given most of its own budget that
      // sees no first token is the backend's fault, whatever the deadline (a streamed retry after a
      // quick failure that hung there was never blamed). Except a body passed through: its timer
      // runs to the end of the whole generation, which a retry may need more of than is left
      // however little the first attempt took, so any cut of a retry is the deadline's.
      cutByDeadline:
        remaining < firstTokenMs / 2 ||
        (req.mode === 'passthrough' && s.log.length > 0 && remaining < firstTokenMs),
      idleTimeoutMs: cfg.idleTimeoutMs,
      clientStallTimeoutMs: cfg.clientStallTimeoutMs,
      maxEventBytes: cfg.maxEventBytes,
      maxBodyBytes: cfg.maxBodyBytes,
      signal,
      meter: slot.meter,
      sequences: req.sequences,
    });
    const granted = slot;
    const suspect = rejectedBy;
    attempt.committed.then(
      (how) => {
        // Only a streamed first token is one: a relayed 4xx's round trip would teach the TTFT fit a
        // prompt's prefill in a few milliseconds, and a body passed through whole arrives with its
        // whole generation. Either ends the attempt at once, and its release frees what it held.
        if (how === 'first_token') granted.prefillDone();
        // Served here what another backend rejected in-band: that rejection was its backend's.
        if (how !== 'rejected' && suspect !== null) suspect.backend.blame(suspect.failure);
      },
      () => {},
    );
    if (req.mode === 'passthrough') granted.expectNoFirstToken();
    let end: AttemptEnd | null;
    try {
      end = await backend.run(attempt);
    } finally {
      slot.release();
      if (budgeted) budget.releaseRetry();
    }
    // The breaker refused: not an attempt. Another slot, elsewhere.
    if (end === null) continue;
    if (budgeted) engineRetries++;
    if (freeReset) resetRetried = true;
    s.last = end;
    s.lastBackend = backend;
    s.log.push({
      backend: backend.name,
      kind: end.kind,
      reason: end.failure?.reason ?? null,
      status: end.status,
      detail: end.failure?.message ?? null,
    });
    const f = end.failure;
    if (f === null || f.reachedEngine) s.reachedEngine = true;
    // A relayed rejection is before any work only while the answer's head comes before the
    // engine runs (a stream, or a body the gateway assembles from one); a pass-through body's
    // head comes after generation, and vLLM can still answer 400 then (a tool call cut short).
    const beforeWork = end.kind === 'rejected' && req.mode !== 'passthrough';
    if (f === null ? !beforeWork : f.reachedEngine && f.reason !== 'upstream_busy') s.engineWorked = true;
    if (end.kind === 'rejected' || f?.unconfirmedRejection) s.rejection = end;
    if (f?.unconfirmedRejection) {
      // A second backend rejected the request too: it is the request's. Surely the client's error
      // only when both said the same (a replica without the model, then an engine failure labelled
      // 400, says nothing of the request).
      if (rejectedBy !== null) {
        s.confirmedRejection =
          rejectedBy.failure.reason === f.reason && rejectedBy.failure.status === f.status;
        break;
      }
      rejectedBy = { backend, failure: f };
    }
    // A deadline failure means the budget is spent (timers may fire a fraction of a ms early); a
    // body too large is as large on any backend (failure.ts says which failures are final).
    if (end.kind !== 'failed' || end.committed || f === null || !f.retryable) break;
  }
  const cut = signal.aborted && isGatewayError(signal.reason) ? signal.reason : null;
  return conclude(req, s, signal.aborted, cut);
}

/** The headers of every answer an attempt gives, with the router's figures when it has them. */
function commitHeaders(answered: OutgoingHttpHeaders, slot: Slot): OutgoingHttpHeaders {
  const h = headersWith(answered, {});
  if (slot.predictedTtftMs !== null) h['x-slagate-predicted-ttft-ms'] = ms(slot.predictedTtftMs);
  if (slot.prefixHit !== null)
    h['x-slagate-prefix-hit'] = (Math.round(slot.prefixHit * 1000) / 1000).toString();
  return h;
}

/** Milliseconds for a header: a tenth of a millisecond is plenty. */
function ms(v: number): string {
  return (Math.round(v * 10) / 10).toString();
}

/** What differs between the ways a request ends; result() adds what every result has. */
interface Ending {
  outcome: Outcome;
  reason: ResultReason | null;
  status: number | null;
  errorCode: ErrorCode | null;
  refusal: GatewayError | null;
  /** The rejecting backend's message the client was told (an ending of reason upstream_rejected). */
  upstreamMessage?: string | null;
}

function conclude(req: ProxyRequest, s: LoopState, aborted: boolean, cut: GatewayError | null): ProxyResult {
  const { last } = s;
  if (last?.committed) {
    const lat = last.latencies!;
    const failure = last.failure;
    let outcome: Outcome = 'ok';
    if (failure !== null) outcome = failure.byClient ? 'client_cancelled' : 'failed_after_commit';
    const errorCode =
      failure === null || failure.byClient ? null : (failure.clientError?.code ?? 'upstream_error');
    // What was sent: the stream's 200, or the error an answer not yet begun got (an assembled
    // body's 502); null when the client was gone before anything was.
    const { res } = req;
    const status = res.headersSent ? res.statusCode : null;
    const ending = { outcome, reason: failure?.reason ?? null, status, errorCode, refusal: null };
    return result(s, ending, lat, lat.e2eMs);
  }
  const e2eMs = performance.now() - req.startedAt;
  const headers = headersWith(req.responseHeaders, { 'x-slagate-queue-ms': ms(s.queueMs) });
  let ending: Ending;
  if (cut !== null) {
    const status = writeErrorResponse(req.res, cut, headers);
    ending = { outcome: 'failed_before_commit', reason: 'cut', status, errorCode: cut.code, refusal: null };
  } else if (aborted || last?.failure?.byClient) {
    ending = {
      outcome: 'client_cancelled',
      reason: 'client_cancelled',
      status: null,
      errorCode: null,
      refusal: null,
    };
  } else if (s.refusal !== null) {
    // Refused while it waited: a refusal when nothing had been tried, else the end of a retry.
    ending = {
      outcome: s.log.length === 0 ? 'refused' : 'failed_before_commit',
      reason: null,
      status: writeErrorResponse(req.res, s.refusal, headers),
      errorCode: s.refusal.code,
      refusal: s.refusal,
    };
  } else if (s.rejection !== null) {
    // A backend's 4xx, or an in-band rejection no backend contradicted: the client's to fix. The
    // result names the backend tried last, as for every ending; its attempt log says which rejected.
    const rejection = s.rejection;
    // The status an in-band rejection names, or the one relayed as such.
    const err = rejectedError(
      rejection.failure?.status ?? rejection.status ?? 400,
      rejection.upstreamMessage,
      requestField(req.bodyFields, rejection.upstreamParam),
    );
    ending = {
      outcome: 'failed_before_commit',
      reason: 'upstream_rejected',
      status: writeErrorResponse(req.res, err, headers),
      errorCode: err.code,
      refusal: null,
      upstreamMessage: rejection.upstreamMessage,
    };
  } else {
    const { err, reason, outcome } = failureResponse(s);
    const status = writeErrorResponse(req.res, err, headers);
    ending = { outcome, reason, status, errorCode: err.code, refusal: null };
  }
  return result(s, ending, null, e2eMs);
}

/** The result, every field spelled out (not `{ ...base, more }`: see headersWith). */
function result(s: LoopState, e: Ending, lat: Latencies | null, e2eMs: number): ProxyResult {
  const { last } = s;
  return {
    outcome: e.outcome,
    reason: e.reason,
    backend: s.lastBackend?.name ?? null,
    attempts: s.log.length,
    attemptLog: s.log,
    reachedEngine: s.reachedEngine,
    engineWorked: s.engineWorked,
    clientError:
      e.reason === 'upstream_rejected' &&
      e.errorCode !== 'model_not_found' &&
      (s.rejection?.kind === 'rejected' || s.confirmedRejection),
    committed: last?.committed ?? false,
    status: e.status,
    errorCode: e.errorCode,
    refusal: e.refusal,
    upstreamMessage: e.upstreamMessage ?? null,
    queueMs: s.queueMs,
    ttftMs: lat?.ttftMs ?? null,
    tpotMs: lat?.tpotMs ?? null,
    itlMs: lat?.itlMs ?? [],
    e2eMs,
    clientPaced: lat?.clientPaced ?? false,
    decodeUnseen: lat?.decodeUnseen ?? false,
    promptTokens: last?.promptTokens ?? null,
    completionTokens: last?.completionTokens ?? null,
  };
}

/** The error the client gets when no attempt committed and none rejected the request. */
function failureResponse(s: LoopState): { err: GatewayError; reason: ResultReason; outcome: Outcome } {
  // The deadline passed while the request waited for a slot (a retry held in the queue, or no
  // attempt made at all): it ran out of time in the gateway, whatever failed before (the failed
  // attempts are in its record). Not the last failure's 502, nor a 503 that asks to come back.
  if (s.stop === 'deadline') {
    return {
      err: new GatewayError(
        'first_token_timeout',
        "No token arrived from a backend by the request's deadline",
      ),
      reason: 'deadline',
      outcome: 'timeout',
    };
  }
  if (s.stop === 'no_healthy_backend') {
    return {
      err: new GatewayError('no_healthy_backend', 'No healthy backend is available'),
      reason: 'no_healthy_backend',
      outcome: 'failed_before_commit',
    };
  }
  const reason: ResultReason = s.last?.failure?.reason ?? s.stop ?? 'no_healthy_backend';
  // The last backend tried was shedding load (408, 429): not a failure of the request or of a
  // backend (none is blamed for it), so the client is told to come back, as the gateway's own
  // busy answers tell it, not that a backend failed (a 502 would page whoever watches 5xx).
  if (reason === 'upstream_busy') {
    return {
      err: new GatewayError(
        'no_healthy_backend',
        'The backend tried last is busy (it answered 408 or 429); retry after the time given',
      ),
      reason,
      outcome: 'failed_before_commit',
    };
  }
  if (reason === 'first_token_timeout' || reason === 'deadline') {
    return {
      err: new GatewayError('first_token_timeout', 'No token arrived from the backend in time'),
      reason,
      outcome: 'timeout',
    };
  }
  return {
    // A failure the request itself caused (an answer too large) says so; any other does not say more.
    err:
      s.last?.failure?.clientError ??
      new GatewayError('upstream_error', 'The backend failed before the response started'),
    reason,
    outcome: 'failed_before_commit',
  };
}

/**
 * A backend 4xx as a gateway envelope: same status family, and the backend's own message (capped
 * by the relay), which tells the client what to fix; never the upstream body itself.
 */
/**
 * The field a backend's 4xx names, when it is one of the client's own (`messages`,
 * `stream_options.include_usage`, `messages[2].content`): the client is told which to fix. Any
 * other value is the backend's and stays out, as the rest of its body does.
 */
function requestField(fields: readonly string[], param: string | null): string | null {
  if (param === null) return null;
  const top = /^[A-Za-z_][\w]*/.exec(param)?.[0];
  return top !== undefined && fields.includes(top) ? param : null;
}

function rejectedError(status: number, message: string | null, param: string | null): GatewayError {
  if (status === 404) {
    return new GatewayError('model_not_found', message ?? 'The model does not exist on the backend', {
      param: param ?? 'model',
    });
  }
  if (status === 501) {
    return new GatewayError('not_implemented', message ?? 'The backends do not support this request', {
      param,
    });
  }
  if (status === 413) {
    return new GatewayError('body_too_large', message ?? 'The request is too large for the backend', {
      param,
    });
  }
  return new GatewayError('invalid_request', message ?? 'The backend rejected the request as invalid', {
    param,
  });
}

/**
 * Client disconnect, as res 'close' before the response ended (not request.signal: fastify #4690
 * aborts that once a POST body is read), aborts the request's `signal`. The listener stays for the
 * whole call, streaming included; the returned function removes it. Abort is one-shot, so
 * whichever comes first sets the reason: a cut after the client left stays a cancel, and a client
 * leaving after a cut does not undo it.
 */
function watchClient(res: ServerResponse, signal: Cancel): () => void {
  const onClose = (): void => {
    if (!res.writableEnded) signal.abort();
  };
  res.on('close', onClose);
  if (res.destroyed || res.socket?.destroyed === true) signal.abort();
  return () => res.off('close', onClose);
}
