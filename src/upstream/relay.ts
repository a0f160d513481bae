// One attempt on one backend: dispatch the request, wait for the first token, then relay the
// stream to the client (or fold it into one JSON body). It is an undici dispatch handler, so it
// sees raw bytes and can pause the upstream socket when the client is slow.
//
// Invariants:
// - Nothing is written to the client before the commit point: the first SSE data event with a
//   non-empty `choices` (for chat, the role chunk, as vLLM's benchmark counts it), or, for a
//   pass-through non-streamed request, its whole body. Until then a failure is returned to the
//   caller, which may retry on another backend. After it, this attempt owns the response and ends
//   it itself.
// - Three ways to answer the client, one upstream protocol: 'stream' relays the SSE events;
//   'assemble' reads the same stream and writes the non-streamed JSON vLLM would have sent when it
//   ends (assemble.ts), so every request gets a measured TTFT and TPOT; 'passthrough' (shapes the
//   assembler does not cover) asks the backend for JSON and relays the body.
// - Exactly one timer guards each phase: first token (from dispatch; headers + body for a
//   pass-through body, which only arrives when generation ends), idle between data events after
//   commit (comments do not reset it), and client stall while the client does not drain. None of
//   them caps a healthy stream's total length.
// - Events are forwarded as their original bytes; only the usage chunk is dropped when the
//   client did not ask for usage (the gateway always asks the backend for it), and a blank line
//   that stands alone between events (no event at all) is not forwarded.
// - After the commit point a relayed stream parses only what it must: an event whose bytes show a
//   plain output chunk (OutputShape: the bytes around the text are those of the stream's last
//   plain chunk, else isPlainOutput: a `"choices":[{`, non-empty `content` or `text`, no
//   `"usage"`, no `"error"`, braces at both ends) is timed and forwarded undecoded; anything else
//   (the usage chunk, an error, an empty delta, an unusual serialisation) takes the full JSON path.
//   Inside a JSON string every quote is escaped, so these quoted keys only match real keys.
// - A committed stream ends with the upstream's [DONE], or with one error event + [DONE] (the
//   backend failed, or the caller cut it: then the cut's own error), or with a destroyed socket
//   when the client is gone or stalled: nothing else can reach it then. A committed assembly that
//   fails ends with the error envelope instead, since nothing was written yet.
// - `done` always resolves, exactly once; `committed` settles exactly once: it resolves with how
//   the attempt took the response (`first_token` for a stream, `body` for a whole body passed
//   through, `rejected` when a 4xx is to be relayed at once), or rejects with the AttemptFailure of a
//   pre-commit failure. Only `first_token` is a first token (what the TTFT fit may learn).
import { randomUUID } from 'node:crypto';
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Dispatcher } from 'undici';
import { GatewayError, headersWith, sseErrorFrames, writeErrorResponse } from '../errors/index.ts';
import { markStage } from '../telemetry/stages.ts';
import { type AssembleKind, Assembler, type StreamChunk } from './assemble.ts';
import type { Cancel } from './cancel.ts';
import { carriesOutput, DONE, errorPayloadFacts, isErrorPayload, OutputShape } from './chunk.ts';
import { ChunkedWriter } from './chunked-writer.ts';
import { AttemptFailure, abortFailure, type FailureReason, failureFromError } from './failure.ts';
import { type DecodeMeter, type Latencies, TokenClock } from './measure.ts';
import { SseEventTooLargeError, SseParser } from './sse-parser.ts';

/**
 * Statuses relayed to the client as an error envelope, not a backend failure: the request's own
 * 4xx, and 501 (a feature the request asks for and the server lacks); a 404 or a 501 only once a
 * second backend agrees (failure.ts, upstream_not_found and upstream_not_implemented).
 */
const RELAYED_STATUSES: ReadonlySet<number> = new Set([400, 404, 413, 422, 501]);
/** Of those, the statuses a second backend settles, and the reason each is until it does. */
const SETTLED_BY_SECOND: ReadonlyMap<number, FailureReason> = new Map<number, FailureReason>([
  [404, 'upstream_not_found'],
  [501, 'upstream_not_implemented'],
]);
const BUSY_STATUSES: ReadonlySet<number> = new Set([408, 429]);
/** Bytes of a 200 JSON body to a stream read for an in-band error; the rest is discarded. */
const MAX_UNSTREAMED_BODY = 64 * 1024;

/** How the client is answered (see the header comment). */
export type ClientMode = 'stream' | 'assemble' | 'passthrough';

