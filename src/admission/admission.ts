// The admission controller: at arrival, before anything waits, decide whether a request may be
// served at all. Each refusal is one stable code, with Retry-After where waiting cures it (DESIGN section 4):
//
//   tenant over max_concurrency or tokens_per_minute (all instances) ── 429 rate_limited
//   one request counting more than its tenant's tokens_per_minute ──── 400 invalid_request
//   sheddable class while a protected class is being refused ───────── 429 sla_unattainable
//   predicted TTFT over its budget on every backend ─────────────────── 429 sla_unattainable
//     unless it may seed a second backend with its prefix (Scheduler.seedFor): admitted there
//   otherwise admitted: the tenant's usage lease starts, the request goes to the scheduler
//
// Refusing early what cannot meet its target (Mooncake's early rejection) keeps the queue to
// requests that can: letting them all in makes everyone late. A request is refused on its
// prediction only when every available backend could be predicted; without a fit (a fresh
// backend) it is admitted, and the scheduler's queue guard still refuses it if it waits too long.
//
// "Sheddable classes are refused first": once a request of a protected (non-sheddable) class has
// been refused for capacity (sla_unattainable, queue_full, queue_timeout), every sheddable request
// that would compete for its backends (of its model, or of a model some backend in service serves
// with it) is refused at arrival for SHED_WINDOW_MS after it, so the capacity left goes to
// protected work. A
// sheddable request for a model on other backends takes nothing the protected one could use, and
// passes. (The scheduler also evicts a queued sheddable request to make room when the queue is full.)
//
// Invariants: one tenant's limit is checked against that tenant's usage only, in O(1), so a tenant
// over its limit never slows another; nothing here awaits anything.
import { GatewayError } from '../errors/index.ts';
import { budgetWords, type ScheduledRequest, type Scheduler } from '../scheduler/index.ts';
import type { LiveState, TenantLease } from '../state/index.ts';
import type { Backend } from '../upstream/index.ts';
import { type PredictInput, type Prediction, predict } from './predict.ts';

export interface TenantLimits {
  readonly max_concurrency?: number | undefined;
  readonly tokens_per_minute?: number | undefined;
}

export interface AdmissionRequest extends PredictInput {
  readonly limits: TenantLimits | null;
  /** Tokens the request counts against tokens_per_minute: prompt + max_tokens (or the estimate). */
  readonly budgetTokens: number;
}

export interface Admitted {
  readonly scheduled: ScheduledRequest;
  readonly prediction: Prediction;
  /** Ends the tenant's count of this request; call once it has ended, whatever the outcome. */
  readonly tenantLease: TenantLease;
}

/** A refusal with what it was decided on, for the admission record. */
export class Refusal extends GatewayError {
  readonly prediction: Prediction | null;
  constructor(err: GatewayError, prediction: Prediction | null) {
    // Retry-After as the error has it (its code's own when it sets none): none on a 400.
    super(err.code, err.message, err.retryAfterS === undefined ? {} : { retryAfterS: err.retryAfterS });
    this.prediction = prediction;
  }
}

export const SHED_WINDOW_MS = 1_000;
const MAX_RETRY_AFTER_S = 60;
/** Recent |predicted − actual| / actual values kept for /admin/state. */
const ERROR_SAMPLES = 1024;

export interface AdmissionDeps {
  backends: () => readonly Backend[];
  live: LiveState;
  scheduler: Scheduler;
  /** This instance's event-loop delay now, ms (src/telemetry/loop-delay.ts); none counted without it, or while it is null. */
  loopDelayMs?: () => number | null;
  now?: () => number;
}

export interface PredictionErrorView {
  /** Completed requests whose prediction was compared, in the last ERROR_SAMPLES. */
  samples: number;
  /** Median and P90 of |predicted − actual| / actual; null without samples. */
  median: number | null;
  p90: number | null;
  /** Mean of (predicted − actual) / actual: > 0 means predictions run high. */
  bias: number | null;
}

export class AdmissionController {
  readonly #deps: AdmissionDeps;
  readonly #now: () => number;
  /** model → when a protected request for it was last refused for capacity (within SHED_WINDOW_MS, or pruned). */
  readonly #protectedRefusedAt = new Map<string, number>();
  readonly #errors: number[] = [];
  #errorsAt = 0;

  constructor(deps: AdmissionDeps) {
    this.#deps = deps;
    this.#now = deps.now ?? (() => performance.now());
  }

