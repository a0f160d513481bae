// One opossum breaker per backend, wrapping only "dispatch → first token" (the commit point).
// - timeout:false: opossum's timeout cannot cancel the action and its abort controller is shared
//   by every call of the breaker (opossum #780); the attempt owns its own first-token timer.
// - errorFilter: only failures the backend is to blame for count. Client cancels, 408/429, the
//   request's own deadline and the gateway's refusals never open a breaker (Envoy #25487).
//   opossum reports a filtered error as a success, which closes a half-open breaker. A trial the
//   backend answered (408/429, a rejection, an answer too large) shows it is up, and may close it;
//   one that ended before any answer for a reason of its own (the client left, its deadline, the
//   gateway's cut) shows nothing, and counts as a failed trial: the breaker opens again and tries
//   another after its reset timeout, instead of closing on a backend that may still be hanging.
//   Which call is the trial is decided when it is fired (trialCall), not when a call ends: a call
//   that began before the breaker opened and ends so during the trial is no trial, and goes on
//   counting as before (filtered), so it cannot throw away the trial's answer.
// - Half-open admits one new trial (opossum's pendingClose), and the backend is granted one slot
//   for it until that slot ends (Backend.takeTrial); a failed trial reopens it. A body passed
//   through whole may be the trial: its call, and the trial, end only with its body (up to
//   upstream.passthrough_timeout_ms), and the backend takes nothing else meanwhile (keeping such
//   bodies off the trial left a backend that only they reached half-open for good). A call that
//   began before the breaker opened (still waiting for its first token, for up to the cap) may
//   settle the half-open state first, either way: opossum does not tell the calls apart.
//   Outlier detection, which counts every attempt, still ejects a backend that keeps failing.
// - Buckets rotate on one shared emitter instead of one interval per breaker (opossum #809), and
//   snapshots are off, so a breaker owns no interval; shutdown() clears its reset timer.
import type { EventEmitter } from 'node:events';
import CircuitBreaker from 'opossum';
import { AttemptFailure, type FailureReason } from './failure.ts';

export interface BreakerOptions {
  /** Open when the failure share in the window is strictly above this (percent). */
  errorThresholdPercentage: number;
  /** Calls in the window before the share is considered at all. */
  volumeThreshold: number;
  resetTimeoutMs: number;
  rollingWindowMs: number;
  rollingBuckets: number;
}

export type AttemptBreaker = CircuitBreaker<[() => Promise<unknown>], unknown>;

/**
 * The action a breaker fires for one attempt; `trial` names the half-open period whose one trial
 * it is (the breaker's count of half-open periods when it was fired).
 */
export type BreakerCall = (() => Promise<unknown>) & { trial?: number };

/** Half-open periods each breaker has entered: a trial is the trial of one of them only. */
const halfOpenPeriods = new WeakMap<AttemptBreaker, number>();

/** `call`, marked as the trial when `b` is half-open with its trial unused (the call fired next takes it). */
export function trialCall(b: AttemptBreaker, call: () => Promise<unknown>): BreakerCall {
  if (b.halfOpen && b.pendingClose) (call as BreakerCall).trial = halfOpenPeriods.get(b) ?? 0;
  return call;
}

/** Reasons an attempt ends for before the backend answered anything, none of them the backend's. */
const SAYS_NOTHING: ReadonlySet<FailureReason> = new Set<FailureReason>([
  'client_cancelled',
  'deadline',
  'cut',
]);

export function createBreaker(name: string, opts: BreakerOptions, rotate: EventEmitter): AttemptBreaker {
  // Invariant: a call is judged as a trial only while the breaker is in the half-open period it
  // was the trial of. One left over from an earlier period (reopened meanwhile by another call)
  // is a call that began before this period, and cannot reopen the breaker on the new trial.
  const isTrialNow = (call: BreakerCall | undefined) =>
    call?.trial !== undefined && breaker.halfOpen && call.trial === (halfOpenPeriods.get(breaker) ?? 0);
  const breaker: AttemptBreaker = new CircuitBreaker((untilCommit: () => Promise<unknown>) => untilCommit(), {
    name,
    timeout: false,
    errorThresholdPercentage: opts.errorThresholdPercentage,
    volumeThreshold: opts.volumeThreshold,
    resetTimeout: opts.resetTimeoutMs,
    rollingCountTimeout: opts.rollingWindowMs,
    rollingCountBuckets: opts.rollingBuckets,
    rotateBucketController: rotate,
    enableSnapshots: false,
    // True: not counted (opossum takes it as a success). opossum passes the fired action after the error.
    errorFilter: (err: unknown, call?: BreakerCall) =>
      !(err instanceof AttemptFailure) ||
      (!err.backendFault && !(isTrialNow(call) && SAYS_NOTHING.has(err.reason))),
  });
  breaker.on('halfOpen', () => halfOpenPeriods.set(breaker, (halfOpenPeriods.get(breaker) ?? 0) + 1));
  return breaker;
}

/** True when the breaker would let a call through now (closed, or half-open with its trial unused). */
export function breakerAdmits(b: AttemptBreaker): boolean {
  return b.closed || (b.halfOpen && b.pendingClose);
}