export interface AttemptSpec {
  /** The backend's Authorization header value (its API key), or null. */
  authorization: string | null;
  path: string;
  /** The JSON body sent upstream (already rewritten: stream + include_usage unless passthrough). */
  payload: Buffer;
  requestId: string;
  mode: ClientMode;
  /** With mode 'assemble': which body to build. */
  assembleKind: AssembleKind;
  clientWantsUsage: boolean;
  res: ServerResponse;
  /** Headers for the client's 200, written at the commit point. */
  commitHeaders: OutgoingHttpHeaders;
  /** Headers on an error envelope this attempt writes after its commit point (assembly). */
  errorHeaders: OutgoingHttpHeaders;
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
  signal: Cancel;
  /** The backend's decode-pace meter (token gaps), or null. */
  meter: DecodeMeter | null;
  /**
   * Sequences the stream interleaves: `n` (times the prompts of a completion). Above 1, every data
   * event is parsed (its choice's index names its sequence) and TokenClock times them apart.
   */
  sequences: number;
}

export type AttemptKind = 'ok' | 'rejected' | 'failed';

export interface AttemptEnd {
  kind: AttemptKind;
  committed: boolean;
  failure: AttemptFailure | null;
  /** Upstream HTTP status, when headers were received. */
  status: number | null;
  /** For 'rejected' and an in-band rejection: the upstream's error message (capped), which the client may be told. */
  upstreamMessage: string | null;
  /** The request field a relayed 4xx named (vLLM's `param`), if any. */
  upstreamParam: string | null;
  promptTokens: number | null;
  completionTokens: number | null;
  latencies: Latencies | null;
}

/** How an attempt took the response (what `committed` resolves with). */
export type CommitKind = 'first_token' | 'body' | 'rejected';

/** A response head's headers as undici hands them over (names in lower case). */
type ResponseHeaders = Record<string, string | string[] | undefined>;

/** After [DONE], how long the upstream has to end its response (vLLM ends it at once). */
const CLOSE_WAIT_MS = 1_000;
/**
 * How long a pause for the client's full buffer lasts before the client counts as holding the
 * stream back (Latencies.clientPaced): longer than a busy loop takes to come back to a 'drain'
 * the kernel gives at once, shorter than a decode step of a stream it would slow.
 */
const CLIENT_HELD_MS = 10;

// 'unstreamed': a 200 with a JSON body where a stream was asked for (unstreamedFailure).
type Phase =
  | 'waiting'
  | 'streaming'
  | 'buffering'
  | 'rejecting'
  | 'unstreamed'
  | 'committed'
  | 'closing'
  | 'done';

export class Attempt implements Dispatcher.DispatchHandler {
  readonly spec: AttemptSpec;
  readonly done: Promise<AttemptEnd>;
  readonly committed: Promise<CommitKind>;
  #started = false;
  #phase: Phase = 'waiting';
  #status: number | null = null;
  #controller: Dispatcher.DispatchController | null = null;
  #pendingAbort: Error | null = null;
  #parser: SseParser;
  /** Tells a plain output chunk by its bytes (chunk.ts). */
  readonly #shape = new OutputShape();
  #clock: TokenClock;
  #assembler: Assembler | null;
  #held: Buffer[] = [];
  #heldBytes = 0;
  #body: Buffer[] = [];
  #bodyBytes = 0;
  #promptTokens: number | null = null;
  #completionTokens: number | null = null;
  /** Relayed events that carried output: the count of a stream cut before its usage chunk. */
  #outputEvents = 0;
  #endedAt: number | null = null;
  #firstTokenTimer: NodeJS.Timeout | null = null;
  #idleTimer: NodeJS.Timeout | null = null;
  /** When the idle period began: the last data event, or the arming of the idle timer. */
  #lastDataAt = 0;
  #stallTimer: NodeJS.Timeout | null = null;
  /** Bytes handed to the client's response so far. */
  #handed = 0;
  /** How many of them the kernel had taken when the stall timer was last armed. */
  #stallTaken = 0;
  /** performance.now() when the client's buffer last filled and the upstream was paused. */
  #pausedAt = 0;
  /** After the first write of a chunked stream: frames and writes its events (chunked-writer.ts). */
  #chunks: ChunkedWriter | null = null;
  #resolveDone!: (end: AttemptEnd) => void;
  #resolveCommit!: (how: CommitKind) => void;
  #rejectCommit!: (f: AttemptFailure) => void;
  #commitSettled = false;

