import { performance } from 'node:perf_hooks';
import { type Logger, symbols } from 'pino';
import type { Outcome } from './outcome.ts';

export type Decision = 'admitted' | 'refused';

/**
 * One line of the admission log (DESIGN section 5). Every key is present on every line: an
 * unknown value is null, never missing. Times are milliseconds.
 */
export interface AdmissionRecord {
  req_id: string;
  tenant: string | null;
  class: string | null;
  model: string | null;
  stream: boolean | null;
  prompt_tokens_est: number | null;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  max_tokens: number | null;
  prefix_blocks: number | null;
  prefix_hit_est: number | null;
  /** Null when no decision was made: the client left before admission (mid-upload, say). */
  decision: Decision | null;
  /** `ok`, or the error code / cause that ended the request (`sla_unattainable`, `queue_full`, ...). */
  reason: string;
  outcome: Outcome;
  backend: string | null;
  attempts: number;
  /**
   * Predicted TTFT (arrival to first token) on `backend`, made at arrival; on a refusal, the best
   * prediction on any backend (the one that missed `ttft_target_ms`).
   */
  predicted_ttft_ms: number | null;
  /** The backend with the next-best prediction, and that prediction. */
  runner_up: string | null;
  runner_up_predicted_ttft_ms: number | null;
  /** Every attempt that failed, in order, the last one included when it ended the request: where, and why. */
  failed_attempts: readonly FailedAttempt[];
  queue_ms: number | null;
  ttft_ms: number | null;
  tpot_ms: number | null;
  e2e_ms: number | null;
  ttft_target_ms: number | null;
  tpot_target_ms: number | null;
  /** Both targets met; null when the request was refused, cancelled by its client, or has no class. */
  sla_met: boolean | null;
  /** Short detail of a failure (never an upstream body). */
  error: string | null;
  /** The router's best candidates with their costs; written only when the log is at debug level. */
  candidates?: readonly RouteCandidate[];
}

export interface FailedAttempt {
  backend: string;
  reason: string;
  /** The upstream's HTTP status, when its response head came. */
  status: number | null;
  /** What failed (capped): `upstream status 503`, `read ECONNRESET`, an in-band error's own text. */
  detail: string | null;
}

export interface RouteCandidate {
  backend: string;
  /** The router's cost (lower is better): seconds for slagate and oracle, the policy's own unit otherwise. */
  cost: number;
  /** Any cost terms the policy wants to show (ttft_s, prefill_s, decode_s, cached_tokens, ...). */
  readonly [term: string]: string | number | boolean | null;
}

/** Everything a request can report about itself; `end()` fills the rest. */
export type AdmissionFields = Partial<Omit<AdmissionRecord, 'req_id' | 'outcome' | 'sla_met'>>;

export interface AdmissionLogOptions {
  /** Monotonic clock in ms, used for e2e_ms when the request does not report it. */
  now?: () => number;
}

const MSG = 'admission';

/** What a pending record needs from its log; one per AdmissionLog, shared by every handle. */
interface RecordSink {
  now(): number;
  withCandidates(): boolean;
  write(record: AdmissionRecord): void;
}

// Every line of the admission log goes through here, so "exactly one record per request" is held
// by one place: the handle's `ended` flag.
export class AdmissionLog {
  private records = 0;
  private readonly sink: RecordSink;

  /**
   * `logger` is where the lines go (its destination is `logging.admission_log`). The log writes at
   * info even when that logger is quieter (warn, error), and adds router candidates at debug.
   */
  constructor(logger: Logger, opts: AdmissionLogOptions = {}) {
    // `silent` turns the admission log off too; any other level still gets its info records.
    const level = logger.level === 'silent' || logger.isLevelEnabled('debug') ? logger.level : 'info';
    // A record is built field by field from the typed fields above (a whitelist), so no header or
    // key can reach it; the logger's wildcard redaction would cost ~50 µs a line (10x the write).
    const log = logger.child({ kind: MSG }, { level, redact: [] });
    const line = lineWriter(log);
    this.sink = {
      now: opts.now ?? (() => performance.now()),
      withCandidates: () => log.isLevelEnabled('debug'),
      write: (record) => {
        line(record);
        this.records++;
      },
    };
  }

