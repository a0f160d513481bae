// One attempt on one backend: dispatch the request, wait for the first token, then relay the
// stream to the client. It is an undici dispatch handler, so it sees raw bytes and can pause the
// upstream socket when the client is slow.
//
// Invariants:
// - Nothing is written to the client before the commit point: the first SSE data event with a
//   non-empty `choices` (for chat, the role chunk, as vLLM's benchmark counts it), or the whole
//   body of a non-streamed 200. Until then a failure is returned to the caller, which may retry
//   on another backend. After it, this attempt owns the response and ends it itself.
// - Exactly one timer guards each phase: first token (from dispatch; also headers + body for
//   non-streamed requests, whose body only arrives when generation ends), idle between data
//   events after commit (comments do not reset it), and client stall while the client does not
//   drain. None of them caps a healthy stream's total length.
// - Events are forwarded as their original bytes; only the usage chunk is dropped when the
//   client did not ask for usage (the gateway always asks the backend for it).
// - A committed stream ends with the upstream's [DONE], or with one error event + [DONE] (the
//   backend failed, or the caller cut it: then the cut's own error), or with a destroyed socket
//   when the client is gone or stalled: nothing else can reach it then.
// - `done` always resolves, exactly once; `committed` settles exactly once (resolves at commit or
//   when a 4xx is to be relayed, rejects with the AttemptFailure of a pre-commit failure).
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { Dispatcher } from 'undici';
import { GatewayError } from '../server/errors.ts';
import { AttemptFailure, abortFailure, failureFromError } from './failure.ts';
import { type Latencies, TokenClock } from './measure.ts';
import { sseErrorFrames } from './respond.ts';
import { SseParser } from './sse-parser.ts';

/** 4xx statuses relayed to the client as an error envelope; not retried, not a backend failure. */
export const RELAYED_4XX: ReadonlySet<number> = new Set([400, 404, 413, 422]);
const BUSY_STATUSES: ReadonlySet<number> = new Set([408, 429]);
/** Bytes of a 4xx body read for the log message; the rest is discarded. */
const MAX_REJECT_BODY = 16 * 1024;

export interface AttemptSpec {
  backendName: string;
  path: string;
  /** The JSON body sent upstream (already rewritten: stream_options.include_usage on streams). */
  payload: Buffer;
  requestId: string;
  stream: boolean;
  clientWantsUsage: boolean;
  res: ServerResponse;
  /** Headers for the client's 200, written at the commit point. */
  commitHeaders: OutgoingHttpHeaders;
  startedAt: number;
  /** This attempt's first-token budget (the timeout, or less when the request deadline is nearer). */
  firstTokenMs: number;
  /** The budget was cut by the request deadline: its expiry is not the backend's fault. */
  cutByDeadline: boolean;
  idleTimeoutMs: number;
  clientStallTimeoutMs: number;
  maxEventBytes: number;
  maxBodyBytes: number;
  /** Aborts when the client goes away, or with a GatewayError reason when the caller cuts the request. */
  signal: AbortSignal;
}

export type AttemptKind = 'ok' | 'rejected' | 'failed';

export interface AttemptEnd {
  kind: AttemptKind;
  committed: boolean;
  failure: AttemptFailure | null;
  /** Upstream HTTP status, when headers were received. */
  status: number | null;
  /** For 'rejected': the upstream's error message, for the log only. */
  upstreamMessage: string | null;
  promptTokens: number | null;
  completionTokens: number | null;
  latencies: Latencies | null;
}

type Phase = 'waiting' | 'streaming' | 'buffering' | 'rejecting' | 'committed' | 'closing' | 'done';

export class Attempt implements Dispatcher.DispatchHandler {
  readonly spec: AttemptSpec;
  readonly done: Promise<AttemptEnd>;
  readonly committed: Promise<void>;
  #started = false;
  #phase: Phase = 'waiting';
  #status: number | null = null;
  #controller: Dispatcher.DispatchController | null = null;
  #pendingAbort: Error | null = null;
  #parser: SseParser;
  #clock: TokenClock;
  #held: Buffer[] = [];
  #heldBytes = 0;
  #body: Buffer[] = [];
  #bodyBytes = 0;
  #promptTokens: number | null = null;
  #completionTokens: number | null = null;
  #endedAt: number | null = null;
  #firstTokenTimer: NodeJS.Timeout | null = null;
  #idleTimer: NodeJS.Timeout | null = null;
  #stallTimer: NodeJS.Timeout | null = null;
  #resolveDone!: (end: AttemptEnd) => void;
  #resolveCommit!: () => void;
  #rejectCommit!: (f: AttemptFailure) => void;
  #commitSettled = false;