  /** Throws a Refusal; otherwise the request is admitted and its tenant lease has begun. */
  admit(req: AdmissionRequest): Admitted {
    const { live, scheduler } = this.#deps;
    this.#checkTenant(req);
    // Invariant: the prediction and the budget run on one clock, from arrival. What the body's
    // upload and parsing took is spent already; measured from now, a large prompt sent slowly
    // would be admitted on the time it no longer has.
    const spentMs = Math.max(0, this.#now() - req.arrivedAt);
    const { prediction, scheduled } = predict(
      req,
      this.#deps.backends(),
      live,
      scheduler,
      this.#deps.loopDelayMs?.() ?? 0,
      spentMs,
    );
    if (req.sheddable && this.#protectedRefusedAt.size > 0 && this.#sheds(req.model)) {
      throw this.#refuse(
        req,
        new GatewayError(
          'sla_unattainable',
          `Class '${req.className}' is sheddable and the gateway is refusing protected classes for lack of capacity.`,
          // Shed for the protected classes: back once the queue has drained.
          { retryAfterS: this.#retryAfterS(scheduler.drainMs(req.model)) },
        ),
        prediction,
      );
    }
    // Planned at the P99 of how predictions turn out, so that the tail of what is admitted, not
    // its median, meets the target; the record keeps the point prediction. The budget is the class
    // target, or for a request large for its class twice its unavoidable time (predict.ts): what
    // the load adds past that is refused, not what the prompt itself must take.
    const soon = prediction.complete ? soonest(prediction, scheduler) : null;
    const bound = soon === null ? null : spentMs + soon;
    const budget = scheduled.ttftBudgetMs;
    if (bound !== null && bound > budget) {
      // Late everywhere, but the one backend holding its prefix is what makes it late, and another
      // could take it now: let in to seed that one, as a deliberate miss (Scheduler.seedFor).
      const seedOn = scheduler.seedFor(scheduled);
      if (seedOn !== null) {
        const tenantLease = live.tenantLease(req.tenant, req.budgetTokens);
        return { scheduled: { ...scheduled, seedOn }, prediction, tenantLease };
      }
      throw this.#refuse(
        req,
        new GatewayError(
          'sla_unattainable',
          `Predicted time to first token ${Math.round(bound)} ms (at its P99) exceeds ${budgetWords(scheduled)} on every backend.`,
          { retryAfterS: this.#retryAfterS(untilOnTimeMs(prediction, scheduler, spentMs, budget)) },
        ),
        prediction,
      );
    }
    const tenantLease = live.tenantLease(req.tenant, req.budgetTokens);
    return { scheduled, prediction, tenantLease };
  }

  /**
   * A request of `req`'s class was refused somewhere (e.g. the scheduler's queue): a protected
   * class refused for capacity opens the shedding window. Not a request that asked not to wait
   * (x-slagate-no-queue), whether it found no room at once (queue_full) or only backends with room
   * where it would be late (queue_timeout, or sla_unattainable from admission: a busy backend it may
   * not wait for could have been on time): with the limits binding, as they do under any load, that
   * is its own choice, and one such client would keep every sheddable class out.
   */
  noteRefused(req: { sheddable: boolean; model: string; noQueue?: boolean }, code: string): void {
    if (req.noQueue === true) return;
    if (
      !req.sheddable &&
      (code === 'sla_unattainable' || code === 'queue_full' || code === 'queue_timeout')
    ) {
      this.#protectedRefusedAt.set(req.model, this.#now());
    }
  }

  /**
   * A protected request was refused for capacity within SHED_WINDOW_MS for `model`, or for a model
   * that some backend in service serves with it. Windows that have closed are forgotten here.
   */
  #sheds(model: string): boolean {
    const now = this.#now();
    let backends: readonly Backend[] | undefined;
    for (const [refused, at] of this.#protectedRefusedAt) {
      if (now - at >= SHED_WINDOW_MS) {
        this.#protectedRefusedAt.delete(refused);
        continue;
      }
      if (refused === model) return true;
      backends ??= this.#deps.backends();
      // Only a backend in service competes: one down, ejected or never reached (whose unknown
      // list reads as every model) would tie every model to every other.
      for (const b of backends) if (b.inService && b.serves(model) && b.serves(refused)) return true;
    }
    return false;
  }

  /** A completed request's prediction against what happened. */
  observe(predictedMs: number | null, actualMs: number | null): void {
    if (predictedMs === null || actualMs === null || !(actualMs > 0)) return;
    const e = (predictedMs - actualMs) / actualMs;
    if (this.#errors.length < ERROR_SAMPLES) this.#errors.push(e);
    else this.#errors[this.#errorsAt] = e;
    this.#errorsAt = (this.#errorsAt + 1) % ERROR_SAMPLES;
  }

  /** The event-loop delay each request's budget is reduced by now, ms; null when none is measured. */
  loopDelayMs(): number | null {
    return this.#deps.loopDelayMs?.() ?? null;
  }

  predictionError(): PredictionErrorView {
    const n = this.#errors.length;
    if (n === 0) return { samples: 0, median: null, p90: null, bias: null };
    const abs = this.#errors.map(Math.abs).sort((a, b) => a - b);
    const at = (q: number) => abs[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))] as number;
    return { samples: n, median: at(0.5), p90: at(0.9), bias: this.#errors.reduce((a, b) => a + b, 0) / n };
  }