  /** Lines carry the router's candidates (the log is at debug level): build them only then. */
  get withCandidates(): boolean {
    return this.sink.withCandidates();
  }

  /** Records made so far: one per ended request (written unless the logger is silent). */
  get recorded(): number {
    return this.records;
  }

  /** Starts a request's record; its arrival time is now. */
  begin(ctx: AdmissionFields & { req_id: string }): RequestRecord {
    return new RequestRecord(this.sink, ctx);
  }
}

// What pino's log.info(record, 'admission') writes, made by one JSON.stringify of the record.
// pino serialises a merged object key by key (an escape scan of every key and string value, a
// generic stringify of each nested value). In the gateway's CPU profile at 32 streams the
// admission log's share fell from about 66 µs per request (sonic-boom's included) to 34 with this
// writer (docs/benchmarks.md); in a hot loop over one record pino takes about 4 µs a line and the
// one stringify 1.5. The line is the same: pino's cached prefix of the info level, its time, the
// child's bindings, the record's keys in order, the message, pino's line end, handed to the
// logger's stream. One difference, for the better: a lone surrogate (a model name sent as
// "\ud800") is written as its escape, where pino writes it raw and UTF-8 turns it into U+FFFD.
//
// Invariant: this is only taken when nothing else of pino's would shape the line: no log
// formatter, mixin, hook, message prefix, nested key, per-key stringifier (redaction) or
// serializer but `err`, the default message key, and a stream that does not ask for per-line
// metadata (a multistream). Otherwise the record goes through log.info. The record itself is
// built from a whitelist of typed fields, so nothing in it needs redacting.
function lineWriter(log: Logger): (record: AdmissionRecord) => void {
  const l = log as unknown as Record<symbol, unknown>;
  const formatters = l[symbols.formattersSym] as { log?: unknown } | undefined;
  const hooks = l[symbols.hooksSym] as { logMethod?: unknown; streamWrite?: unknown } | undefined;
  const stream = l[symbols.streamSym] as { write?: unknown; [k: symbol]: unknown } | undefined;
  const lsCache = l[symbols.lsCacheSym] as Record<number, string> | undefined;
  const time = l[symbols.timeSym];
  const plain =
    formatters?.log === undefined &&
    l[symbols.mixinSym] === undefined &&
    hooks?.logMethod === undefined &&
    hooks?.streamWrite === undefined &&
    l[(symbols as unknown as Record<string, symbol>).msgPrefixSym!] === undefined &&
    noStringifiers(l[symbols.stringifiersSym]) &&
    onlyErrSerializer(l[symbols.serializersSym]) &&
    !l[symbols.nestedKeySym] &&
    l[symbols.messageKeySym] === 'msg' &&
    typeof l[symbols.endSym] === 'string' &&
    typeof l[symbols.chindingsSym] === 'string' &&
    typeof lsCache?.[log.levels.values.info!] === 'string' &&
    typeof time === 'function' &&
    typeof stream?.write === 'function' &&
    !stream[symbols.needsMetadataGsym];
  if (!plain) return (record) => log.info(record, MSG);
  const head = lsCache[log.levels.values.info!]!;
  // The child's own bindings: only setBindings() would change them, and nothing calls it on this
  // private child.
  const chindings = l[symbols.chindingsSym] as string;
  const now = time as () => string;
  const tail = `,"msg":${JSON.stringify(MSG)}${l[symbols.endSym] as string}`;
  const write = stream.write as (line: string) => void;
  return (record) => {
    if (!log.isLevelEnabled('info')) return;
    const body = JSON.stringify(record);
    write.call(stream, `${head}${now()}${chindings},${body.slice(1, -1)}${tail}`);
  };
}

