// The attempt loop for one client request: pick a backend, run one attempt; before the commit
// point a backend failure is retried on a different backend within `retries`, the shared retry
// budget and the request's deadline; after it, never (no duplicate tokens). Upstream failures are
// never thrown: the result says how the request ended, and when no attempt committed this is the
// one place that writes the error envelope to the client. The caller may cut the request at any
// time by aborting `signal` with a GatewayError: the client is told that error, never reset.
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { type ErrorCode, GatewayError, isGatewayError } from '../server/errors.ts';
import type { Outcome } from '../telemetry/outcome.ts';
import type { Backend } from './backend.ts';
import type { FailureReason } from './failure.ts';
import { Attempt, type AttemptEnd } from './relay.ts';
import { writeErrorResponse } from './respond.ts';
import type { RetryBudget } from './retry-budget.ts';

export type UpstreamPath = '/v1/chat/completions' | '/v1/completions';

export interface ProxyRequest {
  /** The client's raw response (fastify: reply.hijack(), then reply.raw). Nothing else writes to it. */
  res: ServerResponse;
  /** The parsed, validated JSON body. */
  body: Record<string, unknown>;
  path: UpstreamPath;
  stream: boolean;
  /** The client set stream_options.include_usage: the usage chunk is forwarded to it. */
  clientWantsUsage: boolean;
  /** Sent upstream as x-request-id. */
  requestId: string;
  /** Extra headers on every response the client gets (x-request-id, x-slagate-*). */
  responseHeaders: OutgoingHttpHeaders;
  /** performance.now() when the request arrived: TTFT and E2E include the gateway's queue. */
  startedAt: number;
  /** performance.now() by which a first token must have arrived, across all attempts. */
  deadlineAt?: number;
  /**
   * Extra cancellation. Aborted with a GatewayError as its reason (e.g. `shutting_down` at the end
   * of the shutdown grace period) it is a cut: the upstream attempt is aborted at once and the
   * client is told that error — before the commit point as the error response (its status,
   * envelope and Retry-After; outcome failed_before_commit), after it as one SSE error event then
   * [DONE] and a normal end (failed_after_commit); reason 'cut', errorCode the error's code.
   * Aborted with any other reason it is treated like a client disconnect (client_cancelled).
   */
  signal?: AbortSignal;
  /** The router: the next backend to try, never one in `excluded`; null when none is left. */
  pick: (excluded: ReadonlySet<string>) => Backend | null;
  /** Called once per attempt that commits (first token, or a 4xx about to be relayed). */
  onCommit?: (backend: string) => void;
}

export interface ProxyConfig {
  firstTokenTimeoutMs: number;
  idleTimeoutMs: number;
  clientStallTimeoutMs: number;
  /** Attempts after the first (max attempts − 1). */
  retries: number;
  maxEventBytes: number;
  maxBodyBytes: number;
}

export interface AttemptRecord {
  backend: string;
  kind: AttemptEnd['kind'];
  committed: boolean;
  reason: FailureReason | null;
  status: number | null;
}

export type ResultReason = FailureReason | 'upstream_rejected' | 'no_healthy_backend' | 'retry_budget';

export interface ProxyResult {
  outcome: Outcome;
  /** Why it did not succeed (null when outcome is ok). */
  reason: ResultReason | null;
  /** The backend of the last attempt (the one that served the response when committed). */
  backend: string | null;
  attempts: number;
  attemptLog: AttemptRecord[];
  committed: boolean;
  /** Status sent to the client, or null when it was gone before anything was sent. */
  status: number | null;
  errorCode: ErrorCode | null;
  /** The upstream's message of a relayed 4xx, for the log only (never sent to the client). */
  upstreamMessage: string | null;
  ttftMs: number | null;
  tpotMs: number | null;
  itlMs: number[];
  e2eMs: number;
  firstTokenAt: number | null;
  promptTokens: number | null;
  completionTokens: number | null;
}

export async function proxyRequest(
  req: ProxyRequest,
  cfg: ProxyConfig,
  budget: RetryBudget,
): Promise<ProxyResult> {
  const client = watchClient(req.res, req.signal);
  budget.requestStarted();
  try {
    return await attemptLoop(req, cfg, budget, client.signal);
  } finally {
    budget.requestEnded();
    client.dispose();
  }
}

