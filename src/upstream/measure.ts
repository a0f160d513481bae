// Per-request latency figures as vLLM's serving benchmark defines them, taken at the gateway.
// Each gap also goes to the backend's decode-pace meter (DecodeMeter, handed out with a slot), which
// the scheduler's concurrency controller reads: a comparison per token event, and per read a
// count, a sum and one histogram bin, nothing else on that path.
// All times are performance.now() milliseconds. A "token event" is an SSE data event with a
// non-empty `choices` array (for chat the first one is the role chunk, whose content is ""; vLLM's
// benchmark counts it as the first token too), so ITL has one entry per chunk, not per token.
import { binIndex, Histogram, quantiles } from '../state/histogram.ts';

/**
 * Decode pace of one backend: every stream on it adds its gaps between token events to one
 * histogram (the latency windows' own, src/state/histogram.ts: bins 5% wide from 1 ms to 10
 * minutes; the clock below gives it no gap under SAME_READ_MS), and the scheduler moves each
 * period's out with drainInto. A histogram, not a sum, so that the controller can take the median
 * gap: the pace of the typical decode step, which the batch sets, apart from the few steps that
 * carried a long prefill chunk (see controller.ts).
 */
export class DecodeMeter {
  readonly histogram = new Histogram();

  /** Gaps between consecutive token events. */
  get gaps(): number {
    return this.histogram.count;
  }

  /** Their total, ms. */
  get totalMs(): number {
    return this.histogram.sum;
  }

  /** `count` gaps of `gapMs` each. */
  add(gapMs: number, count = 1): void {
    this.histogram.add(binIndex(gapMs), count, gapMs * count);
  }

  /** Moves what was added since the last drain into `into` (replacing what it held), and starts afresh. */
  drainInto(into: DecodeMeter): void {
    into.histogram.clear();
    into.histogram.addHistogram(this.histogram);
    this.histogram.clear();
  }
}

/**
 * The gaps over `meters` together: how many, their mean and their median, ms (the median to within
 * its bin); null when they hold none.
 */
export function gapStats(
  meters: readonly DecodeMeter[],
): { count: number; meanMs: number; medianMs: number } | null {
  const q = quantiles(meters.map((m) => m.histogram));
  return q.mean === null || q.p50 === null ? null : { count: q.count, meanMs: q.mean, medianMs: q.p50 };
}

export interface Latencies {
  /**
   * First token event − request start (includes the gateway queue and every failed attempt); null
   * when no first token was observable (a pass-through non-streamed body).
   */
  ttftMs: number | null;
  /**
   * (last token event − first token event) / (completion_tokens − 1); null unless there were two
   * token events and completion_tokens > 1 (a pass-through body is one event: no TPOT there).
   */
  tpotMs: number | null;
  /** Gaps between consecutive token events. */
  itlMs: number[];
  /** Response end − request start. */
  e2eMs: number;
  /**
   * The client held the stream back at least once (its buffer full, the relay paused the
   * upstream, for 10 ms or more before it drained): TPOT and ITL then hold time the client set, not
   * the backend, and are not the backend's pace.
   */
  clientPaced: boolean;
  /**
   * Every token event came within SAME_READ_MS of the first (a loop held up for as long as the
   * whole decode, a proxy that buffers the stream; the events of one read come one HTTP chunk
   * each, microseconds apart): the TPOT, near 0, is the reading's and says nothing of the
   * backend's pace. False without a TPOT.
   */
  decodeUnseen: boolean;
}

/**
 * Token events closer than this came in one read: no LLM decode step is as short, and the relay
 * handles the chunks of one read within microseconds of each other.
 */
export const SAME_READ_MS = 1;

/**
 * A request's token events, timed. A stream of several sequences (n > 1, or several completion
 * prompts) interleaves their events, one sequence each, in one stream: its first token is the first
 * of any, and its TPOT is taken per sequence, as vLLM's own mean time per output token over a
 * request's children is: the sum of each sequence's first-to-last time over the tokens after each
 * one's first (usage's completion tokens less one per sequence). The gaps between its events are
 * not the decode pace (the events of one step for several sequences come together), so such a
 * stream gives no inter-token latencies and nothing to the decode meter.
 */
export class TokenClock {
  readonly startedAt: number;
  firstTokenAt: number | null = null;
  lastTokenAt: number | null = null;
  readonly itlMs: number[] = [];
  readonly #meter: DecodeMeter | null;
  /** Sequences the stream interleaves (1: one, the usual case). */
  readonly #sequences: number;
  /** With several sequences: each one's first and last token event, by its choice index. */
  readonly #firstOf: (number | undefined)[] = [];
  readonly #lastOf: (number | undefined)[] = [];
  // Token events that arrived together (within SAME_READ_MS of each other) and the wall time
  // before them, not yet given to the meter.
  #batchEvents = 0;
  #batchMs = 0;
  // The relay paused the upstream for a slow client: the next gap is the gateway's, not the backend's.
  #paused = false;
  #clientPaced = false;