/**
 * No per-key or wildcard stringifier: pino adds them for redacted paths, and the admission child
 * has none (its only entry is the symbol-keyed formatter of redacted bindings).
 */
function noStringifiers(s: unknown): boolean {
  return (
    typeof s === 'object' && s !== null && Object.keys(s).length === 0 && !(symbols.wildcardFirstSym in s)
  );
}

/** pino's default serializers (only `err`, which no record key is). */
function onlyErrSerializer(s: unknown): boolean {
  return typeof s === 'object' && s !== null && Object.keys(s).every((k) => k === 'err');
}

/** One request's pending log record. Collect fields with `set()`; `end()` writes it, once. */
export class RequestRecord {
  readonly req_id: string;
  /** The log clock's reading at begin: the request's arrival. */
  readonly startedAt: number;
  private readonly fields: AdmissionFields;
  private done = false;
  /** The log clock's reading when the request's body was in; null until then, or with no body. */
  #bodyReadAt: number | null = null;

  constructor(
    private readonly sink: RecordSink,
    ctx: AdmissionFields & { req_id: string },
  ) {
    const { req_id, ...rest } = ctx;
    this.req_id = req_id;
    this.startedAt = sink.now();
    this.fields = rest;
  }

  get ended(): boolean {
    return this.done;
  }

  /** Milliseconds since begin. */
  elapsedMs(): number {
    return this.sink.now() - this.startedAt;
  }

  /** Marks the request's body as read: the client's upload ends here. */
  readonly bodyRead = (): void => {
    this.#bodyReadAt = this.sink.now();
  };