  constructor(spec: AttemptSpec) {
    this.spec = spec;
    this.#parser = new SseParser({ maxEventBytes: spec.maxEventBytes });
    this.#clock = new TokenClock(spec.startedAt);
    this.done = new Promise((resolve) => {
      this.#resolveDone = resolve;
    });
    this.committed = new Promise<void>((resolve, reject) => {
      this.#resolveCommit = resolve;
      this.#rejectCommit = reject;
    });
    // The breaker awaits `committed`; this guard only keeps an early failure from surfacing as an
    // unhandled rejection when the breaker refused the call and never started the attempt.
    this.committed.catch(() => {});
  }

  get started(): boolean {
    return this.#started;
  }

  /** Dispatches on `dispatcher`; resolves at the commit point, rejects on a pre-commit failure. */
  start(dispatcher: Dispatcher): Promise<void> {
    this.#started = true;
    const { spec } = this;
    if (spec.signal.aborted) {
      this.#fail(abortFailure(spec.signal));
      return this.committed;
    }
    spec.signal.addEventListener('abort', this.#onClientAbort);
    this.#firstTokenTimer = setTimeout(this.#onFirstTokenTimeout, spec.firstTokenMs);
    try {
      dispatcher.dispatch(
        {
          path: spec.path,
          method: 'POST',
          body: spec.payload,
          headers: {
            'content-type': 'application/json',
            accept: spec.stream ? 'text/event-stream' : 'application/json',
            'x-request-id': spec.requestId,
          },
          // The gateway's own timers own every phase (see the header comment).
          headersTimeout: 0,
          bodyTimeout: 0,
        },
        this,
      );
    } catch (err) {
      this.#fail(failureFromError(err));
    }
    return this.committed;
  }

  // ---- undici DispatchHandler ----

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#pendingAbort !== null) controller.abort(this.#pendingAbort);
  }

  onResponseStart(_c: Dispatcher.DispatchController, status: number): void {
    if (this.#phase !== 'waiting' || status < 200) return;
    this.#status = status;
    if (status === 200) {
      this.#phase = this.spec.stream ? 'streaming' : 'buffering';
    } else if (RELAYED_4XX.has(status)) {
      this.#phase = 'rejecting';
    } else {
      const reason = BUSY_STATUSES.has(status) ? 'upstream_busy' : 'upstream_status';
      this.#fail(new AttemptFailure(reason, `upstream status ${status}`, { status }));
    }
  }

  onResponseData(_c: Dispatcher.DispatchController, chunk: Buffer): void {
    switch (this.#phase) {
      case 'streaming':
      case 'committed':
        this.#onSse(chunk);
        return;
      case 'buffering':
        this.#bodyBytes += chunk.length;
        if (this.#bodyBytes > this.spec.maxBodyBytes) {
          this.#fail(
            new AttemptFailure('protocol_error', `response body over ${this.spec.maxBodyBytes} bytes`),
          );
        } else {
          this.#body.push(chunk);
        }
        return;
      case 'rejecting':
        if (this.#bodyBytes < MAX_REJECT_BODY) {
          this.#body.push(chunk);
          this.#bodyBytes += chunk.length;
        }
        return;
      default:
        return;
    }
  }

  onResponseEnd(): void {
    switch (this.#phase) {
      case 'buffering':
        this.#finishBuffered();
        return;
      case 'rejecting':
        this.#finish('rejected', null);
        return;
      case 'streaming':
        this.#fail(new AttemptFailure('protocol_error', 'stream ended before the first token'));
        return;
      case 'committed':
        this.#fail(new AttemptFailure('protocol_error', 'stream ended without [DONE]'));
        return;
      case 'closing':
        this.#finish('ok', null, true);
        return;
      default:
        return;
    }
  }