  constructor(spec: AttemptSpec) {
    this.spec = spec;
    this.#parser = new SseParser({ maxEventBytes: spec.maxEventBytes });
    this.#clock = new TokenClock(spec.startedAt, spec.meter, spec.sequences);
    this.#assembler = spec.mode === 'assemble' ? new Assembler(spec.assembleKind) : null;
    this.done = new Promise((resolve) => {
      this.#resolveDone = resolve;
    });
    this.committed = new Promise<CommitKind>((resolve, reject) => {
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
  start(dispatcher: Dispatcher): Promise<CommitKind> {
    this.#started = true;
    const { spec } = this;
    if (spec.signal.aborted) {
      this.#fail(abortFailure(spec.signal));
      return this.committed;
    }
    spec.signal.onAbort(this.#onClientAbort);
    this.#firstTokenTimer = setTimeout(this.#onFirstTokenTimeout, spec.firstTokenMs);
    markStage(spec.requestId, 'dispatched');
    try {
      dispatcher.dispatch(
        {
          path: spec.path,
          method: 'POST',
          body: spec.payload,
          headers: upstreamHeaders(spec),
          // The gateway's own timers own every phase (see the header comment).
          headersTimeout: 0,
          bodyTimeout: 0,
        },
        this,
      );
    } catch (err) {
      this.#fail(failureFromError(err, 'unsent'));
    }
    return this.committed;
  }

  // ---- undici DispatchHandler ----

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#pendingAbort !== null) controller.abort(this.#pendingAbort);
  }

  onResponseStart(_c: Dispatcher.DispatchController, status: number, headers: ResponseHeaders): void {
    if (this.#phase !== 'waiting' || status < 200) return;
    this.#status = status;
    if (status === 200) {
      this.#phase =
        this.spec.mode === 'passthrough' ? 'buffering' : isJson(headers) ? 'unstreamed' : 'streaming';
    } else if (RELAYED_STATUSES.has(status)) {
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
            new AttemptFailure('response_too_large', `response body over ${this.spec.maxBodyBytes} bytes`, {
              clientError: new GatewayError(
                'upstream_error',
                `The answer grew past ${this.spec.maxBodyBytes} bytes; stream it, or lower max_tokens or what it returns per token (logprobs).`,
              ),
            }),
          );
        } else {
          this.#body.push(chunk);
        }
        return;
      case 'rejecting':
      case 'unstreamed':
        // A 4xx body is read for its message up to one event's bound (maxEventBytes): vLLM's
        // validation errors can quote the request back, a long prompt's body and more, and a
        // body cut short does not parse, which would lose the message that says what to fix. A
        // 200 body to a stream is read only as far as an error body goes (MAX_UNSTREAMED_BODY):
        // a backend that ignored `stream` sends its whole answer, which is no error.
        if (this.#bodyBytes < (this.#phase === 'rejecting' ? this.spec.maxEventBytes : MAX_UNSTREAMED_BODY)) {
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
      case 'rejecting': {
        const status = this.#status!;
        const unsettled = SETTLED_BY_SECOND.get(status);
        if (unsettled === undefined) this.#finish('rejected', null);
        else {
          this.#fail(
            new AttemptFailure(unsettled, `upstream status ${status}`, {
              status,
              upstreamMessage: rejectFacts(this.#body).message,
            }),
          );
        }
        return;
      }
      case 'unstreamed':
        this.#fail(unstreamedFailure(this.#body));
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
    // A whole body's head comes with the body, after the generation: only a stream's is early.
    else
      this.#fail(
        failureFromError(
          err,
          this.#status === null && this.spec.mode !== 'passthrough' ? 'before_head' : 'later',
        ),
      );
  }

  // ---- streaming ----

  #onSse(chunk: Buffer): void {
    let events: ReturnType<SseParser['push']>;
    try {
      events = this.#parser.push(chunk);
    } catch (err) {
      // An event past max_event_bytes (an echoed long prompt's logprobs) is this request's size,
      // as a body past max_body_bytes is: another backend would send it as large, so it is neither
      // retried there nor counted against this one.
      if (err instanceof SseEventTooLargeError) {
        this.#fail(
          new AttemptFailure('response_too_large', err.message, {
            cause: err,
            clientError: new GatewayError(
              'upstream_error',
              `An event of the answer grew past ${this.spec.maxEventBytes} bytes; lower what it returns per token (logprobs, prompt_logprobs, echo).`,
            ),
          }),
        );
      } else {
        this.#fail(new AttemptFailure('protocol_error', (err as Error).message, { cause: err }));
      }
      return;
    }
    const now = performance.now();
    const assembler = this.#assembler;
    // What this read hands to the client, in order (#emit). Once the stream has a writer every
    // event goes to it as it comes (the writer writes them together at the end of the tick), and
    // this list stays empty (no storage is made for it); until then it collects them for #write.
    const out: Buffer[] = [];
    let sawData = false;
    for (const ev of events) {
      const committed = this.#phase === 'committed';
      const bytes = ev.dataBytes;
      if (bytes === null) {
        if (committed && assembler === null) this.#emit(ev.raw, out);
        continue;
      }
      sawData = true;
      if (committed && assembler === null && this.spec.sequences === 1 && this.#shape.test(bytes)) {
        this.#outputEvents++;
        this.#clock.token(now);
        this.#emit(ev.raw, out);
        continue;
      }
      if (bytes.length === DONE.length && bytes.equals(DONE)) {
        if (!committed) {
          this.#fail(new AttemptFailure('protocol_error', '[DONE] before the first token'));
          return;
        }
        if (assembler !== null) {
          this.#writeAssembled(assembler);
          return;
        }
        this.#emit(ev.raw, out);
        this.#write(out);
        this.#closeClient();
        return;
      }
      let msg: StreamChunk | null;
      try {
        msg = JSON.parse(ev.data as string) as StreamChunk | null;
      } catch (err) {
        this.#write(out);
        this.#fail(new AttemptFailure('protocol_error', 'upstream event is not JSON', { cause: err }));
        return;
      }
      if (isErrorPayload(msg)) {
        this.#write(out);
        this.#fail(inBandFailure(msg, committed, 'sent an error event'));
        return;
      }
      const usage = msg?.usage;
      const choices = Array.isArray(msg?.choices) && msg.choices.length > 0 ? msg.choices : null;
      // With several sequences a chunk's own usage (continuous_usage_stats) counts its choice's
      // tokens alone; the final chunk, which has no choices, counts them all.
      if (usage != null && typeof usage === 'object' && (this.spec.sequences === 1 || choices === null))
        this.#takeUsage(usage);
      if (assembler !== null && msg !== null) {
        assembler.add(msg);
        // Invariant: an answer built in memory is bounded as one passed through whole is.
        if (assembler.chars > this.spec.maxBodyBytes) {
          this.#fail(
            new AttemptFailure(
              'response_too_large',
              `assembled answer over ${this.spec.maxBodyBytes} characters`,
              {
                clientError: new GatewayError(
                  'upstream_error',
                  `The answer grew past ${this.spec.maxBodyBytes} characters; stream it, or lower max_tokens or the logprobs it asks for.`,
                ),
              },
            ),
          );
          return;
        }
      }
      if (choices !== null) {
        const output = carriesOutput(choices);
        if (output) this.#outputEvents++;
        // A sequence's own timing runs from its first output to its last token: the chunk that
        // ends it may carry no text (EOS) and still closes its span. Only a chat's role chunks,
        // which neither carry output nor end anything, start no sequence's timing.
        const timed = output || endsChoice(choices);
        if (committed) {
          this.#clock.token(now, choiceIndex(choices), timed);
        } else {
          this.#commit(now, choiceIndex(choices), timed);
          out.push(...this.#held);
          this.#held = [];
        }
        this.#emit(ev.raw, out);
      } else if (usage != null && !this.spec.clientWantsUsage) {
        // The usage-only chunk the client did not ask for: measured above, not forwarded.
      } else if (committed) {
        this.#emit(ev.raw, out);
      } else if (!this.#hold(ev.raw)) {
        return;
      }
    }
    if (this.#phase !== 'committed') return;
    if (sawData) this.#lastDataAt = now;
    if (this.#handed > 0) this.#write(out);
    else this.#writeOpening(out);
  }

  /**
   * The response's first write: its head and first token, the client's TTFT. res.write corks the
   * socket and sends what it holds from a tick, which runs only after the rest of this upstream
   * read's parsing and the ticks queued before it; this write leaves at once (a few hundredths of
   * a millisecond sooner, docs/benchmarks.md). Only the cork res.write itself took is lifted. (A
   * first token read together with [DONE] leaves with the last chunk, in the one write
   * #closeClient makes.)
   */
  #writeOpening(out: Buffer[]): void {
    const socket = this.spec.res.socket;
    const corked = socket?.writableCorked ?? 0;
    this.#write(out);
    if (socket != null && socket.writableCorked > corked) socket.uncork();
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

  /** The first token: from here the attempt owns the response (an assembly still writes nothing). */
  #commit(now: number, choice = 0, output = true): void {
    this.#clearFirstTokenTimer();
    this.#phase = 'committed';
    this.#clock.token(now, choice, output);
    if (this.#assembler === null) {
      this.spec.res.writeHead(
        200,
        headersWith(this.spec.commitHeaders, {
          'content-type': 'text/event-stream; charset=utf-8',
          'cache-control': 'no-cache',
        }),
      );
    }
    markStage(this.spec.requestId, 'committed');
    this.#armIdle();
    this.#settleCommit(null, 'first_token');
  }

  // The idle timer is not moved on every data event (a timer-list update per token): an event only
  // notes its time, and the timer, when it fires, waits again for whatever is left of the period
  // since the last one.
  #armIdle(): void {
    this.#lastDataAt = performance.now();
    this.#idleTimer = setTimeout(this.#onIdleTimeout, this.#idleLimitMs());
  }

  /**
   * How long the upstream may send nothing. After [DONE] only its end is missing, which vLLM sends
   * with it: a response held open past CLOSE_WAIT_MS is dropped, not waited on for idle_timeout_ms
   * with the request's slot held and a shutdown's drain waiting for it.
   */
  #idleLimitMs(): number {
    return this.#phase === 'closing'
      ? Math.min(this.spec.idleTimeoutMs, CLOSE_WAIT_MS)
      : this.spec.idleTimeoutMs;
  }

