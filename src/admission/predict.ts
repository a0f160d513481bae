// The TTFT predictor: for each backend that could take the request, the time from arrival to its
// first token if it went there:
//
//   predicted = time already spent since arrival (the body's upload and its parsing: what a
//               large prompt over a slow link takes before anything can be decided)
//             + wait in the gateway queue: none when that backend would start the request at once
//               (Scheduler.startsNow: a slot and prefill room free, no entry waiting for it, and
//               the last pump did not stop at its bound, so whatever is queued waits for other
//               backends), else the fleet's (scheduler: entries ahead ÷ the rate slots free up);
//               for a request that may not wait (x-slagate-no-queue) none there at all (null: it
//               is judged on the backends that would start it now)
//             + dispatch-to-first-token on that backend (live state's fit at the prefill still
//               ahead there and its load: base + a·(own uncached + ahead) + b·in-flight, where
//               ahead is what the backend has left of the prefill sent to it, drained at 1 ÷ a
//               since it was sent: src/state/prefill-backlog.ts),
//               where "own uncached" is the prompt less what the prefix index says the backend
//               holds (src/router/cached.ts, the same count the router weighs)
//
// and the least the request's first token can take anywhere, u: the time already spent since
// arrival plus dispatch to first token on a backend with nothing else on it (its own uncached
// prefill there and the fit's base), each backend's taken at the P99 of how its predictions turn
// out (Scheduler.upperBackendMs), the least of them. The request's budget (ttftBudgetMs, what admission and the queue guard plan with) is
//
//   budget = max(min(class target, deadline), min(2u, deadline)) − the loop's own delay
//            (u ≥ deadline: time spent + its unloaded first token at the P99)
//
// that is, the load may delay a request by what is left of its target, or by its own unavoidable
// time when that is more. The loop's delay is time the client waits that no gateway clock sees:
// the request's bytes wait for a busy loop before its arrival is stamped
// (src/telemetry/loop-delay.ts); a gateway short of CPU counts it against every request. A request
// whose own first token is past its deadline is let in when nothing would delay it.
//
// A request with u over half its target is large for its class: most of its target goes to its
// own prefill, so a little load (or the P99 multiplier alone) puts it over, and with u over the
// target no wait makes it attainable at all. Refusing it with a Retry-After would promise what no
// retry keeps, and a refused request prefills nothing: its prefix stays out
// of every cache, so the next request with that prefix is as large, and is refused in turn. The
// budget is continuous in u (at u = target/2 both terms are the target), so no request is cut off
// at a cliff in its size.
//
// Everything it reads is in memory; nothing is awaited. A part that cannot be predicted yet (no
// fit, no drain rate) makes that backend's prediction null, never a guess.

import { cachedOn } from '../router/cached.ts';
import type { BackendPrediction, ScheduledRequest, Scheduler } from '../scheduler/index.ts';
import type { LiveState } from '../state/index.ts';
import type { Backend } from '../upstream/index.ts';

export interface Prediction {
  /** Per available backend. */
  readonly byBackend: ReadonlyMap<string, BackendPrediction>;
  /**
   * Predicted gateway queue wait, ms, on a backend that cannot start the request at once (one that
   * can has none: BackendPrediction.waitMs); null when unknown.
   */
  readonly waitMs: number | null;
  /** The lowest predicted total, or null when any available backend cannot be predicted. */
  readonly best: BackendPrediction | null;
  /** Every available backend has a prediction. */
  readonly complete: boolean;
  /**
   * The least dispatch to first token can take on any available backend with nothing else on it,
   * ms (null when no backend has a fit).
   */
  readonly unloadedMs: number | null;
  /**
   * u above (the time spent since arrival plus the least unloaded first token, each backend's at its
   * P99 multiplier) is over half the class target (its budget is 2u).
   */
  readonly largeForClass: boolean;
}

export type PredictInput = Omit<
  ScheduledRequest,
  'predictions' | 'prefillMs' | 'bestBackendMs' | 'uncachedTokens' | 'ttftBudgetMs' | 'loopDelayMs'
>;

/**
 * Predicts `req` on every available backend that serves its model; returns the prediction and the request as the
 * scheduler will see it (its size and guard filled from the same numbers).
 */
