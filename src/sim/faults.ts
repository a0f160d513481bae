// Faults on demand. A fault is set for a whole replica (POST /sim/fault, the fleet's control
// API) or for one request (header `x-sim-fault: <mode>[;key=value...]`).
//
//   crash         sockets destroyed, engine requests and prefix cache dropped, port closed
//                 (ECONNREFUSED) until reset or `duration_ms`
//   refuse        port closed (ECONNREFUSED), in-flight requests finish; until reset/duration
//   hang          response headers sent, then nothing, ever
//   error         an HTTP error `status` (default 500) with vLLM's error body
//   drop          socket destroyed after `after_tokens` tokens (default 1)
//   inband_error  after `after_tokens` tokens (default 1): `data: {"error":...}` then [DONE]
//   slow          every engine step `factor` times slower (per request: its share of a step)
//   reset         clears the replica's fault
//
// Replica-wide request faults (hang, error, drop, inband_error) apply to every new request
// until reset or `duration_ms`.

export const FAULT_MODES = [
  'crash',
  'refuse',
  'hang',
  'error',
  'drop',
  'inband_error',
  'slow',
  'reset',
] as const;
export type FaultMode = (typeof FAULT_MODES)[number];

export interface FaultSpec {
  mode: FaultMode;
  /** How long a replica-wide fault lasts; absent = until reset. */
  durationMs?: number;
  /** HTTP status for `error`; error code inside the event for `inband_error`. */
  status?: number;
  /** Tokens sent before `drop` / `inband_error` strike. */
  afterTokens?: number;
  /** Step slowdown for `slow`. */
  factor?: number;
  message?: string;
}

/** What a single request must suffer, resolved from the header and the replica's state. */
export type RequestFault = FaultSpec & { mode: 'hang' | 'error' | 'drop' | 'inband_error' | 'slow' };

export class FaultSpecError extends Error {}

const KEY_ALIASES: Readonly<Record<string, keyof Omit<FaultSpec, 'mode'>>> = {
  duration_ms: 'durationMs',
  status: 'status',
  after_tokens: 'afterTokens',
  after: 'afterTokens',
  k: 'afterTokens',
  factor: 'factor',
  message: 'message',
};

/** A fault from JSON (`{"mode":"drop","after_tokens":3}`). */
export function parseFaultJson(body: unknown): FaultSpec {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new FaultSpecError('fault must be a JSON object with a "mode"');
  }
  const raw = body as Record<string, unknown>;
  const spec = { mode: parseMode(raw.mode) } as FaultSpec;
  for (const [key, value] of Object.entries(raw)) {
    if (key === 'mode') continue;
    setField(spec, key, value);
  }
  return check(spec);
}

/** A fault from the `x-sim-fault` header (`drop;after_tokens=3`). */
export function parseFaultHeader(value: string): FaultSpec {
  const [mode, ...pairs] = value.split(';').map((s) => s.trim());
  const spec = { mode: parseMode(mode) } as FaultSpec;
  for (const pair of pairs) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new FaultSpecError(`x-sim-fault: expected key=value, got '${pair}'`);
    const key = pair.slice(0, eq).trim();
    const text = pair.slice(eq + 1).trim();
    setField(spec, key, key === 'message' ? text : Number(text));
  }
  return check(spec);
}

function parseMode(mode: unknown): FaultMode {
  if (typeof mode === 'string' && (FAULT_MODES as readonly string[]).includes(mode)) return mode as FaultMode;
  throw new FaultSpecError(
    `fault mode must be one of ${FAULT_MODES.join(', ')}; got ${JSON.stringify(mode)}`,
  );
}

function setField(spec: FaultSpec, key: string, value: unknown): void {
  const field = KEY_ALIASES[key];
  if (field === undefined) throw new FaultSpecError(`unknown fault parameter '${key}'`);
  if (field === 'message') {
    if (typeof value !== 'string') throw new FaultSpecError('fault message must be a string');
    spec.message = value;
    return;
  }
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new FaultSpecError(`fault parameter '${key}' must be a non-negative number`);
  }
  spec[field] = value;
}

function check(spec: FaultSpec): FaultSpec {
  if (
    spec.status !== undefined &&
    (!Number.isInteger(spec.status) || spec.status < 400 || spec.status > 599)
  ) {
    throw new FaultSpecError('fault status must be an HTTP error status (400-599)');
  }
  if (spec.afterTokens !== undefined && !Number.isInteger(spec.afterTokens)) {
    throw new FaultSpecError('after_tokens must be an integer');
  }
  if (spec.mode === 'slow' && !(spec.factor !== undefined && spec.factor >= 1)) {
    throw new FaultSpecError('slow needs factor >= 1');
  }
  return spec;
}

/** A replica's current fault, with its expiry timer. */
export class FaultState {
  private current: FaultSpec | null = null;
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly onExpire: () => void) {}

  get active(): FaultSpec | null {
    return this.current;
  }

  set(spec: FaultSpec | null): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.current = spec;
    if (spec?.durationMs !== undefined) {
      this.timer = setTimeout(() => {
        this.timer = null;
        this.onExpire();
      }, spec.durationMs);
      this.timer.unref();
    }
  }

  /** The request-level fault a new request gets from the replica, if any. */
  requestFault(): RequestFault | null {
    const f = this.current;
    if (f === null || f.mode === 'crash' || f.mode === 'refuse' || f.mode === 'reset' || f.mode === 'slow') {
      return null;
    }
    return f as RequestFault;
  }

  clear(): void {
    this.set(null);
  }
}
