// What the scheduler knows about a request: its class and tenant, its size, and what admission
// predicted for it at arrival. Built once per request by the server and admission layers.
import type { RouteRequest } from '../router/index.ts';

/** Admission's prediction for one backend, made at arrival. */
export interface BackendPrediction {
  readonly backend: string;
  /** Dispatch to first token on this backend, ms (the live state's fit); null without a fit. */
  readonly backendMs: number | null;
  /**
   * The predicted wait in the gateway queue before this backend takes the request, ms: 0 when it
   * would start it at once (Scheduler.startsNow), else the fleet's wait; null when unknown.
   */
  readonly waitMs: number | null;
  /** Arrival to first token: waitMs + backendMs; null when either is unknown. */
  readonly totalMs: number | null;
  /** Dispatch to first token on this backend with nothing else on it, ms; null without a fit. */
  readonly unloadedMs: number | null;
}

export interface ScheduledRequest {
  readonly reqId: string;
  readonly className: string;
  /** The class priority: lower is served first. */
  readonly priority: number;
  readonly sheddable: boolean;
  readonly tenant: string;
  /** The model it names: only backends that serve it are offered to it (Backend.serves). */
  readonly model: string;
  /** performance.now() at arrival. */
  readonly arrivedAt: number;
  readonly ttftTargetMs: number;
  /**
   * The TTFT the gateway plans this request for (queue order, queue guard): its class target, or
   * twice its own first token on an unloaded backend when that is more (a request large for its
   * class), less loopDelayMs (src/admission/predict.ts).
   */
  readonly ttftBudgetMs: number;
  /** The gateway's own event-loop delay at arrival, taken out of the budget (unseen by its clocks). */
  readonly loopDelayMs: number;
  readonly tpotTargetMs: number;
  /**
   * performance.now() by which its first token must have arrived (arrival + first_token_timeout_ms;
   * a body passed through: its whole body, arrival + passthrough_timeout_ms).
   */
  readonly deadlineAt: number;
  /** Prompt tokens the backend must compute (estimated; not in its prefix cache). */
  readonly uncachedTokens: number;
  readonly promptTokens: number;
  readonly expectedOutputTokens: number;
  /** x-slagate-no-queue: refuse rather than wait. */
  readonly noQueue: boolean;
  /** What the router reads about the request. */
  readonly route: RouteRequest;
  /** Per backend, from admission (empty when nothing could be predicted). */
  readonly predictions: ReadonlyMap<string, BackendPrediction>;
  /** Predicted pure prefill work on the best backend, ms (ordering by size); null when unknown. */
  readonly prefillMs: number | null;
  /** The best backend's predicted dispatch-to-first-token time, ms (the queue guard); null when unknown. */
  readonly bestBackendMs: number | null;
  /**
   * Admitted, though predicted late everywhere, to seed this backend with its prefix
   * (Scheduler.seedFor): its first attempt is offered this backend alone, while it can start it
   * and no other seed prefills there.
   */
  readonly seedOn?: string;
}

/** How a request's TTFT budget was set, for refusal messages: "the 'x' target of N ms", and why not. */
export function budgetWords(
  req: Pick<
    ScheduledRequest,
    'className' | 'ttftTargetMs' | 'ttftBudgetMs' | 'loopDelayMs' | 'arrivedAt' | 'deadlineAt'
  >,
): string {
  const planned = req.ttftBudgetMs + req.loopDelayMs;
  const deadline = req.deadlineAt - req.arrivedAt;
  const base =
    Math.abs(planned - req.ttftTargetMs) < 1e-6
      ? `the '${req.className}' target of ${req.ttftTargetMs} ms`
      : Math.abs(planned - deadline) < 1e-6
        ? `its deadline, ${Math.round(deadline)} ms after arrival`
        : `the ${Math.round(planned)} ms it is allowed (its own first token on an unloaded backend takes most of the '${req.className}' target of ${req.ttftTargetMs} ms, or more)`;
  return req.loopDelayMs >= 0.5
    ? `${base}, less the ${Math.round(req.loopDelayMs)} ms the gateway's own event loop is delaying requests`
    : base;
}
