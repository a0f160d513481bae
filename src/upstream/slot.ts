// The contract between the attempt loop and whoever hands out backends: the loop asks for a slot
// before every attempt (the first one and every retry) and gives it back when the attempt ends.
// The upstream layer defines it and never implements it: the scheduler does (src/scheduler), so
// that a retry waits under the same per-backend caps as a first attempt.
import type { Backend } from './backend.ts';
import type { Cancel } from './cancel.ts';
import type { DecodeMeter } from './measure.ts';

/** One granted place on one backend for one attempt. */
export interface Slot {
  readonly backend: Backend;
  /** Predicted TTFT of the request on this backend (arrival to first token), ms; null when unknown. */
  readonly predictedTtftMs: number | null;
  /** Estimated share of the prompt the backend holds in its prefix cache, 0..1; null when unknown. */
  readonly prefixHit: number | null;
  /** This attempt's first-token budget, ms (the loop still caps it by the request's deadline). */
  readonly firstTokenTimeoutMs: number;
  /** Where the attempt adds its token gaps; null when nobody measures decode pace. */
  readonly meter: DecodeMeter | null;
  /**
   * A streamed first token arrived: the prompt is in the backend's KV cache now. Never called for a
   * relayed 4xx or a body passed through whole (neither has a first token). Idempotent.
   */
  prefillDone(): void;
  /**
   * This attempt's first token will not be seen (a body passed through whole arrives with its whole
   * generation): its prefill is taken as done once the backend was predicted to have finished it
   * (the first-token budget when nothing is predicted), not at the end of the generation. No TTFT
   * is learnt from it. Idempotent; release() cancels it.
   */
  expectNoFirstToken(): void;
  /** The attempt ended, whatever its outcome. Idempotent. */
  release(): void;
}

export interface SlotRequest {
  /** Attempts already made (0 for the first). */
  attempt: number;
  /** Backends this request has already been tried on: never granted again. */
  excluded: ReadonlySet<string>;
  /** Aborts when the client leaves or the request is cut: the wait ends at once. */
  signal: Cancel;
}

/**
 * Resolves with a slot; with null when no backend can take the request (none available outside
 * `excluded`, or its deadline passed while it waited); rejects with a GatewayError when the request
 * is refused while it waits (e.g. queue_timeout), or with the signal's reason when it aborts.
 */
export type AcquireSlot = (req: SlotRequest) => Promise<Slot | null>;
