// Every error the gateway answers with has a stable code, one HTTP status and an OpenAI-style
// envelope. Upstream bodies and stacks never reach the client: an upstream failure is mapped to
// one of these codes and its detail stays in the admission log.

export type ErrorCode =
  | 'invalid_request' // 400: bad JSON, bad field, prompt + max_tokens over the context
  | 'invalid_api_key' // 401
  | 'model_not_found' // 404: unknown model
  | 'route_not_found' // 404: not an allowlisted route
  | 'method_not_allowed' // 405: a known route with another method (sent with Allow)
  | 'body_too_large' // 413
  | 'sla_unattainable' // 429: predicted TTFT cannot meet the class target
  | 'rate_limited' // 429: tenant concurrency or token budget
  | 'queue_full' // 429: gateway queue at max_queue
  | 'queue_timeout' // 429: deadline passed while queued
  | 'not_implemented' // 501: the backends do not do what the request asks (their own 501, relayed)
  | 'upstream_error' // 502: backend failed and retries are exhausted
  | 'no_healthy_backend' // 503
  | 'shutting_down' // 503
  | 'first_token_timeout' // 504
  | 'internal_error'; // 500: a bug in the gateway

interface ErrorSpec {
  status: number;
  type: string;
  /** Seconds for Retry-After, or undefined when the error carries none. */
  retryAfterS?: number;
}

const SPECS: Readonly<Record<ErrorCode, ErrorSpec>> = Object.freeze({
  invalid_request: { status: 400, type: 'invalid_request_error' },
  invalid_api_key: { status: 401, type: 'authentication_error' },
  model_not_found: { status: 404, type: 'not_found_error' },
  route_not_found: { status: 404, type: 'not_found_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  body_too_large: { status: 413, type: 'invalid_request_error' },
  sla_unattainable: { status: 429, type: 'rate_limit_error', retryAfterS: 1 },
  rate_limited: { status: 429, type: 'rate_limit_error', retryAfterS: 1 },
  queue_full: { status: 429, type: 'rate_limit_error', retryAfterS: 1 },
  queue_timeout: { status: 429, type: 'rate_limit_error', retryAfterS: 1 },
  not_implemented: { status: 501, type: 'not_implemented_error' },
  upstream_error: { status: 502, type: 'upstream_error' },
  no_healthy_backend: { status: 503, type: 'service_unavailable_error', retryAfterS: 2 },
  shutting_down: { status: 503, type: 'service_unavailable_error', retryAfterS: 5 },
  first_token_timeout: { status: 504, type: 'timeout_error' },
  internal_error: { status: 500, type: 'internal_error' },
});

export class GatewayError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  /** Seconds; set on every 429 and 503. */
  readonly retryAfterS: number | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    opts: { param?: string | null; retryAfterS?: number; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    const spec = SPECS[code];
    this.name = 'GatewayError';
    this.code = code;
    this.status = spec.status;
    this.type = spec.type;
    this.param = opts.param ?? null;
    this.retryAfterS = opts.retryAfterS ?? spec.retryAfterS;
  }

  /** The OpenAI error envelope; `code` is our stable string code. */
  toJSON(): { error: { message: string; type: string; param: string | null; code: ErrorCode } } {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** The only message a client sees for a gateway bug. */
export const INTERNAL_MESSAGE = 'The gateway failed to handle this request.';

export function isGatewayError(err: unknown): err is GatewayError {
  return err instanceof GatewayError;
}
