// Why one attempt on one backend did not succeed. The reason decides two things: whether the
// backend is to blame (outlier ejection and breaker count it) and, before the commit point,
// whether another backend may be tried.
import { type GatewayError, isGatewayError } from '../errors/index.ts';
import type { Cancel } from './cancel.ts';

export type FailureReason =
  | 'connect_error' // refused, unreachable, DNS
  | 'connect_timeout'
  | 'upstream_reset' // socket closed or reset before the response ended
  | 'upstream_status' // 5xx or another status the gateway cannot relay (3xx, 401, 403, ...)
  | 'upstream_busy' // 408 or 429: the backend is alive but shedding load
  | 'first_token_timeout'
  | 'deadline' // the request's own deadline cut the first-token wait short
  | 'in_band_error' // `data: {"error":...}` (or a 200 JSON error body)
  | 'in_band_rejection' // the same before the first token, naming a relayable 4xx: the request's fault or the engine's (see below)
  | 'upstream_not_found' // 404 for a model the gateway serves: this backend lacks it, or every backend does (see below)
  | 'upstream_not_implemented' // 501: this backend does not do what the request asks, or no backend does (see below)
  | 'protocol_error' // bad JSON, oversized event, no token before [DONE], no [DONE]
  | 'response_too_large' // a body passed through whole grew past max_body_bytes, or one streamed event past max_event_bytes: this request's answer is too big anywhere
  | 'idle_timeout' // no data event for idle_timeout_ms after the commit point
  | 'client_cancelled'
  | 'client_stalled' // the client stopped reading for client_stall_timeout_ms
  | 'cut'; // the caller ended the request with an error the client is told (e.g. shutdown)

/** Rejections a second backend settles (below): none is the backend's fault until it does. */
const UNCONFIRMED: ReadonlySet<FailureReason> = new Set<FailureReason>([
  'in_band_rejection',
  'upstream_not_found',
  'upstream_not_implemented',
]);

/**
 * Reasons that are not the backend's fault: the gateway, the client or the request's budget. An
 * in-band rejection is not known to be either's when it arrives: vLLM gives code 400 to a
 * request's own errors raised after its 200 head (a ValueError from validation), and also to
 * failures that are not the request's: in v0.10-0.11 to every in-band error, engine failures
 * included; in current releases to a TypeError or RuntimeError raised in its API server (engine
 * failures get 500 there). The attempt loop (proxy.ts) asks another backend: a rejection there too
 * makes it the request's, a first token there makes it the first backend's, and only then is that
 * backend blamed (Backend.blame). A 404 is settled the same way: the gateway checked the model
 * against those it serves before sending, so a backend that answers 404 is one that lacks it (a
 * replica started without the adapter, or with another --served-model-name) unless every backend
 * does; relayed at once, it answered every request sent there with 404, fast and never ejected.
 * A 501 likewise: vLLM answers it for a feature the request asks and the server lacks (beam search
 * over prompt embeddings, a task the model does not serve, the Responses store unless enabled),
 * the same on every replica started alike, so it is the request's once a second backend agrees;
 * counted as the backend's failure, one client's requests would open every breaker in the fleet.
 */
const NOT_BACKEND_FAULT: ReadonlySet<FailureReason> = new Set<FailureReason>([
  ...UNCONFIRMED,
  'upstream_busy',
  'deadline',
  'response_too_large',
  'client_cancelled',
  'client_stalled',
  'cut',
]);

/** The client ended the attempt: it left, or stopped reading. Says nothing of the backend. */
export function endedByClient(reason: FailureReason): boolean {
  return reason === 'client_cancelled' || reason === 'client_stalled';
}

/** Reasons another backend would not change: the budget is spent, or the answer is too big anywhere. */
const FINAL: ReadonlySet<FailureReason> = new Set<FailureReason>(['deadline', 'response_too_large']);

/**
 * Where an undici/socket error came: the request never handed to a connection (dispatch threw),
 * before a stream's response head, or later (or before the head of a body passed through whole).
 */