  /**
   * Milliseconds since the request's body was read (since begin when none was): the gateway's own
   * time from there on. A slow client's upload is not the gateway's time; the front door's few
   * microseconds before the body are left out with it.
   */
  ownMs(): number {
    return this.sink.now() - (this.#bodyReadAt ?? this.startedAt);
  }

  set(fields: AdmissionFields): this {
    Object.assign(this.fields, fields);
    return this;
  }

  /**
   * Writes the record and returns it; a second call writes nothing and returns null. e2e_ms
   * defaults to the time since begin, tpot_ms to (e2e − ttft)/(completion_tokens − 1).
   */
  /**
   * Writes the record. `clientError`: a backend rejected the request as the client's own error,
   * surely (a 4xx status, or the same in-band rejection from a second backend): not judged.
   * `ttftObservable`: false for a body passed through whole, whose first token nobody sees.
   */
  end(
    outcome: Outcome,
    fields?: AdmissionFields,
    clientError = false,
    ttftObservable = true,
  ): AdmissionRecord | null {
    if (this.done) return null;
    this.done = true;
    if (fields) Object.assign(this.fields, fields);
    const record = buildRecord(
      this.req_id,
      outcome,
      this.fields,
      this.elapsedMs(),
      clientError,
      ttftObservable,
    );
    if (this.fields.candidates && this.sink.withCandidates()) record.candidates = this.fields.candidates;
    this.sink.write(record);
    return record;
  }
}

function buildRecord(
  req_id: string,
  outcome: Outcome,
  f: AdmissionFields,
  elapsedMs: number,
  clientError: boolean,
  ttftObservable: boolean,
): AdmissionRecord {
  // An explicit null (the client left before admission) stays null; left out, the outcome says.
  const decision = f.decision !== undefined ? f.decision : outcome === 'refused' ? 'refused' : 'admitted';
  const ttft = ms(f.ttft_ms);
  const completion = f.completion_tokens ?? null;
  const e2e = ms(f.e2e_ms ?? elapsedMs);
  // Derived only when the caller said nothing about TPOT; an explicit null (a non-streamed
  // request, where no token timing is observable) stays null.
  const tpot = ms('tpot_ms' in f ? f.tpot_ms : derivedTpot(e2e, ttft, completion));
  const record: AdmissionRecord = {
    req_id,
    tenant: f.tenant ?? null,
    class: f.class ?? null,
    model: f.model ?? null,
    stream: f.stream ?? null,
    prompt_tokens_est: f.prompt_tokens_est ?? null,
    prompt_tokens: f.prompt_tokens ?? null,
    completion_tokens: completion,
    max_tokens: f.max_tokens ?? null,
    prefix_blocks: f.prefix_blocks ?? null,
    prefix_hit_est: f.prefix_hit_est ?? null,
    decision,
    reason: f.reason ?? (outcome === 'ok' ? 'ok' : outcome),
    outcome,
    backend: f.backend ?? null,
    attempts: f.attempts ?? 0,
    predicted_ttft_ms: ms(f.predicted_ttft_ms),
    runner_up: f.runner_up ?? null,
    runner_up_predicted_ttft_ms: ms(f.runner_up_predicted_ttft_ms),
    failed_attempts: f.failed_attempts ?? [],
    queue_ms: ms(f.queue_ms),
    ttft_ms: ttft,
    tpot_ms: tpot,
    e2e_ms: e2e,
    ttft_target_ms: f.ttft_target_ms ?? null,
    tpot_target_ms: f.tpot_target_ms ?? null,
    sla_met: null,
    error: f.error ?? null,
  };
  record.sla_met = slaMet(record, clientError, ttftObservable);
  return record;
}

/** TPOT as DESIGN section 9 defines it; null with fewer than two output tokens. */
function derivedTpot(e2e: number | null, ttft: number | null, completion: number | null): number | null {
  if (e2e === null || ttft === null || completion === null || completion < 2 || e2e < ttft) return null;
  return (e2e - ttft) / (completion - 1);
}

/**
 * Both class targets met (DistServe's "good" request). Not applicable (null) when refused, when a
 * backend surely rejected the request as the client's own error (not the fleet's to serve, as the
 * same errors found before admission are not; an in-band rejection no second backend confirmed may
 * be an engine failure vLLM labelled 400, and is judged), or without targets; unknown (null) when a
 * completed request's TTFT was not observable (a non-streamed body passed through whole). Any other
 * failure after admission is a miss.
 *
 * A client that gave up is a miss when what it saw already was one: its first token came after
 * the TTFT target, or none had come when the target passed (a client that times out waiting is the
 * miss the SLA is about). Otherwise it left before the fleet's answer could be judged: null; so
 * does one whose body was passed through whole (`ttftObservable` false), whose first token may
 * have come in time unseen.
 */
export function slaMet(r: AdmissionRecord, clientError = false, ttftObservable = true): boolean | null {
  if (r.decision === 'refused' || r.outcome === 'refused') return null;
  if (clientError && r.outcome === 'failed_before_commit') return null;
  if (r.ttft_target_ms === null || r.tpot_target_ms === null) return null;
  if (r.outcome === 'client_cancelled') return ttftObservable && leftLate(r, r.ttft_target_ms) ? false : null;
  if (r.outcome !== 'ok') return false;
  if (r.ttft_ms === null) return null;
  if (r.ttft_ms > r.ttft_target_ms) return false;
  // No TPOT with a single output token: TTFT alone is judged.
  if (r.tpot_ms === null) return (r.completion_tokens ?? 0) <= 1 ? true : null;
  return r.tpot_ms <= r.tpot_target_ms;
}

/**
 * An admitted request whose client left once its TTFT target was past: with a first token, that
 * token's time; without one, the time it had waited when it left. A client gone mid-upload (no
 * decision) was promised nothing.
 */
function leftLate(r: AdmissionRecord, ttftTargetMs: number): boolean {
  if (r.decision !== 'admitted') return false;
  const seen = r.ttft_ms ?? r.e2e_ms;
  return seen !== null && seen > ttftTargetMs;
}

// Microsecond resolution is plenty for a log and keeps lines short.
function ms(v: number | null | undefined): number | null {
  return v === null || v === undefined ? null : Math.round(v * 1000) / 1000;
}