export function predict(
  req: PredictInput,
  backends: readonly Backend[],
  live: LiveState,
  scheduler: Scheduler,
  loopDelayMs = 0,
  spentMs = 0,
): { prediction: Prediction; scheduled: ScheduledRequest } {
  const backendMs = new Map<string, number | null>();
  const aloneMs = new Map<string, number | null>();
  // Backends that would start the request the moment it is queued: no queue wait there.
  const startsNow = new Set<string>();
  let bestBackendMs: number | null = null;
  let prefillMs: number | null = null;
  // Without a prediction anywhere, the size to order by is the least any backend must prefill.
  let uncachedTokens = req.promptTokens;
  let complete = backends.length > 0;
  let unloadedMs: number | null = null;
  // The same, each taken at its backend's P99 (the backend where it is least may be another).
  let upperUnloadedMs: number | null = null;
  const match = (backend: string, hashes: readonly number[]) => live.prefixMatch(backend, hashes);
  for (const b of backends) {
    if (!b.available || !b.serves(req.model)) continue;
    const own = cachedOn(req.route, b.name, match).uncached;
    const alone = live.unloadedTtftMs(b.name, own);
    aloneMs.set(b.name, alone);
    if (alone !== null) {
      if (unloadedMs === null || alone < unloadedMs) unloadedMs = alone;
      const upper = scheduler.upperBackendMs(b.name, alone);
      if (upperUnloadedMs === null || upper < upperUnloadedMs) upperUnloadedMs = upper;
    }
    const ms = live.predictTtftMs(b.name, own);
    backendMs.set(b.name, ms);
    if (scheduler.startsNow(b.name, own, req.noQueue)) startsNow.add(b.name);
    if (ms === null) {
      complete = false;
      if (bestBackendMs === null) uncachedTokens = Math.min(uncachedTokens, own);
      continue;
    }
    if (bestBackendMs === null || ms < bestBackendMs) {
      bestBackendMs = ms;
      prefillMs = live.prefillMs(b.name, own);
      uncachedTokens = own;
    }
  }
  // The request's own unavoidable time from arrival: what its body took to arrive, and its first
  // token on an unloaded backend. A slow upload is the request's, as a long prompt is: the load
  // may delay it by what is left of its target, or by that time when it is more, not refuse it
  // for what no retry would take less of (its body would arrive as slowly again). What the
  // gateway's own busy loop added to that time is not the request's: less the loop's delay now,
  // or a gateway short of CPU would widen every budget by twice its own lag.
  const ownSpentMs = Math.max(0, spentMs - loopDelayMs);
  const u = ownSpentMs + (upperUnloadedMs ?? 0);
  const largeForClass = 2 * u > req.ttftTargetMs;
  const deadline = req.deadlineAt - req.arrivedAt;
  // Spelled out, not `{ ...req, … }` (a spread followed by more properties is slow in Node 20's
  // V8: src/errors/respond.ts, headersWith). The map is filled below, after the wait estimate has
  // read the request (as an empty map, as before).
  const byBackend = new Map<string, BackendPrediction>();
  const scheduled: ScheduledRequest = {
    reqId: req.reqId,
    className: req.className,
    priority: req.priority,
    sheddable: req.sheddable,
    tenant: req.tenant,
    model: req.model,
    arrivedAt: req.arrivedAt,
    ttftTargetMs: req.ttftTargetMs,
    // The load may not delay a request past its deadline (first_token_timeout_ms from arrival;
    // passthrough_timeout_ms for a body passed through): that would be a 504 where a 429 was due.
    // So a class target and a large request's 2u both stop at the deadline, less the loop's
    // delay. But a request whose own first token is past its deadline already (u ≥ deadline) has
    // for its budget the bound admission finds for it where nothing delays it (its time spent,
    // loop delay included, and its unloaded first token at the P99): it is served when nothing
    // delays it, not refused for good for its size. (Its budget was u less the loop's delay, while
    // its bound held that delay: refused always, once the loop was measured late at all.)
    ttftBudgetMs:
      u >= deadline
        ? spentMs + (upperUnloadedMs ?? 0)
        : Math.max(Math.min(req.ttftTargetMs, deadline), Math.min(2 * u, deadline)) - loopDelayMs,
    loopDelayMs,
    tpotTargetMs: req.tpotTargetMs,
    deadlineAt: req.deadlineAt,
    uncachedTokens,
    promptTokens: req.promptTokens,
    expectedOutputTokens: req.expectedOutputTokens,
    noQueue: req.noQueue,
    route: req.route,
    predictions: byBackend,
    prefillMs,
    bestBackendMs,
  };
  const waitMs = scheduler.estimateWaitMs(scheduled);
  let best: BackendPrediction | null = null;
  for (const [name, ms] of backendMs) {
    // A request that may not wait (x-slagate-no-queue) waits for no backend: one that cannot start
    // it now has no wait of it, and the scheduler refuses it (queue_full) when none can. It is judged
    // on the backends that can start it now, and let through to that refusal when there are none.
    // (Given the fleet's wait, it was refused sla_unattainable for a queue it would never join, and
    // that refusal of a protected class shed the sheddable ones.)
    const cannotWait = req.noQueue && !startsNow.has(name);
    const wait = startsNow.has(name) ? 0 : cannotWait ? null : waitMs;
    const p: BackendPrediction = {
      backend: name,
      backendMs: ms,
      waitMs: wait,
      totalMs: ms === null || wait === null ? null : spentMs + wait + ms,
      unloadedMs: aloneMs.get(name) ?? null,
    };
    byBackend.set(name, p);
    if (p.totalMs === null) {
      if (ms === null || !cannotWait) complete = false;
    } else if (best === null || p.totalMs < (best.totalMs as number)) best = p;
  }
  return {
    prediction: { byBackend, waitMs, best, complete, unloadedMs, largeForClass },
    scheduled,
  };
}

/** The best prediction other than `backend`'s (the runner-up to the backend that was chosen). */
export function runnerUp(p: Prediction, backend: string | null): BackendPrediction | null {
  let best: BackendPrediction | null = null;
  for (const c of p.byBackend.values()) {
    if (c.backend === backend || c.totalMs === null) continue;
    if (best === null || c.totalMs < (best.totalMs as number)) best = c;
  }
  return best;
}