async function attemptLoop(
  req: ProxyRequest,
  cfg: ProxyConfig,
  budget: RetryBudget,
  signal: AbortSignal,
): Promise<ProxyResult> {
  const payload = Buffer.from(JSON.stringify(upstreamBody(req)));
  const excluded = new Set<string>();
  const log: AttemptRecord[] = [];
  let last: AttemptEnd | null = null;
  let lastBackend: Backend | null = null;
  let stop: ResultReason | null = null;
  while (!signal.aborted) {
    const retry = log.length > 0;
    if (retry && log.length > cfg.retries) break;
    const remaining = (req.deadlineAt ?? Number.POSITIVE_INFINITY) - performance.now();
    if (remaining <= 0) {
      stop = 'deadline';
      break;
    }
    const backend = pickAvailable(req.pick, excluded);
    if (backend === null) {
      if (!retry) stop = 'no_healthy_backend';
      break;
    }
    if (retry && !budget.tryAcquireRetry()) {
      stop = 'retry_budget';
      break;
    }
    excluded.add(backend.name);
    const attempt = new Attempt({
      backendName: backend.name,
      path: req.path,
      payload,
      requestId: req.requestId,
      stream: req.stream,
      clientWantsUsage: req.clientWantsUsage,
      res: req.res,
      commitHeaders: { ...req.responseHeaders, 'x-slagate-backend': backend.name },
      startedAt: req.startedAt,
      firstTokenMs: Math.min(cfg.firstTokenTimeoutMs, remaining),
      cutByDeadline: remaining < cfg.firstTokenTimeoutMs,
      idleTimeoutMs: cfg.idleTimeoutMs,
      clientStallTimeoutMs: cfg.clientStallTimeoutMs,
      maxEventBytes: cfg.maxEventBytes,
      maxBodyBytes: cfg.maxBodyBytes,
      signal,
    });
    if (req.onCommit !== undefined) {
      const onCommit = req.onCommit;
      attempt.committed.then(
        () => onCommit(backend.name),
        () => {},
      );
    }
    let end: AttemptEnd | null;
    try {
      end = await backend.run(attempt);
    } finally {
      if (retry) budget.releaseRetry();
    }
    if (end === null) continue; // the breaker refused: not an attempt, pick another backend
    last = end;
    lastBackend = backend;
    log.push({
      backend: backend.name,
      kind: end.kind,
      committed: end.committed,
      reason: end.failure?.reason ?? null,
      status: end.status,
    });
    const f = end.failure;
    // The deadline failure means the budget is spent (timers may fire a fraction of a ms early).
    if (end.kind !== 'failed' || end.committed || f === null || f.byClient || f.reason === 'deadline') break;
  }
  const cut = signal.aborted && isGatewayError(signal.reason) ? signal.reason : null;
  return conclude(req, { last, backend: lastBackend, log, stop, cancelled: signal.aborted, cut });
}

/** The router's choice, skipping (and excluding) any backend that cannot take traffic right now. */
function pickAvailable(pick: ProxyRequest['pick'], excluded: Set<string>): Backend | null {
  for (;;) {
    const b = pick(excluded);
    if (b === null || excluded.has(b.name)) return null;
    if (b.available) return b;
    excluded.add(b.name);
  }
}

/** Streams always ask the backend for usage (token counts for TPOT); the client's choice is kept apart. */
function upstreamBody(req: ProxyRequest): Record<string, unknown> {
  if (!req.stream) return req.body;
  const opts = req.body.stream_options;
  const streamOptions = opts !== null && typeof opts === 'object' ? opts : {};
  return { ...req.body, stream: true, stream_options: { ...streamOptions, include_usage: true } };
}

interface LoopEnd {
  last: AttemptEnd | null;
  backend: Backend | null;
  log: AttemptRecord[];
  stop: ResultReason | null;
  cancelled: boolean;
  /** The caller's cut: the error the client is told. */
  cut: GatewayError | null;
}

