// The TTFT predictor: for each backend that could take the request, the time from arrival to its
// first token if it went there:
//
//   predicted = wait in the gateway queue (scheduler: entries ahead ÷ the rate slots free up)
//             + dispatch-to-first-token on that backend (live state's fit at the backend's
//               pending prefill work and load: base + a·(own uncached + pending) + b·in-flight),
//               where "own uncached" is the prompt less what the prefix index says the backend
//               holds (src/router/cached.ts, the same count the router weighs)
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
  /** Predicted gateway queue wait, ms (the same for every backend); null when unknown. */
  readonly waitMs: number | null;
  /** The lowest predicted total, or null when any available backend cannot be predicted. */
  readonly best: BackendPrediction | null;
  /** Every available backend has a prediction. */
  readonly complete: boolean;
}

export type PredictInput = Omit<
  ScheduledRequest,
  'predictions' | 'prefillMs' | 'bestBackendMs' | 'uncachedTokens'
>;

/**
 * Predicts `req` on every available backend; returns the prediction and the request as the
 * scheduler will see it (its size and guard filled from the same numbers).
 */
export function predict(
  req: PredictInput,
  backends: readonly Backend[],
  live: LiveState,
  scheduler: Scheduler,
): { prediction: Prediction; scheduled: ScheduledRequest } {
  const backendMs = new Map<string, number | null>();
  let bestBackendMs: number | null = null;
  let prefillMs: number | null = null;
  // Without a prediction anywhere, the size to order by is the least any backend must prefill.
  let uncachedTokens = req.promptTokens;
  let complete = backends.length > 0;
  const match = (backend: string, hashes: readonly number[]) => live.prefixMatch(backend, hashes);
  for (const b of backends) {
    if (!b.available) continue;
    const own = cachedOn(req.route, b.name, match).uncached;
    const ms = live.predictTtftMs(b.name, own);
    backendMs.set(b.name, ms);
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
  const sized: ScheduledRequest = {
    ...req,
    uncachedTokens,
    predictions: new Map(),
    prefillMs,
    bestBackendMs,
  };
  const waitMs = scheduler.estimateWaitMs(sized);
  const byBackend = new Map<string, BackendPrediction>();
  let best: BackendPrediction | null = null;
  for (const [name, ms] of backendMs) {
    const p: BackendPrediction = {
      backend: name,
      backendMs: ms,
      totalMs: ms === null || waitMs === null ? null : waitMs + ms,
    };
    byBackend.set(name, p);
    if (p.totalMs !== null && (best === null || p.totalMs < (best.totalMs as number))) best = p;
  }
  if (waitMs === null) complete = false;
  return {
    prediction: { byBackend, waitMs, best, complete },
    scheduled: { ...sized, predictions: byBackend },
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