export type ErrorStage = 'unsent' | 'before_head' | 'later';

/** Reasons that by themselves prove the request never reached the engine. */
const BEFORE_ENGINE: ReadonlySet<FailureReason> = new Set<FailureReason>([
  'connect_error',
  'connect_timeout',
]);

export class AttemptFailure extends Error {
  readonly reason: FailureReason;
  /**
   * False when the request cannot have reached the engine (connection refused or timed out, or
   * never handed to a connection): retrying it elsewhere cannot duplicate work, so the retry
   * budget does not bound it.
   */
  readonly reachedEngine: boolean;
  /**
   * A stream's connection reset before its response head. vLLM sends that head only once it has
   * rendered, tokenized and loaded the request's media, so this is either a connection the server
   * dropped (a restart) or a request that crashed it as it was prepared: the attempt loop retries
   * it free once per request, then as a failure the engine may have caused (proxy.ts). (A body
   * passed through whole gets its head only after its generation: not one of these.)
   */
  readonly beforeHead: boolean;
  /** Upstream HTTP status when one was received; for an in-band rejection, the status it names. */
  readonly status: number | null;
  /** For a cut, or an answer too large (the request's own size): the error the client is told instead of the generic upstream_error. */
  readonly clientError: GatewayError | null;
  /** For an in-band rejection: the upstream's message (capped), which the client may be told. */
  readonly upstreamMessage: string | null;
  /** For an in-band rejection or a 404: the request field the upstream named, if any. */
  readonly upstreamParam: string | null;

  constructor(
    reason: FailureReason,
    message: string,
    opts: {
      status?: number;
      cause?: unknown;
      clientError?: GatewayError;
      /** Where the error came: the request never handed to a connection, or before a stream's head. */
      stage?: ErrorStage;
      upstreamMessage?: string | null;
      upstreamParam?: string | null;
    } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'AttemptFailure';
    this.reason = reason;
    this.reachedEngine = !(BEFORE_ENGINE.has(reason) || opts.stage === 'unsent');
    this.beforeHead = reason === 'upstream_reset' && opts.stage === 'before_head';
    this.status = opts.status ?? null;
    this.clientError = opts.clientError ?? null;
    this.upstreamMessage = opts.upstreamMessage ?? null;
    this.upstreamParam = opts.upstreamParam ?? null;
  }

  /** Counted by outlier detection and the breaker. */
  get backendFault(): boolean {
    return !NOT_BACKEND_FAULT.has(this.reason);
  }

  get byClient(): boolean {
    return endedByClient(this.reason);
  }

  /** Before the commit point, whether another backend may be tried at all (the loop adds its limits). */
  get retryable(): boolean {
    return !this.byClient && !FINAL.has(this.reason);
  }

  /** A rejection another backend settles: the request's if it rejects too, else this backend's. */
  get unconfirmedRejection(): boolean {
    return UNCONFIRMED.has(this.reason);
  }
}

/**
 * Why the request's signal aborted: a cut when its reason is a GatewayError (the client is told
 * that error), otherwise the client went away.
 */
export function abortFailure(signal: Cancel): AttemptFailure {
  const reason: unknown = signal.reason;
  if (isGatewayError(reason)) return new AttemptFailure('cut', reason.message, { clientError: reason });
  return new AttemptFailure('client_cancelled', 'client went away');
}

/**
 * Maps an undici/socket error raised before or during the response to a reason, at `stage`.
 */
export function failureFromError(err: unknown, stage: ErrorStage): AttemptFailure {
  if (err instanceof AttemptFailure) return err;
  const code = (err as { code?: unknown } | null)?.code;
  const message = err instanceof Error ? err.message : String(err);
  switch (code) {
    case 'UND_ERR_CONNECT_TIMEOUT':
      return new AttemptFailure('connect_timeout', message, { cause: err });
    case 'ECONNREFUSED':
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return new AttemptFailure('connect_error', message, { cause: err });
    default:
      return new AttemptFailure('upstream_reset', message, { cause: err, stage });
  }
}