function conclude(req: ProxyRequest, e: LoopEnd): ProxyResult {
  const { last } = e;
  const base = {
    backend: e.backend?.name ?? null,
    attempts: e.log.length,
    attemptLog: e.log,
    committed: last?.committed ?? false,
    upstreamMessage: last?.upstreamMessage ?? null,
    promptTokens: last?.promptTokens ?? null,
    completionTokens: last?.completionTokens ?? null,
  };
  if (last?.committed) {
    const lat = last.latencies!;
    const failure = last.failure;
    let outcome: Outcome = 'ok';
    if (failure !== null) outcome = failure.byClient ? 'client_cancelled' : 'failed_after_commit';
    return {
      ...base,
      outcome,
      reason: failure?.reason ?? null,
      status: 200,
      errorCode:
        failure === null || failure.byClient ? null : (failure.clientError?.code ?? 'upstream_error'),
      ttftMs: lat.ttftMs,
      tpotMs: lat.tpotMs,
      itlMs: lat.itlMs,
      e2eMs: lat.e2eMs,
      firstTokenAt: lat.firstTokenAt,
    };
  }
  const uncommitted = { ...base, ttftMs: null, tpotMs: null, itlMs: [], firstTokenAt: null };
  if (e.cut !== null) {
    return {
      ...uncommitted,
      outcome: 'failed_before_commit',
      reason: 'cut',
      status: writeErrorResponse(req.res, e.cut, req.responseHeaders),
      errorCode: e.cut.code,
      e2eMs: performance.now() - req.startedAt,
    };
  }
  if (e.cancelled || last?.failure?.byClient) {
    const e2eMs = performance.now() - req.startedAt;
    return {
      ...uncommitted,
      outcome: 'client_cancelled',
      reason: 'client_cancelled',
      status: null,
      errorCode: null,
      e2eMs,
    };
  }
  const { err, reason, outcome } = failureResponse(e);
  const status = writeErrorResponse(req.res, err, req.responseHeaders);
  return {
    ...uncommitted,
    outcome,
    reason,
    status,
    errorCode: err.code,
    e2eMs: performance.now() - req.startedAt,
  };
}

/** The error the client gets when no attempt committed. */
function failureResponse(e: LoopEnd): { err: GatewayError; reason: ResultReason; outcome: Outcome } {
  const { last } = e;
  if (last?.kind === 'rejected') {
    return {
      err: rejectedError(last.status ?? 400),
      reason: 'upstream_rejected',
      outcome: 'failed_before_commit',
    };
  }
  if (last === null && e.stop === 'no_healthy_backend') {
    return {
      err: new GatewayError('no_healthy_backend', 'No healthy backend is available'),
      reason: 'no_healthy_backend',
      outcome: 'failed_before_commit',
    };
  }
  const reason: ResultReason = last?.failure?.reason ?? e.stop ?? 'no_healthy_backend';
  if (reason === 'first_token_timeout' || reason === 'deadline') {
    return {
      err: new GatewayError('first_token_timeout', 'No token arrived from the backend in time'),
      reason,
      outcome: 'timeout',
    };
  }
  return {
    err: new GatewayError('upstream_error', 'The backend failed before the response started'),
    reason,
    outcome: 'failed_before_commit',
  };
}

/** A backend 4xx as a gateway envelope: same status, a generic message, never the upstream body. */
function rejectedError(status: number): GatewayError {
  if (status === 404) return new GatewayError('model_not_found', 'The model does not exist on the backend');
  if (status === 413) return new GatewayError('body_too_large', 'The request is too large for the backend');
  return new GatewayError('invalid_request', 'The backend rejected the request as invalid');
}

/**
 * Client disconnect, as res 'close' before the response ended (not request.signal: fastify #4690
 * aborts that once a POST body is read), or the caller's signal. The listener stays for the whole
 * call, streaming included. Whichever comes first sets the reason, so a cut after the client left
 * stays a cancel, and a client leaving after a cut does not undo it.
 */
function watchClient(
  res: ServerResponse,
  extra: AbortSignal | undefined,
): { signal: AbortSignal; dispose(): void } {
  const ac = new AbortController();
  const onClose = (): void => {
    if (!res.writableEnded) ac.abort();
  };
  // The extra signal's reason is passed on: a GatewayError reason marks a cut (see ProxyRequest).
  const onExtra = (): void => ac.abort(extra?.reason);
  res.on('close', onClose);
  extra?.addEventListener('abort', onExtra);
  if (res.destroyed || res.socket?.destroyed === true) ac.abort();
  else if (extra?.aborted) ac.abort(extra.reason);
  return {
    signal: ac.signal,
    dispose: () => {
      res.off('close', onClose);
      extra?.removeEventListener('abort', onExtra);
    },
  };
}