  constructor(startedAt: number, meter: DecodeMeter | null = null, sequences = 1) {
    this.startedAt = startedAt;
    this.#sequences = sequences;
    this.#meter = sequences > 1 ? null : meter;
  }

  /**
   * A token event, of the sequence whose choice index is `choice` when the stream has several;
   * `output`: it times that sequence (a chat role chunk does not: with several sequences vLLM
   * sends one for each at the first token of any, which starts no sequence's own timing).
   */
  token(now: number, choice = 0, output = true): void {
    if (this.#sequences > 1) {
      this.#interleaved(now, choice, output);
      return;
    }
    if (this.lastTokenAt === null) {
      this.firstTokenAt = now;
    } else {
      const gap = now - this.lastTokenAt;
      this.itlMs.push(gap);
      if (this.#meter !== null) {
        if (gap >= SAME_READ_MS) {
          this.#flushMeter();
          this.#batchMs = gap;
          this.#batchEvents = this.#paused ? 0 : 1;
          this.#paused = false;
        } else if (this.#batchEvents > 0) {
          this.#batchEvents++;
        }
      }
    }
    this.lastTokenAt = now;
  }

  #interleaved(now: number, choice: number, output: boolean): void {
    this.firstTokenAt ??= now;
    this.lastTokenAt = now;
    if (!output) return;
    // An index the stream should not have (a backend's own numbering) is timed with the stream
    // only: the per-sequence figures keep to the sequences asked for.
    if (!(Number.isInteger(choice) && choice >= 0 && choice < this.#sequences)) return;
    this.#firstOf[choice] ??= now;
    this.#lastOf[choice] = now;
  }

  /**
   * Σ (last − first) of each sequence over the tokens after each one's first; null without a span
   * or without such tokens (every sequence of one token), or when a sequence never showed one.
   */
  #perSequenceTpot(completionTokens: number | null): number | null {
    if (completionTokens === null) return null;
    const after = completionTokens - this.#sequences;
    if (!(after > 0)) return null;
    let span = 0;
    for (let i = 0; i < this.#sequences; i++) {
      const a = this.#firstOf[i];
      const b = this.#lastOf[i];
      if (a === undefined || b === undefined) return null;
      span += b - a;
    }
    return span > 0 ? span / after : null;
  }

  /** The relay paused the upstream (the client is not reading): the gap across the pause is not metered. */
  paused(): void {
    this.#paused = true;
  }

  /** The client held the stream back (a pause for it lasted): its TPOT is not the backend's pace. */
  heldBack(): void {
    this.#clientPaced = true;
  }

  /**
   * Gives the meter the last batch of events read together: k events after a wall time g are k
   * gaps of g/k. Invariant: no gap shorter than SAME_READ_MS reaches the meter, and apart from a
   * gap across a pause the meter's gaps sum to the events' own. Events that a lagging loop (or a
   * proxy that buffers the stream) delivers in one read are handled microseconds apart, one HTTP
   * chunk each, or with one timestamp: as near-zero gaps after one long one they would pull the
   * median to nothing while the backend was slow. Events read with the first token have no wall
   * time of their own and count as no gap.
   */
  #flushMeter(): void {
    const n = this.#batchEvents;
    if (n === 0 || this.#meter === null) return;
    this.#meter.add(this.#batchMs / n, n);
    this.#batchEvents = 0;
  }

  /** `observed`: token events were seen one by one (false for a pass-through body). */
  finish(endedAt: number, completionTokens: number | null, observed = true): Latencies {
    this.#flushMeter();
    const first = observed ? this.firstTokenAt : null;
    // Read together: the stream's first and last token events less than a read apart.
    const together = first !== null && this.lastTokenAt !== null && this.lastTokenAt - first < SAME_READ_MS;
    if (this.#sequences > 1) {
      const tpotMs = first === null ? null : this.#perSequenceTpot(completionTokens);
      return {
        ttftMs: first === null ? null : first - this.startedAt,
        tpotMs,
        itlMs: this.itlMs,
        e2eMs: endedAt - this.startedAt,
        clientPaced: this.#clientPaced,
        decodeUnseen: tpotMs !== null && together,
      };
    }
    const last = this.lastTokenAt;
    const tpotMs =
      first !== null &&
      last !== null &&
      this.itlMs.length > 0 &&
      completionTokens !== null &&
      completionTokens > 1
        ? (last - first) / (completionTokens - 1)
        : null;
    return {
      ttftMs: first === null ? null : first - this.startedAt,
      tpotMs,
      itlMs: this.itlMs,
      e2eMs: endedAt - this.startedAt,
      clientPaced: this.#clientPaced,
      decodeUnseen: tpotMs !== null && together,
    };
  }
}