  onResponseError(_c: Dispatcher.DispatchController | null, err: Error): void {
    if (this.#phase === 'done') return;
    // The client already has the whole stream; the upstream's late error changes nothing.
    if (this.#phase === 'closing') this.#finish('ok', null, true);
    else this.#fail(failureFromError(err));
  }

  // ---- streaming ----

  #onSse(chunk: Buffer): void {
    let events: ReturnType<SseParser['push']>;
    try {
      events = this.#parser.push(chunk);
    } catch (err) {
      this.#fail(new AttemptFailure('protocol_error', (err as Error).message, { cause: err }));
      return;
    }
    const now = performance.now();
    const out: Buffer[] = [];
    let sawData = false;
    for (const ev of events) {
      const committed = this.#phase === 'committed';
      if (ev.data === null) {
        if (committed) out.push(ev.raw);
        continue;
      }
      sawData = true;
      if (ev.data === '[DONE]') {
        if (!committed) {
          this.#fail(new AttemptFailure('protocol_error', '[DONE] before the first token'));
          return;
        }
        out.push(ev.raw);
        this.#write(out);
        this.#closeClient();
        return;
      }
      let msg: StreamChunk | null;
      try {
        msg = JSON.parse(ev.data) as StreamChunk | null;
      } catch (err) {
        this.#write(out);
        this.#fail(new AttemptFailure('protocol_error', 'upstream event is not JSON', { cause: err }));
        return;
      }
      if (isErrorPayload(msg)) {
        this.#write(out);
        this.#fail(new AttemptFailure('in_band_error', 'upstream sent an error event'));
        return;
      }
      const usage = msg?.usage;
      if (usage != null && typeof usage === 'object') this.#takeUsage(usage);
      if (Array.isArray(msg?.choices) && msg.choices.length > 0) {
        if (committed) {
          this.#clock.token(now);
        } else {
          this.#commit(now);
          out.push(...this.#held);
          this.#held = [];
        }
        out.push(ev.raw);
      } else if (usage != null && !this.spec.clientWantsUsage) {
        // The usage-only chunk the client did not ask for: measured above, not forwarded.
      } else if (committed) {
        out.push(ev.raw);
      } else if (!this.#hold(ev.raw)) {
        return;
      }
    }
    if (this.#phase !== 'committed') return;
    if (sawData) this.#idleTimer?.refresh();
    this.#write(out);
  }

  #hold(raw: Buffer): boolean {
    this.#heldBytes += raw.length;
    if (this.#heldBytes > this.spec.maxEventBytes) {
      this.#fail(new AttemptFailure('protocol_error', 'too many events before the first token'));
      return false;
    }
    this.#held.push(raw);
    return true;
  }

  #takeUsage(usage: { prompt_tokens?: unknown; completion_tokens?: unknown }): void {
    if (typeof usage.prompt_tokens === 'number') this.#promptTokens = usage.prompt_tokens;
    if (typeof usage.completion_tokens === 'number') this.#completionTokens = usage.completion_tokens;
  }

  #commit(now: number): void {
    this.#clearFirstTokenTimer();
    this.#phase = 'committed';
    this.#clock.token(now);
    this.spec.res.writeHead(200, {
      ...this.spec.commitHeaders,
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
    });
    this.#armIdle();
    this.#settleCommit(null);
  }