  #checkTenant(req: AdmissionRequest): void {
    const limits = req.limits;
    if (limits === null) return;
    const { live } = this.#deps;
    const usage = live.tenantUsage(req.tenant);
    const tpm = limits.tokens_per_minute;
    // Invariant: a 429 is something waiting cures. A request that alone counts more than the
    // budget never fits in a minute however long it waits; a 429 with Retry-After would have the
    // client (the openai SDKs retry 429s, honouring Retry-After) wait and fail again. It is the
    // request that must change: 400, as for prompt + max_tokens over the context; and before any
    // 429, so that no limit a wait would cure answers first.
    if (tpm !== undefined && req.budgetTokens > tpm) {
      throw this.#refuse(
        req,
        new GatewayError(
          'invalid_request',
          `The request counts ${req.budgetTokens} tokens (prompt + max_tokens, times n); tenant '${req.tenant}' may use ${tpm} per minute. Lower max_tokens or shorten the prompt.`,
        ),
        null,
      );
    }
    // Through an outage of the store each instance counts only its own requests: it takes its
    // share of a limit (at least one request, and at least a request that fits the whole budget).
    const share = live.tenantShare();
    const alone = (n: number) =>
      share === 1
        ? ''
        : ` (${n} on this gateway instance while the other instances' tenant counts are not shared)`;
    const max =
      limits.max_concurrency === undefined
        ? undefined
        : Math.max(1, Math.ceil(limits.max_concurrency * share));
    if (max !== undefined && usage.inflight >= max) {
      throw this.#refuse(
        req,
        new GatewayError(
          'rate_limited',
          `Tenant '${req.tenant}' has ${usage.inflight} requests in flight; its limit is ${limits.max_concurrency}${alone(max)}.`,
          { retryAfterS: 1 },
        ),
        null,
      );
    }
    if (tpm === undefined) return;
    const tokens = share === 1 ? tpm : Math.max(req.budgetTokens, Math.ceil(tpm * share));
    if (usage.tokens + req.budgetTokens > tokens) {
      const freedMs = live.tenantTokensFreedInMs(req.tenant, usage.tokens + req.budgetTokens - tokens);
      throw this.#refuse(
        req,
        new GatewayError(
          'rate_limited',
          `Tenant '${req.tenant}' has used ${Math.round(usage.tokens)} of its ${tpm} tokens per minute${alone(tokens)}.`,
          { retryAfterS: clampS(Math.ceil(freedMs / 1000)) },
        ),
        null,
      );
    }
  }

  #refuse(
    req: { sheddable: boolean; model: string },
    err: GatewayError,
    prediction: Prediction | null,
  ): Refusal {
    this.noteRefused(req, err.code);
    return new Refusal(err, prediction);
  }

  /** `ms` (untilOnTimeMs, or the queue's drain for a request shed) as a Retry-After, in seconds. */
  #retryAfterS(ms: number | null): number {
    return clampS(Math.ceil((ms ?? 0) / 1000));
  }
}

/**
 * How long until a request refused as late everywhere could be on time: on each backend the longer
 * of its own queue wait there (what would leave before it, at its place in the queue's order: a
 * less urgent backlog it would pass is none of it) and its prediction's overshoot of the budget;
 * the least of those over the backends. Per backend, not the fleet's wait with the least overshoot:
 * a request 20 ms over its budget on a backend with nothing queued for it was told to wait out a
 * backlog kept for another backend (tens of seconds, which the OpenAI clients honour). Only over
 * the backends where waiting can make it on time: one late with nothing else on it (a slower GPU)
 * stays late, and counted, it told the client to come back every second for as long as the others'
 * queues took. When none is such, the fleet's wait or the least overshoot, the longer.
 */
function untilOnTimeMs(
  p: Prediction,
  scheduler: Scheduler,
  spentMs: number,
  budgetMs: number,
): number | null {
  let min: number | null = null;
  let leastOverMs: number | null = null;
  for (const b of p.byBackend.values()) {
    if (b.backendMs === null || b.waitMs === null) continue;
    const overMs = spentMs + upperTotalMs(b.backend, b.backendMs, b.waitMs, scheduler) - budgetMs;
    if (leastOverMs === null || overMs < leastOverMs) leastOverMs = overMs;
    if (b.unloadedMs === null || spentMs + scheduler.upperBackendMs(b.backend, b.unloadedMs) > budgetMs)
      continue;
    const ms = Math.max(b.waitMs, overMs);
    if (min === null || ms < min) min = ms;
  }
  return min ?? (leastOverMs === null ? null : Math.max(p.waitMs ?? 0, leastOverMs));
}

/** The least predicted first token over the backends, each taken at the P99 of how predictions turn out. */
function soonest(p: Prediction, scheduler: Scheduler): number | null {
  let min: number | null = null;
  for (const b of p.byBackend.values()) {
    if (b.backendMs === null || b.waitMs === null) continue;
    const ms = upperTotalMs(b.backend, b.backendMs, b.waitMs, scheduler);
    if (min === null || ms < min) min = ms;
  }
  return min;
}

/** Queue wait and first token on `backend`, the first token taken at the P99 of how predictions turn out. */
function upperTotalMs(backend: string, backendMs: number, waitMs: number, scheduler: Scheduler): number {
  return waitMs + scheduler.upperBackendMs(backend, backendMs);
}

function clampS(s: number): number {
  return Math.min(MAX_RETRY_AFTER_S, Math.max(1, Number.isFinite(s) ? s : 1));
}