  /**
   * Writes what `out` collected to the client: the first write (it carries the head) through
   * res.write, and every write of a stream that has no ChunkedWriter after it (an HTTP/1.0 client,
   * whose response Node does not chunk). Once a stream has its writer, #emit hands each event to it
   * and `out` is empty.
   *
   * Invariant: an answer assembled in memory writes nothing here. Its client asked for one JSON
   * body, which #writeAssembled sends whole, or, on a failure, the error envelope: no event bytes
   * may reach it first (they would go out under an implicit 200 with no head of ours).
   */
  #write(out: Buffer[]): void {
    const { res } = this.spec;
    if (out.length === 0 || res.destroyed || this.#assembler !== null) return;
    for (const b of out) this.#handed += b.length;
    const ok = res.write(out.length === 1 ? out[0] : Buffer.concat(out));
    if (this.spec.mode === 'stream') this.#chunks = ChunkedWriter.of(res, this.#wrote);
    this.#wrote(ok);
  }

  /**
   * `raw` for the client: straight to the stream's writer once it has one (which writes what it
   * gets in one tick together), else into `out` for #write. The writer only exists from the first
   * write on, which no event of the same read follows into `out`: the order is kept.
   */
  #emit(raw: Buffer, out: Buffer[]): void {
    const chunks = this.#chunks;
    if (chunks === null) out.push(raw);
    else if (!this.spec.res.destroyed) {
      this.#handed += raw.length;
      chunks.push(raw);
    }
  }

  /**
   * What emits the 'drain' the relay waits for: the socket once a writer writes to it (its drain
   * is also what makes the response emit one), else the response. Set before the first wait.
   */
  get #drainSource(): NodeJS.EventEmitter {
    return this.#chunks?.socket ?? this.spec.res;
  }

  /** When the client's buffer is full, pauses the upstream until 'drain'. */
  #wrote = (ok: boolean): void => {
    if (ok || this.#stallTimer !== null || this.#phase === 'done') return;
    this.#controller?.pause();
    this.#clock.paused();
    this.#pausedAt = performance.now();
    // The upstream is silent because we paused it, not because it stalled.
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    this.#idleTimer = null;
    this.#stallTaken = this.#handed - unreadBytes(this.spec.res);
    this.#stallTimer = setTimeout(this.#onStall, this.spec.clientStallTimeoutMs);
    this.#drainSource.once('drain', this.#onDrain);
  };

  #offDrain(): void {
    this.#drainSource.off('drain', this.#onDrain);
  }

  #onDrain = (): void => {
    if (this.#stallTimer === null) return;
    clearTimeout(this.#stallTimer);
    this.#stallTimer = null;
    // Invariant: a client is taken for slow (its TPOT not the backend's) only when it held the
    // stream back: one write past the socket's high-water mark (an event of logprobs, a few read
    // together) returns false and drains on the next turn of the loop for a client reading at once.
    if (performance.now() - this.#pausedAt >= CLIENT_HELD_MS) this.#clock.heldBack();
    if (this.#phase === 'done') return;
    this.#armIdle();
    this.#controller?.resume();
  };

  /** [DONE] was forwarded: end the client's response now; the upstream's own end finishes the attempt. */
  #closeClient(last?: Buffer): void {
    this.#phase = 'closing';
    this.#endedAt = performance.now();
    const { res } = this.spec;
    // The events still queued and the last chunk leave in one write.
    const chunks = this.#chunks;
    if (chunks === null) res.end(last);
    else {
      chunks.socket.cork();
      chunks.flush();
      res.end(last);
      chunks.socket.uncork();
    }
    // Invariant: nothing more is written to the client, so the upstream is never held paused for
    // it. An ended response emits no 'drain', so a pause taken on the last write would otherwise
    // hold the upstream (and its slot) until the stall timeout and report the client as stalled.
    lingerAtMost(res, this.spec.clientStallTimeoutMs);
    // The idle timer restarts with the close wait (a running one was armed with idle_timeout_ms).
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    const paused = this.#stallTimer !== null;
    if (paused) {
      clearTimeout(this.#stallTimer as NodeJS.Timeout);
      this.#stallTimer = null;
      this.#offDrain();
    }
    this.#armIdle();
    if (paused) this.#controller?.resume();
  }

  /** The assembled stream ended: the client gets the one body vLLM would have sent. */
  #writeAssembled(assembler: Assembler): void {
    const body = assembler.body();
    this.#writeJsonHead(body.length);
    this.#closeClient(body);
  }

  /** The 200 head of a whole JSON body (an assembled or passed-through non-streamed answer). */
  #writeJsonHead(length: number): void {
    this.spec.res.writeHead(
      200,
      headersWith(this.spec.commitHeaders, { 'content-type': 'application/json', 'content-length': length }),
    );
  }

  // ---- non-streamed pass-through ----

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
      this.#fail(inBandFailure(msg, false, 'answered 200 with an error body'));
      return;
    }
    if (!Array.isArray(msg?.choices)) {
      this.#fail(new AttemptFailure('protocol_error', 'upstream body has no choices'));
      return;
    }
    if (msg.usage != null && typeof msg.usage === 'object') this.#takeUsage(msg.usage);
    this.#clearFirstTokenTimer();
    this.#phase = 'committed';
    this.#settleCommit(null, 'body');
    this.#writeJsonHead(body.length);
    this.spec.res.end(body);
    lingerAtMost(this.spec.res, this.spec.clientStallTimeoutMs);
    this.#endedAt = performance.now();
    this.#finish('ok', null, true);
  }

  // ---- timers and cancellation ----

  #onFirstTokenTimeout = (): void => {
    this.#firstTokenTimer = null;
    const ms = Math.round(this.spec.firstTokenMs);
    if (this.spec.cutByDeadline) {
      this.#fail(new AttemptFailure('deadline', `no first token within ${ms} ms`));
    } else if (this.#controller === null) {
      // undici starts the request (onRequestStart) only on a connected socket: without it the
      // request was never written, and no engine saw it. The timer runs from dispatch, so it
      // covers the connect too, and for an interactive budget it fires before the pool's connect
      // timeout (3 s by default).
      this.#fail(new AttemptFailure('connect_timeout', `no connection within ${ms} ms`));
    } else {
      this.#fail(new AttemptFailure('first_token_timeout', `no first token within ${ms} ms`));
    }
  };

  #onIdleTimeout = (): void => {
    const left = this.#idleLimitMs() - (performance.now() - this.#lastDataAt);
    if (left >= 1) {
      this.#idleTimer = setTimeout(this.#onIdleTimeout, left);
      return;
    }
    this.#idleTimer = null;
    if (this.#phase === 'closing') {
      // The client has its whole answer; only the upstream's end is missing.
      const committed = this.#isCommitted();
      this.#phase = 'done';
      this.#abortUpstream(new AttemptFailure('idle_timeout', 'upstream did not end after [DONE]'));
      this.#finish('ok', null, committed);
      return;
    }
    this.#fail(new AttemptFailure('idle_timeout', `no data event for ${this.spec.idleTimeoutMs} ms`));
  };

  /**
   * Invariant: a client whose buffer stays full is cut as stalled unless it reads at least
   * READ_AT_LEAST bytes in every clientStallTimeoutMs. 'drain' comes only once all of a large event
   * is out, which a slow link may take longer than the timeout for; a client reading a trickle
   * would hold its slot, the paused upstream and the engine's sequence for good.
   */
  #onStall = (): void => {
    const taken = this.#handed - unreadBytes(this.spec.res);
    if (taken - this.#stallTaken >= READ_AT_LEAST) {
      this.#stallTaken = taken;
      this.#stallTimer = setTimeout(this.#onStall, this.spec.clientStallTimeoutMs);
      return;
    }
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
        this.#chunks?.discard();
        res.destroy();
      } else if (!res.destroyed && !res.writableEnded) {
        this.#chunks?.flush();
        const err =
          failure.clientError ?? new GatewayError('upstream_error', 'The backend failed during the stream');
        if (res.headersSent) res.end(sseErrorFrames(err));
        else writeErrorResponse(res, err, this.spec.errorHeaders);
        lingerAtMost(res, this.spec.clientStallTimeoutMs);
      }
      this.#endedAt ??= performance.now();
    }
    this.#finish('failed', failure, committed);
  }

  #settleCommit(failure: AttemptFailure | null, how: CommitKind): void {
    if (this.#commitSettled) return;
    this.#commitSettled = true;
    if (failure === null) this.#resolveCommit(how);
    else this.#rejectCommit(failure);
  }

  #finish(kind: AttemptKind, failure: AttemptFailure | null, committed = this.#isCommitted()): void {
    this.#phase = 'done';
    this.#clearFirstTokenTimer();
    if (this.#idleTimer !== null) clearTimeout(this.#idleTimer);
    if (this.#stallTimer !== null) clearTimeout(this.#stallTimer);
    this.#idleTimer = this.#stallTimer = null;
    this.spec.signal.offAbort(this.#onClientAbort);
    this.#offDrain();
    this.#parser.end();
    // Committed: settled at the commit already. Otherwise only a relayed 4xx takes the response.
    this.#settleCommit(committed || kind === 'rejected' ? null : failure, 'rejected');
    const endedAt = this.#endedAt ?? performance.now();
    // Usage is the backend's own count. A committed stream that ended without it (cut at
    // shutdown, dropped upstream) reports what it relayed: vLLM sends one output token per event
    // (more only under speculative decoding, so this can undercount, never overcount).
    if (this.#completionTokens === null && committed && this.spec.mode !== 'passthrough')
      this.#completionTokens = this.#outputEvents;
    const rejected = kind === 'rejected' ? rejectFacts(this.#body) : null;
    this.#resolveDone({
      kind,
      committed,
      failure,
      status: this.#status,
      upstreamMessage: rejected !== null ? rejected.message : (failure?.upstreamMessage ?? null),
      upstreamParam: rejected !== null ? rejected.param : (failure?.upstreamParam ?? null),
      promptTokens: this.#promptTokens,
      completionTokens: this.#completionTokens,
      // A pass-through body is one event at the end: no first token is observable there.
      latencies: committed
        ? this.#clock.finish(endedAt, this.#completionTokens, this.spec.mode !== 'passthrough')
        : null,
    });
  }
}

/**
 * What a client whose buffer is full must read in each stall period to keep its response: 256 KiB
 * per clientStallTimeoutMs (about 70 kbit/s at the default 30 s).
 */
export const READ_AT_LEAST = 256 * 1024;

/**
 * A count of the bytes written to `res` and not yet taken by the kernel that falls as the client
 * reads: compare its changes, not its value. A large write is one chunk to the stream, whose length
 * drops only when all of it is written, and is also in libuv's write queue (the handle's
 * writeQueueSize, which node's net module reads too), which drops as the client reads. The part
 * libuv has not sent counts in both, so the count may fall up to twice as fast as the client reads
 * (READ_AT_LEAST may be met by half of it, near the end of a write).
 */
function unreadBytes(res: ServerResponse): number {
  const socket = res.socket as (Socket & { _handle?: { writeQueueSize?: number } | null }) | null;
  // res.writableLength already holds the socket's own buffered length.
  return res.writableLength + (socket?._handle?.writeQueueSize ?? 0);
}

/**
 * Called after the last write of a response. Invariant: a client that reads less than
 * READ_AT_LEAST of what is still buffered for it in `ms` loses its socket, as a stream's client
 * does (the stall timer); one that reads at least that much each period keeps it. With the response ended nothing else would close it: the
 * keep-alive timeout starts only once everything is flushed, and the server sets no socket
 * timeout (a long generation is silent between its head and its first token).
 */
function lingerAtMost(res: ServerResponse, ms: number): void {
  if (res.writableFinished || res.destroyed) return;
  // All of it handed to the kernel: 'finish' follows, then the keep-alive timeout applies.
  let last = unreadBytes(res);
  if (last === 0) return;
  const check = () => {
    const now = unreadBytes(res);
    if (last - now >= READ_AT_LEAST) {
      last = now;
      linger = setTimeout(check, ms);
    } else {
      res.destroy();
    }
  };
  let linger = setTimeout(check, ms);
  const clear = () => clearTimeout(linger);
  res.once('finish', clear);
  res.once('close', clear);
}

/** Longest upstream 4xx message passed on to the client (DESIGN section 4). */
export const MAX_REJECT_MESSAGE = 500;

/**
 * An in-band error as a failure. Before the commit point one that names a status the gateway
 * relays is an in-band rejection, which the attempt loop settles with another backend (failure.ts);
 * any other, and every one after the commit point, is the backend's in-band error.
 */
function inBandFailure(msg: StreamChunk | null, committed: boolean, what: string): AttemptFailure {
  const { code, message, param } = errorPayloadFacts(msg);
  if (!committed && code !== null && RELAYED_STATUSES.has(code)) {
    return new AttemptFailure('in_band_rejection', `upstream ${what} naming ${code}`, {
      status: code,
      upstreamMessage: capped(message),
      upstreamParam: param,
    });
  }
  // Its text is the one detail of an engine failure (vLLM's "EngineCore encountered an issue",
  // an out-of-memory) the operator gets: kept in the failure, which only the log reads.
  const named = code === null ? '' : ` naming ${code}`;
  const text = message === null ? '' : `: ${capped(message)}`;
  return new AttemptFailure('in_band_error', `upstream ${what}${named}${text}`);
}

/** A chunk's first entry carries a finish reason: its choice ends there. */
function endsChoice(choices: unknown[]): boolean {
  const reason = (choices[0] as { finish_reason?: unknown } | null)?.finish_reason;
  return reason !== undefined && reason !== null;
}

/** The choice a chunk's first entry belongs to (vLLM sends one choice per chunk), or 0. */
function choiceIndex(choices: unknown[]): number {
  const index = (choices[0] as { index?: unknown } | null)?.index;
  return typeof index === 'number' ? index : 0;
}

/** The response's content-type names JSON (a stream's is text/event-stream, or absent). */
function isJson(headers: ResponseHeaders): boolean {
  const type = headers['content-type'];
  return typeof type === 'string' && type.toLowerCase().includes('json');
}

/**
 * A 200 with a JSON body to a request sent as a stream. vLLM answers so with an error body for
 * some requests it cannot serve (issue vllm#21704, and again in 0.15-0.16): that is an in-band
 * error, a rejection when it names a relayed status, which a second backend settles like one in a
 * stream. Anything else (a backend that ignored `stream`) is a protocol error: the client asked
 * for a stream and this body cannot be relayed as one. Only the first MAX_UNSTREAMED_BODY bytes
 * are kept: an error body is small, and a longer one is no error.
 */
function unstreamedFailure(body: Buffer[]): AttemptFailure {
  // Cut at MAX_UNSTREAMED_BODY, or not JSON at all: not an error body.
  const msg = parsedBody(body);
  return isErrorPayload(msg)
    ? inBandFailure(msg, false, 'answered a stream with a JSON error body')
    : new AttemptFailure('protocol_error', 'upstream answered a stream with a JSON body, not events');
}

/** The upstream's error message (capped) and the field it names, from a 4xx body. */
function rejectFacts(body: Buffer[]): { message: string | null; param: string | null } {
  const msg = parsedBody(body);
  if (msg === null) return { message: null, param: null };
  const { message, param } = errorPayloadFacts(msg);
  return { message: capped(message), param };
}

/** A kept error body as JSON, or null when it is not JSON (or was cut short). */
function parsedBody(body: Buffer[]): StreamChunk | null {
  try {
    return JSON.parse(Buffer.concat(body).toString('utf8')) as StreamChunk | null;
  } catch {
    return null;
  }
}

/** An upstream message as the client may be told it: at most MAX_REJECT_MESSAGE characters. */
function capped(message: string | null): string | null {
  return message === null ? null : message.slice(0, MAX_REJECT_MESSAGE);
}

/**
 * The x-request-id an attempt sends upstream: the request's id, then 60 random bits of its own.
 * Invariant: two attempts in flight at once, of any gateway instance, send the same id only by a
 * 2^-60 chance (and only with the same client id); the suffix tells nothing (no counter: vLLM
 * names its response by this header, and the client reads that name). vLLM takes
 * the header as the engine's request id, and from late 2024 up to 0.11 it refused a second request
 * whose id was still running (400 "already running"); behind several API servers a repeat reached
 * the engine and broke it. A client that reuses its id, or retries while the backend still runs
 * its aborted first try, must not get that. The client's id comes first, so vLLM's log is still
 * searched by it.
 */
function upstreamRequestId(requestId: string): string {
  const r = randomUUID();
  // A version-4 UUID's first 16 hex digits, less the dash: 60 random bits and the version digit.
  return `${requestId}.${r.slice(0, 8)}${r.slice(9, 13)}${r.slice(14, 18)}`;
}

/** The upstream request's headers: the backend's key only when it has one. */
function upstreamHeaders(spec: AttemptSpec): Record<string, string> {
  const accept = spec.mode === 'passthrough' ? 'application/json' : 'text/event-stream';
  const id = upstreamRequestId(spec.requestId);
  return spec.authorization === null
    ? { 'content-type': 'application/json', accept, 'x-request-id': id }
    : { 'content-type': 'application/json', accept, 'x-request-id': id, authorization: spec.authorization };
}