  #armIdle(): void {
    this.#idleTimer = setTimeout(this.#onIdleTimeout, this.spec.idleTimeoutMs);
  }

  /** Writes to the client; when its buffer is full, pauses the upstream until 'drain'. */
  #write(out: Buffer[]): void {
    const { res } = this.spec;
    if (out.length === 0 || res.destroyed) return;
    const ok = res.write(out.length === 1 ? out[0] : Buffer.concat(out));
    if (ok || this.#stallTimer !== null) return;
    this.#controller?.pause();
    // The upstream is silent because we paused it, not because it stalled.
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    this.#idleTimer = null;
    this.#stallTimer = setTimeout(this.#onStall, this.spec.clientStallTimeoutMs);
    res.once('drain', this.#onDrain);
  }

  #onDrain = (): void => {
    if (this.#stallTimer === null) return;
    clearTimeout(this.#stallTimer);
    this.#stallTimer = null;
    if (this.#phase === 'done') return;
    this.#armIdle();
    this.#controller?.resume();
  };

  /** [DONE] was forwarded: end the client's response now; the upstream's own end finishes the attempt. */
  #closeClient(): void {
    this.#phase = 'closing';
    this.#endedAt = performance.now();
    this.spec.res.end();
  }

  // ---- non-streamed ----

  #finishBuffered(): void {
    const body = this.#body.length === 1 ? this.#body[0]! : Buffer.concat(this.#body);
    let msg: StreamChunk | null;
    try {
      msg = JSON.parse(body.toString('utf8')) as StreamChunk | null;
    } catch (err) {
      this.#fail(new AttemptFailure('protocol_error', 'upstream body is not JSON', { cause: err }));
      return;
    }
    if (isErrorPayload(msg)) {
      this.#fail(new AttemptFailure('in_band_error', 'upstream answered 200 with an error body'));
      return;
    }
    if (!Array.isArray(msg?.choices)) {
      this.#fail(new AttemptFailure('protocol_error', 'upstream body has no choices'));
      return;
    }
    if (msg.usage != null && typeof msg.usage === 'object') this.#takeUsage(msg.usage);
    const now = performance.now();
    this.#clearFirstTokenTimer();
    this.#phase = 'committed';
    this.#clock.token(now);
    this.spec.res.writeHead(200, {
      ...this.spec.commitHeaders,
      'content-type': 'application/json',
      'content-length': body.length,
    });
    this.spec.res.end(body);
    this.#endedAt = performance.now();
    this.#finish('ok', null, true);
  }

  // ---- timers and cancellation ----

  #onFirstTokenTimeout = (): void => {
    this.#firstTokenTimer = null;
    const reason = this.spec.cutByDeadline ? 'deadline' : 'first_token_timeout';
    this.#fail(new AttemptFailure(reason, `no first token within ${this.spec.firstTokenMs} ms`));
  };

  #onIdleTimeout = (): void => {
    if (this.#phase === 'closing') {
      // The client has its whole stream; only the upstream's end is missing.
      const committed = this.#isCommitted();
      this.#phase = 'done';
      this.#abortUpstream(new AttemptFailure('idle_timeout', 'upstream did not end after [DONE]'));
      this.#finish('ok', null, committed);
      return;
    }
    this.#fail(new AttemptFailure('idle_timeout', `no data event for ${this.spec.idleTimeoutMs} ms`));
  };

  #onStall = (): void => {
    this.#stallTimer = null;
    this.#fail(
      new AttemptFailure('client_stalled', `client did not read for ${this.spec.clientStallTimeoutMs} ms`),
    );
  };

  #onClientAbort = (): void => {
    if (this.#phase === 'closing') return;
    this.#fail(abortFailure(this.spec.signal));
  };

  #abortUpstream(reason: Error): void {
    if (this.#controller !== null) this.#controller.abort(reason);
    else this.#pendingAbort = reason;
  }

  #clearFirstTokenTimer(): void {
    if (this.#firstTokenTimer !== null) clearTimeout(this.#firstTokenTimer);
    this.#firstTokenTimer = null;
  }

  #isCommitted(): boolean {
    return this.#phase === 'committed' || this.#phase === 'closing';
  }

  /** The single exit for every failure, before or after the commit point. */
  #fail(failure: AttemptFailure): void {
    if (this.#phase === 'done') return;
    const committed = this.#isCommitted();
    // Set first: aborting below can call onResponseError synchronously.
    this.#phase = 'done';
    this.#abortUpstream(failure);
    if (committed) {
      const { res } = this.spec;
      if (failure.byClient) {
        res.destroy();
      } else if (!res.destroyed && !res.writableEnded) {
        const err =
          failure.clientError ?? new GatewayError('upstream_error', 'The backend failed during the stream');
        res.end(sseErrorFrames(err));
      }
      this.#endedAt ??= performance.now();
    }
    this.#finish('failed', failure, committed);
  }

  #settleCommit(failure: AttemptFailure | null): void {
    if (this.#commitSettled) return;
    this.#commitSettled = true;
    if (failure === null) this.#resolveCommit();
    else this.#rejectCommit(failure);
  }

  #finish(kind: AttemptKind, failure: AttemptFailure | null, committed = this.#isCommitted()): void {
    this.#phase = 'done';
    this.#clearFirstTokenTimer();
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    if (this.#stallTimer !== null) clearTimeout(this.#stallTimer);
    this.#idleTimer = this.#stallTimer = null;
    this.spec.signal.removeEventListener('abort', this.#onClientAbort);
    this.spec.res.off('drain', this.#onDrain);
    this.#parser.end();
    this.#settleCommit(committed || kind === 'rejected' ? null : failure);
    const endedAt = this.#endedAt ?? performance.now();
    this.#resolveDone({
      kind,
      committed,
      failure,
      status: this.#status,
      upstreamMessage: kind === 'rejected' ? rejectMessage(this.#body) : null,
      promptTokens: this.#promptTokens,
      completionTokens: this.#completionTokens,
      latencies: committed ? this.#clock.finish(endedAt, this.#completionTokens) : null,
    });
  }
}

interface StreamChunk {
  choices?: unknown;
  usage?: { prompt_tokens?: unknown; completion_tokens?: unknown } | null;
  error?: unknown;
  object?: unknown;
}

/** vLLM's in-band error: `{"error":{...}}`, or the flat `{"object":"error",...}` of older versions. */
function isErrorPayload(msg: StreamChunk | null): boolean {
  return msg !== null && typeof msg === 'object' && (msg.error != null || msg.object === 'error');
}

/** The upstream's error message from a 4xx body, shortened; for the admission log only. */
function rejectMessage(body: Buffer[]): string | null {
  try {
    const msg = JSON.parse(Buffer.concat(body).toString('utf8')) as {
      error?: { message?: unknown } | string;
      message?: unknown;
    };
    const text = typeof msg.error === 'object' ? msg.error?.message : (msg.message ?? msg.error);
    return typeof text === 'string' ? text.slice(0, 500) : null;
  } catch {
    return null;
  }
}
