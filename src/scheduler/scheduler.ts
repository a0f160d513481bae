// Late dispatch: a request leaves the gateway's queue only when the backend chosen for it (the
// router's first, or the first in the router's order where it is on time) has room under its
// concurrency limit, and its backend is chosen then (with the state of that moment). Every
// attempt, first or retry, gets its slot here, so retries obey the same limits.
//
//   acquire(attempt) ─▶ retry? ─▶ retry list (served before every fresh request)
//        │               fresh ─▶ queue full? evict the entry that gives way (a sheddable one; under
//        │                        slagate, else one of the biggest tenant holding more than its
//        │                        own would that has one to give), or 429 queue_full
//        │                        x-slagate-no-queue and no room now? 429 queue_full
//        ▼                        otherwise the queue discipline (queue.ts)
//     pump ─▶ while some backend is open, the entries in order: the router ranks every available
//              backend, each with whether it can start the entry now (room under its limit over
//              every instance, prefill room: at most `prefill_tokens` waiting on it unless none
//              is, and no earlier entry waiting for it) and the predicted wait for a slot there.
//              First one open: lease it ─▶ Slot. First one busy: the entry waits for it, and
//              that backend is closed to the entries behind it until the next pump (nobody
//              passes a waiting entry on the backend it waits for: the aging bound holds per
//              backend); the pump goes on with the next entry, for the backends still open
//     guard ─▶ a fresh entry still queued at its latest start (arrival + TTFT budget − its
//              predicted time to first token, taken at the P99 of how predictions have turned out)
//              is refused now, 429 queue_timeout, not served late; so is one that would be sent
//              where its first token is predicted past its budget: it goes to the first backend in
//              the router's order where it is on time (a slot's wait there counted), and when none
//              is, to the router's first, refused at once if that has room (a busy one it waits
//              for, until the guard's timer); a retry still queued at the request's deadline gets
//              no slot (the loop then gives up)
//     control ─▶ every interval: each backend's limit from its measured pace (backend-control.ts)
//
// Invariants:
// - in-flight work per backend is counted once, by the live state's leases (all instances); a slot
//   is a lease, and releasing the slot ends it and pumps again;
// - an entry is settled exactly once: granted, refused, given null, or aborted with its signal;
//   a client that leaves while queued is out of the queue at once and never dispatched;
// - nothing here awaits anything: every path is synchronous, timers only re-run the pump or guard.
import { GatewayError } from '../errors/index.ts';
import { cachedOn, type PrefixMatch } from '../router/cached.ts';
import type { BackendView, Candidate, RoutingPolicy } from '../router/index.ts';
import type { Lease, LiveState } from '../state/index.ts';
import type { Backend, DecodeMeter, Slot, SlotRequest } from '../upstream/index.ts';
import { BackendControl, RATE_ALPHA } from './backend-control.ts';
import type { LimitBounds } from './controller.ts';
import { Heap } from './heap.ts';
import { atPlan, MIN_RATIO_SAMPLES, type Plan, PlanRing, RATIO_SAMPLES, RATIO_WINDOW_MS } from './plan.ts';
import { gonePrefillMs } from './prefix-gone.ts';
import { FifoQueue, type QueueDiscipline, type QueueEntry, type QueueOrder, SlagateQueue } from './queue.ts';
import { budgetWords, type ScheduledRequest } from './types.ts';

export interface SchedulerSettings extends QueueOrder {
  maxQueue: number;
  /** Seeds under `slagate` (scheduler.seeds; #seedOf). */
  seeds: boolean;
  concurrency: LimitBounds & {
    initial: number;
    /** Prefill tokens that may wait on a backend (dispatched, no first token yet); 0 = no cap. */
    prefillTokens: number;
    intervalMs: number;
    outerPeriods: number;
    ttftShare: number;
    tpotShare: number;
  };
  /** An attempt's first-token timeout is this multiple of its predicted time to first token… */
  firstTokenTimeoutFactor: number;
  /** …and at most this (upstream.first_token_timeout_ms). */
  firstTokenTimeoutMaxMs: number;
}

export interface SchedulerDeps {
  /** Every configured backend (availability is read from each). */
  backends: () => readonly Backend[];
  live: LiveState;
  router: () => RoutingPolicy;
  settings: () => SchedulerSettings;
  /** A request was refused while it waited (queue_full, queue_timeout): admission's pressure signal. */
  onRefused?: (req: ScheduledRequest, err: GatewayError) => void;
  now?: () => number;
}

/** What one granted attempt was dispatched with: the live state's fit sample needs it. */
export interface Grant {
  readonly backend: string;
  /**
   * The server granted. A reload that removes it, or gives its name another URL, retires it
   * (`state` 'removed'): nothing learnt of this grant is then about the server under the name.
   */
  readonly server: Backend;
  readonly grantedAt: number;
  /** In-flight requests on the backend (all instances) just before this one. */
  readonly loadAtDispatch: number;
  /** Uncached prefill tokens pending on the backend just before this one. */
  readonly prefillAheadTokens: number;
  /** Leading prompt blocks, and tokens, the backend was believed to hold (the router's view). */
  readonly cachedBlocks: number;
  readonly cachedTokens: number;
  /** Prompt tokens it was expected to prefill. */
  readonly uncachedTokens: number;
  /**
   * cachedTokens ÷ the prompt's tokens; null when nothing was measured: no prompt tokens, or a
   * prompt shorter than one index block, which the index cannot see whatever the backend holds
   * (null under `oracle` too, which could see it: counted only when it hit, such prompts would
   * bias the ratio up).
   */
  readonly prefixHit: number | null;
  /** The router's best few candidates, best first, with their cost terms (the debug log line). */
  readonly candidates: readonly Candidate[];
  /** Sent as a seed: predicted late, to give its prefix a second backend (Scheduler.seedFor). */
  readonly seed: boolean;
}

/** How many of the router's candidates a grant keeps for the log. */
const CANDIDATES_KEPT = 3;

interface Choice {
  backend: Backend;
  view: BackendView;
  ranked: Candidate[];
}

/** One pump's view of the backends, updated as it grants and as entries wait. */
interface Round {
  /** Slots free under each backend's limit (every instance's leases counted). */
  readonly room: Map<string, number>;
  /** Entries of this round that wait for each backend (they ranked it first and it had no room for them). */
  readonly ahead: Map<string, number>;
  /** Those entries' uncached prompt tokens, by backend: the prefill they will add there. */
  readonly aheadTokens: Map<string, number>;
  /** Backends an earlier entry of this round waits for: no later entry may take them now. */
  readonly closed: Set<string>;
  /** Prefill tokens that may wait on a backend (slagate's `prefill_tokens`; 0: no cap). */
  readonly prefillCap: number;
  /** The gateway queues at all (`max_queue` > 0). */
  readonly queues: boolean;
}

/** The terms of a predicted queue wait (estimateWaitMs). */
interface WaitTerms {
  /** Slots free now on the backends the request may use. */
  free: number;
  /** No entry may go before it there: with a free slot, it waits for nothing. */
  nothingAhead: boolean;
  /** Entries that would take those backends' slots first. */
  ahead: number;
  /** Slots those backends free per second; null while unmeasured. */
  rate: number | null;
}

/**
 * Entries a pump passes over (each waiting for a backend without room) per available backend
 * before it stops: bounds a pump's work when the head of a long queue waits for busy backends.
 */
const PASSES_PER_BACKEND = 16;
/** Entries of one tenant in one class a round passes over before the other tenants' come first (#pumpOnce). */
const PASSES_PER_TENANT = 16;

export interface BackendSchedule {
  name: string;
  limit: number;
  inflight: number;
  /** The last control step's error (1 = at the setpoint); null before any signal, and under fcfs. */
  error: number | null;
  /** The outer loop's setpoint; null under fcfs, where no loop runs. */
  tpotShare: number | null;
  /**
   * The P99 of how its own predictions turned out, that it is planned on (upperBackendMs); null
   * until it has enough first tokens of its own, when the fleet's is used.
   */
  planMultiplier: number | null;
}

export interface SchedulerView {
  policy: 'slagate' | 'fcfs';
  queued: number;
  retries: number;
  /** Requests waiting, by class; a class with none waiting is left out. */
  byClass: Record<string, number>;
  /** Slots freed per second (smoothed): the drain rate the wait estimates use. */
  releasesPerS: number | null;
  backends: BackendSchedule[];
}

interface Waiting extends QueueEntry {
  /** Fresh entries: arrival + TTFT target − predicted time to first token; retries: the deadline. */
  readonly expiresAt: number;
  readonly retry: boolean;
  readonly excluded: ReadonlySet<string>;
  readonly ticket: Ticket;
  readonly settle: (slot: Slot | null, err?: unknown) => void;
}

export class Scheduler {
  readonly #deps: SchedulerDeps;
  readonly #now: () => number;
  #queue: QueueDiscipline;
  readonly #retries: Waiting[] = [];
  readonly #expiries = new Heap<Waiting>(
    (a, b) => a.expiresAt < b.expiresAt,
    (w) => w.state === 'queued',
  );
  #expiryTimer: NodeJS.Timeout | null = null;
  #expiryAt = Number.POSITIVE_INFINITY;
  readonly #controls = new Map<string, BackendControl>();
  readonly #controlTimer: NodeJS.Timeout;
  #releases = 0;
  #releaseRate: number | null = null;
  /**
   * What the last pump left waiting: the backends an entry waits for (nobody behind it starts
   * there), and whether it stopped at its bound on entries passed over, so that entries it never
   * reached may be waiting for any backend. startsNow reads them; empty and false when nothing waits.
   */
  #waitedFor: ReadonlySet<string> = new Set();
  #passedBound = false;
  /**
   * Fresh entries that may not use some backends: first attempts asked again after a backend
   * refused them before they started. Checked at every pump, like retries, whether the scan
   * reaches them or not.
   */
  readonly #reasked = new Set<Waiting>();
  // Recent dispatch-to-first-token times, predicted and actual, on every backend, and the plan
  // the last control step read from them (each backend's own is in its control).
  readonly #ring = new PlanRing(RATIO_SAMPLES, MIN_RATIO_SAMPLES, RATIO_WINDOW_MS);
  #plan: Plan | null = null;
  /** First tokens that could be judged for a cached prefix gone (gonePrefillMs), and those judged so. */
  #prefixJudged = 0;
  #prefixGone = 0;
  /** The prefix index's match, bound once (the router's views call it per backend per grant). */
  readonly #match: PrefixMatch;
  /** Backends with a seed of this instance still prefilling (#seedOf). */
  readonly #seeding = new Set<string>();
  #lastTick: number;
  #pumping = false;
  #again = false;
  /**
   * An entry the next scan must reach, past its bound: one that may not wait (x-slagate-no-queue,
   * max_queue 0), refused unless that pump grants it, or one that met a full queue, refused or
   * given another's place unless it does. Invariant: such a request is refused "no room" (or
   * takes a place from another) only when it was looked at and no backend could start it; the
   * bound, which spares a pump from ranking a long backlog again, must not refuse it unseen while a
   * backend idles.
   */
  #mustReach: Waiting | null = null;
  /**
   * #mustReach met a full queue: its pump offers it a backend that starts it now, on time, before
   * the router's first choice (which may be a busy backend it would be on time at after a wait):
   * waiting, it would take another's place, or be refused, where a backend could serve it now.
   */
  #reachFull = false;
  /** The settings the queue's order was last checked against (#discipline). */
  #orderedBy: SchedulerSettings | null = null;
  #closed = false;

  constructor(deps: SchedulerDeps) {
    this.#deps = deps;
    this.#match = (backend, hashes) => deps.live.prefixMatch(backend, hashes);
    this.#now = deps.now ?? (() => performance.now());
    this.#queue = this.#makeQueue(deps.settings());
    this.#lastTick = this.#now();
    this.#controlTimer = setInterval(() => this.#control(), deps.settings().concurrency.intervalMs);
    this.#controlTimer.unref();
    deps.live.onPeersChanged(() => this.pump());
  }

  /** The request's scheduling context: its attempts ask it for slots. */
  ticket(req: ScheduledRequest): Ticket {
    return new Ticket(this, req);
  }

  /**
   * The current limit of a backend (its initial one before the loop has run), within the bounds the
   * settings give now; the loop's own value, which moves in fractions.
   */
  limit(backend: string): number {
    return this.#controlOf(backend).limit(this.#deps.settings().concurrency);
  }

  /**
   * Predicted wait in the gateway queue for a new request, ms: 0 when it would be dispatched at
   * once; else the entries ahead of it over the rate slots free up; null when that rate is unknown.
   * The fleet's wait: a backend that would start the request at once (startsNow) has none.
   */
  estimateWaitMs(req: ScheduledRequest): number | null {
    const backends = this.#deps.backends();
    const q = someServeOthers(backends, req.model) ? this.#modelQueue(req, backends) : this.#fleetQueue(req);
    if (q.nothingAhead && q.free > 0) return 0;
    if (q.rate === null || q.rate <= 0) return null;
    return (Math.max(0, q.ahead + 1 - q.free) / q.rate) * 1000;
  }

  /** What a request waits behind in a fleet of one model: the whole queue, every backend's slots. */
  #fleetQueue(req: ScheduledRequest): WaitTerms {
    const nothingAhead = this.#queue.size === 0 && this.#retries.length === 0;
    return {
      free: this.#totalRoom(),
      nothingAhead,
      ahead: nothingAhead
        ? 0
        : this.#queue.aheadOf(req, this.#queue.keyFor(req, this.#now())) + this.#retries.length,
      rate: this.#releaseRate,
    };
  }

  /**
   * What a request waits behind in a fleet of several models, where some available backend does
   * not serve `req`'s: the backends that do. The slots free there, the entries ahead of it that
   * those backends may take (another model's backlog elsewhere holds other backends), and the rate
   * those backends free slots (each one's own, measured per control period; null while none is).
   */
  #modelQueue(req: ScheduledRequest, backends: readonly Backend[]): WaitTerms {
    const { free, rate, competes } = this.#modelBackends(req.model, backends);
    const same = (e: QueueEntry) => competes(e.req.model);
    let ahead = this.#queue.aheadOf(req, this.#queue.keyFor(req, this.#now()), same);
    for (const w of this.#retries) if (same(w)) ahead++;
    return { free, nothingAhead: ahead === 0, ahead, rate };
  }

  /**
   * The available backends that serve `model`: the slots free there, the rate they free slots
   * (each one's own, measured per control period; null while none is), and which entries compete
   * for them (of its model, or of another one they serve too: a base model and its adapters on
   * shared replicas).
   */
  #modelBackends(
    model: string,
    backends: readonly Backend[],
  ): { free: number; rate: number | null; competes: (m: string) => boolean } {
    let free = 0;
    let rate: number | null = null;
    const mine: Backend[] = [];
    for (const b of backends) {
      if (!b.available || !b.serves(model)) continue;
      mine.push(b);
      free += Math.max(0, this.#room(b.name));
      const r = this.#controlOf(b.name).releaseRate;
      if (r !== null) rate = (rate ?? 0) + r;
    }
    return { free, rate, competes: (m) => m === model || mine.some((b) => b.serves(m)) };
  }

  /**
   * Backend `name` would start a request of `uncachedTokens` the moment it is queued, the tests a
   * pump makes (#slot): a slot free under its limit, (slagate) prefill room, and no entry waiting
   * for it (the last pump closed no backend it reached to the entries behind, and did not stop at
   * its bound). Whatever else is queued then waits for other backends, so the request waits for
   * none of it there, however long the queue: its wait on this backend is 0, not the fleet's.
   * It reads the last pump: an entry that waited for a busy backend and has since become late
   * there, with no pump in between, may take this backend first (it is judged at the next pump).
   * `noQueue`: the request may not wait (x-slagate-no-queue): its pump goes past the bound as far
   * as it (#mustReach), so a pump that stopped at the bound does not close a backend to it; so
   * does the pump of a first ask that meets a full queue.
   */
  startsNow(name: string, uncachedTokens: number, noQueue = false): boolean {
    const settings = this.#deps.settings();
    const reached = !mayWait(noQueue, settings) || this.#full(settings);
    return (reached || !this.#passedBound) && this.#opensNow(name, uncachedTokens);
  }

  /** startsNow with the last pump's bound aside: a slot, prefill room, and no entry waiting there. */
  #opensNow(name: string, uncachedTokens: number): boolean {
    return (
      !this.#waitedFor.has(name) &&
      this.#room(name) > 0 &&
      this.#prefillRoom(name, uncachedTokens, this.#prefillCap())
    );
  }

  /**
   * Some available backend that serves `req`'s model, not excluded, would start it the moment it
   * is queued, as the last pump left it (startsNow, the bound aside).
   */
  #opensTo(req: ScheduledRequest, excluded: ReadonlySet<string>): boolean {
    for (const b of this.#deps.backends()) {
      if (!b.available || excluded.has(b.name) || !b.serves(req.model)) continue;
      if (this.#opensNow(b.name, cachedOn(req.route, b.name, this.#match).uncached)) return true;
    }
    return false;
  }

  /** A first ask now would find the queue at its bound (retries counted against it). */
  #full(settings: SchedulerSettings): boolean {
    return settings.maxQueue > 0 && this.#queue.size + this.#retries.length >= settings.maxQueue;
  }

  /**
   * The backend a request predicted late everywhere would seed now (#seedOf), for admission to
   * let it in rather than refuse it; null when there is none. Its first attempt then goes there.
   */
  seedFor(req: ScheduledRequest): string | null {
    const available = this.#deps.backends().filter((b) => b.available);
    return this.#seedOf(req, available, null, null)?.name ?? null;
  }

  /**
   * A second home for a hot prefix: where to send a request that would be refused as late
   * everywhere, as a deliberate miss. Invariant: a prefix held on one backend only is the one whose
   * every request waits for that backend, and when it is busy they are refused one after another,
   * while a backend that could take them holds none of it: a cold prefill of this workload's
   * prompts runs past the target on its own (about 550 ms on an A100 against 500 ms), so the
   * router's cost and the guard never move it (docs/benchmarks.md, "Where the whole product still
   * refuses"). One such request sent there anyway is late, as it would have been refused; the
   * prompt's blocks are then in that backend's index, and the prefix's next requests are ranked
   * on both. Bounded so that seeds do not become the load: only under `scheduler.policy: slagate`;
   * only a prompt of which one backend holds at least half, and no other backend half of what that
   * one holds (a second home, never a third); only to a backend that would start it now, with
   * under a quarter of the mean in flight of the backends that serve the model (one the fleet is
   * not using: with the mean itself, seeds went to every backend in turn, 7% of the requests, each
   * a cold prefill evicting another tenant's prefix, and the goodput fell), and no other seed of
   * this instance still prefilling there (one cold prefill at a time); the least loaded of those.
   */
  #seedOf(
    req: ScheduledRequest,
    available: readonly Backend[],
    round: Round | null,
    excluded: ReadonlySet<string> | null,
  ): Backend | null {
    const settings = this.#deps.settings();
    if (settings.policy !== 'slagate' || !settings.seeds || req.promptTokens <= 0) return null;
    const { live } = this.#deps;
    let most = 0;
    let total = 0;
    const seen: { b: Backend; tokens: number; uncached: number; load: number }[] = [];
    for (const b of available) {
      if (!b.serves(req.model)) continue;
      const cached = cachedOn(req.route, b.name, this.#match);
      const load = live.load(b.name);
      total += load;
      most = Math.max(most, cached.tokens);
      seen.push({ b, tokens: cached.tokens, uncached: cached.uncached, load });
    }
    if (seen.length < 2 || most < req.promptTokens / 2) return null;
    const mean = total / seen.length;
    let holders = 0;
    let best: (typeof seen)[number] | null = null;
    for (const c of seen) {
      if (c.tokens >= most / 2) {
        holders++;
        continue;
      }
      const name = c.b.name;
      // Asked by admission, it must start the request the moment it is queued (startsNow: no entry
      // waits for it), or the pinned seed would wait there alone and be refused all the same.
      const opens =
        round === null ? this.startsNow(name, c.uncached, req.noQueue) : this.#opens(name, round, c.uncached);
      if (!opens || excluded?.has(name) || this.#seeding.has(name) || c.load >= mean / 4) continue;
      if (best === null || c.load < best.load) best = c;
    }
    return holders === 1 ? (best?.b ?? null) : null;
  }

  /**
   * The backend a request admitted to seed (seedFor) is offered alone: on its first attempt only
   * (a retry, or a first attempt asked again, is routed as any other), and while no other seed
   * prefills there (else routed as any other too: late, it may seed elsewhere or is refused).
   */
  #pinOf(req: ScheduledRequest, excluded: ReadonlySet<string> | null): string | null {
    const on = req.seedOn;
    if (on === undefined || (excluded !== null && excluded.size > 0) || this.#seeding.has(on)) return null;
    return on;
  }

  /** A seed's prefill ended (its first token, or its attempt before one): the backend may take another. */
  seedEnded(name: string): void {
    this.#seeding.delete(name);
  }

  /**
   * A predicted dispatch-to-first-token time on `backend`, taken at the P99 of how recent
   * predictions turned out (actual ÷ predicted): what the queue guard and admission plan with, so
   * that the P99, not just the median, of admitted requests meets the target. The backend's own
   * P99 once it has enough first tokens of its own, the fleet's until then (src/scheduler/plan.ts);
   * the prediction itself until the fleet has enough.
   *
   * Invariant: a prediction counts as at least the floor, the 5th percentile of recent actual
   * times, both here and in the ratios. A linear fit can predict next to nothing for a small
   * request (its intercept may be below zero); no first token comes that fast, and a ratio over a
   * near-zero prediction (80 ms ÷ 0.5 ms) would otherwise become the P99 that every other
   * prediction is multiplied by, and the guard would refuse requests predicted at a fraction of
   * their target.
   */
  upperBackendMs(backend: string, predictedMs: number): number {
    return atPlan(this.#planOf(backend), predictedMs);
  }

  /**
   * The predictor's typical relative error: the median of |actual ÷ predicted − 1| over recent
   * dispatch-to-first-token times on the whole fleet; null until enough samples. Costs closer than
   * this are ties.
   */
  predictionSpread(): number | null {
    return this.#plan?.spread ?? null;
  }

  /**
   * The fleet's multiplier (what a backend without enough first tokens of its own plans with; null
   * until measured), and the first tokens judged for a cached prefix gone since this scheduler
   * started, and those found so (gonePrefillMs). Each backend's own is in view().
   */
  planning(): { multiplier: number | null; prefixJudged: number; prefixGone: number } {
    return {
      multiplier: this.#plan?.multiplier ?? null,
      prefixJudged: this.#prefixJudged,
      prefixGone: this.#prefixGone,
    };
  }

  /**
   * The least dispatch to first token admission predicted for `req` on any backend, each taken at
   * that backend's P99 (upperBackendMs): the guard's bound on its wait. Without a prediction
   * anywhere, its best prediction (none: 0) at the fleet's.
   */
  #soonestUpperMs(req: ScheduledRequest): number {
    let least: number | null = null;
    for (const p of req.predictions.values()) {
      if (p.backendMs === null) continue;
      const ms = this.upperBackendMs(p.backend, p.backendMs);
      if (least === null || ms < least) least = ms;
    }
    if (least !== null) return least;
    return atPlan(this.#plan, req.bestBackendMs ?? 0);
  }

  /** The plan `backend` is planned on: its own, else the fleet's; null before the fleet has one. */
  #planOf(backend: string): Plan | null {
    return this.#controls.get(backend)?.plan ?? this.#plan;
  }

  /** Time for the queue as it stands to drain, for Retry-After; null when the drain rate is unknown. */
  drainMs(model?: string): number | null {
    if (model !== undefined) {
      const backends = this.#deps.backends();
      if (someServeOthers(backends, model)) return this.#modelDrainMs(model, backends);
    }
    const rate = this.#releaseRate;
    if (rate === null || rate <= 0) return null;
    return ((this.#queue.size + this.#retries.length) / rate) * 1000;
  }

  /**
   * The drain of what waits for `model`'s backends, in a fleet where some available backend does
   * not serve it: the entries those backends may take (of its model, or of another they serve too),
   * over the rate they free slots (null while none is measured). A model on one slow replica beside
   * seven fast ones of another drains at its own pace, not the fleet's (a Retry-After of 2 s where
   * its queue takes 50 would send its clients back to be refused again).
   */
  #modelDrainMs(model: string, backends: readonly Backend[]): number | null {
    const { rate, competes } = this.#modelBackends(model, backends);
    if (rate === null || rate <= 0) return null;
    let waiting = 0;
    for (const [m, n] of this.#queue.byModel()) if (competes(m)) waiting += n;
    for (const w of this.#retries) if (competes(w.req.model)) waiting++;
    return (waiting / rate) * 1000;
  }

  view(): SchedulerView {
    const byClass: Record<string, number> = {};
    // Classes with requests waiting only: a class a reload removed goes once its last one leaves.
    for (const [c, n] of this.#queue.depthByClass()) if (n > 0) byClass[c] = n;
    const backends: BackendSchedule[] = [];
    const looping = this.#deps.settings().policy !== 'fcfs';
    for (const b of this.#deps.backends()) {
      const c = this.#controlOf(b.name);
      backends.push({
        name: b.name,
        limit: this.#limitOf(b.name),
        inflight: this.#deps.live.load(b.name),
        // From the reload on, not from the next control step: no loop runs under fcfs.
        error: looping ? c.error : null,
        tpotShare: looping ? c.tpotShare : null,
        planMultiplier: c.plan?.multiplier ?? null,
      });
    }
    return {
      policy: this.#queue.name,
      queued: this.#queue.size,
      retries: this.#retries.length,
      byClass,
      releasesPerS: this.#releaseRate,
      backends,
    };
  }

  /** Grants every slot that has become possible. Safe to call from anywhere, any number of times. */
  pump(): void {
    if (this.#closed) return;
    if (this.#pumping) {
      this.#again = true;
      return;
    }
    this.#pumping = true;
    try {
      do {
        this.#again = false;
        this.#pumpOnce();
      } while (this.#again);
    } finally {
      this.#pumping = false;
    }
  }

  close(): void {
    this.#closed = true;
    clearInterval(this.#controlTimer);
    if (this.#expiryTimer !== null) clearTimeout(this.#expiryTimer);
    this.#expiryTimer = null;
  }

  // ---- entries ----

  /** Ticket.acquire: the one way in. */
  enqueue(ticket: Ticket, sr: SlotRequest): Promise<Slot | null> {
    const req = ticket.req;
    const retry = sr.attempt > 0;
    // A first attempt asked again: granted once, refused by its backend before it started.
    const reasked = !retry && sr.excluded.size > 0;
    if (sr.signal.aborted) return Promise.reject(sr.signal.reason);
    if (!anyUsable(this.#deps.backends(), sr.excluded, req.model)) return Promise.resolve(null);
    const settings = this.#deps.settings();
    const queue = this.#discipline(settings);
    // Invariant: a request the gateway took in is not refused for a full queue on its way back in;
    // its place was counted when it first asked (retries are not counted against the bound either).
    // One that may not wait (x-slagate-no-queue, or max_queue 0) is still refused below when no
    // backend can take it at once, as on its first ask.
    // A full queue takes a request only in place of an entry it gives up for it (victimFor, below),
    // and only when the request must wait: one a backend starts at once takes no place.
    const full = !retry && !reasked && this.#full(settings);
    return new Promise<Slot | null>((resolve, reject) => {
      const now = this.#now();
      const onAbort = () => {
        if (w.state !== 'queued') return;
        if (w.retry) this.#dropRetry(w);
        else this.#queue.remove(w);
        w.settle(null, sr.signal.reason);
        // It may have held a backend closed to those behind it (waiting there for prefill room),
        // or used up the pump's bound: they are looked at again now, not at the next event.
        this.pump();
      };
      const w: Waiting = {
        req,
        queuedAt: now,
        // A first attempt asked again keeps the place its first ask gave it: its key is made of
        // that time, so those who came after it do not pass it while it was away.
        key: retry ? now : queue.keyFor(req, ticket.firstAskedAt(now)),
        alreadyCharged: reasked,
        state: 'queued',
        retry,
        excluded: sr.excluded,
        ticket,
        expiresAt: retry
          ? req.deadlineAt
          : // The request's deadline bounds its wait too (a class target may be longer).
            Math.min(req.arrivedAt + req.ttftBudgetMs - this.#soonestUpperMs(req), req.deadlineAt),
        settle: (slot, err) => {
          sr.signal.offAbort(onAbort);
          if (err !== undefined) reject(err);
          else resolve(slot);
        },
      };
      sr.signal.onAbort(onAbort);
      if (retry) this.#retries.push(w);
      else {
        queue.push(w);
        if (sr.excluded.size > 0) this.#reasked.add(w);
      }
      // One that may not wait is judged by this pump, however far behind the scan's bound it is; so
      // is one that meets a full queue while a backend would start it now (the last pump left one
      // open to it), which is refused or takes another's place below only if none does (unseen,
      // it was refused while a backend idled). Only then: a pump that reaches a request ranks every
      // entry before it, and a full queue's arrivals would each rank most of it.
      const waits = mayWait(req.noQueue, settings);
      const reachFull = full && waits && this.#opensTo(req, sr.excluded);
      if ((!waits || reachFull) && !retry) this.#mustReach = w;
      this.#reachFull = reachFull;
      try {
        this.pump();
      } finally {
        this.#mustReach = null;
        this.#reachFull = false;
      }
      if (w.state !== 'queued') return;
      // Not granted at once: is it allowed to wait? A retry that may not is given up (null: the
      // attempt loop answers with the failure before it), as a first attempt is refused.
      if (retry && !waits) {
        this.#dropRetry(w);
        w.settle(null);
        return;
      }
      if (!retry && !waits) {
        queue.remove(w);
        const why = req.noQueue
          ? 'No backend has room for this request now and x-slagate-no-queue is set.'
          : 'No backend has room for this request now and the gateway does not queue (scheduler.max_queue is 0).';
        w.settle(null, this.#refusal(req, 'queue_full', why));
        return;
      }
      // It stays queued: only now, when it takes a place, does another entry lose its own, and
      // only if the queue is still over its bound (the pump may have let others go).
      if (full && queue.size - 1 + this.#retries.length >= settings.maxQueue) {
        const victim = queue.victimFor(req, w, this.#retriesByTenant()) as Waiting | undefined;
        if (victim === undefined) {
          queue.remove(w);
          w.settle(null, this.#refusal(req, 'queue_full'));
          // Its pump counted it waiting for a backend (closed to those behind it, its pass used):
          // the others are looked at again without it, as after a cancel.
          this.pump();
          return;
        }
        queue.remove(victim);
        victim.settle(
          null,
          this.#refusal(
            victim.req,
            'queue_full',
            victim.req.sheddable && !req.sheddable
              ? 'evicted from the queue to make room for a protected class'
              : 'evicted from the queue: its tenant held more of it than another tenant whose request needed a place',
          ),
        );
        this.#expiries.push(w);
        this.#armExpiry();
        // The victim may have held a backend closed to those behind it in the pump above (this
        // request among them): they are looked at again without it, as after a cancel.
        this.pump();
        return;
      }
      this.#expiries.push(w);
      this.#armExpiry();
    });
  }

  /** The retries waiting for a slot, by tenant: places in the queue's bound a tenant holds. */
  #retriesByTenant(): Map<string, number> {
    const out = new Map<string, number>();
    for (const w of this.#retries) out.set(w.req.tenant, (out.get(w.req.tenant) ?? 0) + 1);
    return out;
  }

  #pumpOnce(): void {
    // A reload's order takes effect at its pump (the waiting entries move to its queue).
    this.#discipline(this.#deps.settings());
    // Nothing waits: nothing to grant (a release or a first token with an empty queue, the usual case).
    if (this.#queue.size === 0 && this.#retries.length === 0) {
      if (this.#passedBound || this.#waitedFor.size > 0) {
        this.#waitedFor = new Set();
        this.#passedBound = false;
      }
      this.#reasked.clear();
      return;
    }
    const backends = this.#deps.backends();
    const available = backends.filter((b) => b.available);
    // What entries may wait for: the available and those whose breaker's trial is out (Backend.usable).
    const usable = available.length === backends.length ? available : backends.filter((b) => b.usable);
    // Entries that can no longer be placed anywhere get null now (the loop decides what follows).
    if (this.#retries.length > 0) {
      for (const w of [...this.#retries]) {
        if (!anyUsable(usable, w.excluded, w.req.model)) {
          this.#dropRetry(w);
          w.settle(null);
        }
      }
    }
    for (const w of this.#reasked) {
      if (w.state !== 'queued') this.#reasked.delete(w);
      else if (!anyUsable(usable, w.excluded, w.req.model)) {
        this.#reasked.delete(w);
        this.#queue.remove(w);
        w.settle(null);
      }
    }
    if (available.length === 0) {
      // Nothing to grant now; the entries a backend will take once its trial ends wait for it.
      if (usable.length > 0) {
        this.#settleOrphans(usable);
        return;
      }
      this.#queue.scan((e) => {
        e.state = 'removed';
        (e as Waiting).settle(null);
        return 'take';
      });
      return;
    }
    const settings = this.#deps.settings();
    const round: Round = {
      room: new Map(),
      ahead: new Map(),
      aheadTokens: new Map(),
      closed: new Set(),
      prefillCap: this.#prefillCap(),
      queues: settings.maxQueue > 0,
    };
    for (const b of available) round.room.set(b.name, this.#room(b.name));
    const waiting = this.#queue.size + this.#retries.length > 0;
    if (waiting)
      for (const b of available) if ((round.room.get(b.name) ?? 0) <= 0) this.#controlOf(b.name).block();
    // Retries first: they have waited once already.
    for (let i = 0; i < this.#retries.length; ) {
      const w = this.#retries[i] as Waiting;
      const choice = this.#startable(w.req, available, round, w.excluded);
      if (choice === null) {
        i++;
        continue;
      }
      this.#retries.splice(i, 1);
      w.state = 'granted';
      this.#grant(w, choice, round);
    }
    this.#settleOrphans(usable);
    let passes = 0;
    // Models no backend open in this round serves: backends only close as a round goes on, so
    // such a model stays so until the round ends. Made when the first is found (a fleet of one
    // model never needs it).
    let shut: Set<string> | null = null;
    const maxPasses = PASSES_PER_BACKEND * available.length;
    // Entries of each tenant (in its class) passed over in this round.
    const tenantPasses = new Map<string, number>();
    this.#waitedFor = round.closed;
    let reach = this.#mustReach;
    // Refused in the scan, told after it: a refusal's Retry-After counts the entries waiting ahead
    // of it (aheadOf), and those the scan has passed are out of their heaps until it ends.
    const late: Waiting[] = [];
    this.#queue.scan((e) => {
      if (!this.#anyOpen(available, round) || (passes >= maxPasses && reach === null)) return 'stop';
      const w = e as Waiting;
      if (w === reach) reach = null;
      // Invariant: the bound counts entries ranked and left waiting for a backend open to them; an
      // entry of a model no open backend serves is passed over unranked and uncounted, so a
      // backlog of one model never hides an idle backend from another's entries behind it, and the
      // scan stops once every model still queued has no backend open. An entry that nothing
      // available may take any more (its model's last backend went, or stopped listing it) gets
      // null now, as every entry does when no backend at all is available.
      const model = w.req.model;
      if (shut?.has(model) || !this.#anyOpen(available, round, model)) {
        if (!anyUsable(usable, w.excluded, model)) {
          w.state = 'removed';
          w.settle(null);
          return 'take';
        }
        if (shut?.has(model)) return 'pass';
        shut ??= new Set();
        shut.add(model);
        // Every model still queued is shut: nothing behind can go in this round.
        for (const m of this.#queue.byModel().keys()) if (!shut.has(m)) return 'pass';
        return 'stop';
      }
      const choice = this.#startable(w.req, available, round, w.excluded, w);
      if (choice === null) {
        passes++;
        // Invariant: one tenant's run of entries waiting for busy backends does not use up the
        // round's bound before the other tenants' entries are looked at. Under slagate the tenant
        // served least comes first, and its entries come one after another; without this, a light
        // tenant's burst for one busy backend was passed over until the bound, the older entry of
        // a tenant served more behind it was never looked at, and the backend it wanted stood idle
        // (the burst's own backend freed slots one at a time, so the idling lasted until the
        // counters evened out or the older entry timed out). After PASSES_PER_TENANT of its
        // entries, the rest of that tenant's in the class come after the other tenants' (the
        // queue's 'skip'), still under the bound; with one tenant nothing changes.
        const who = `${w.req.className}\u0000${w.req.tenant}`;
        const k = (tenantPasses.get(who) ?? 0) + 1;
        tenantPasses.set(who, k);
        return k < PASSES_PER_TENANT ? 'pass' : 'skip';
      }
      // Sent now and late there: every backend the router ranked is late (#choose looks past them).
      // It seeds the backend admission pinned it to (late there by design), or one #seedOf finds,
      // and is refused when it may not.
      if (this.#tooLate(w, choice.view)) {
        const pinned = this.#pinOf(w.req, w.excluded) === choice.backend.name;
        const seed = pinned ? choice.backend : this.#seedOf(w.req, available, round, w.excluded);
        if (seed === null) {
          w.state = 'removed';
          late.push(w);
          return 'take';
        }
        const view = pinned ? choice.view : this.#view(w.req, seed, round);
        this.#grant(w, { backend: seed, view, ranked: choice.ranked }, round, true);
        return 'take';
      }
      this.#grant(w, choice, round);
      return 'take';
    });
    for (const w of late) w.settle(null, this.#refusal(w.req, 'queue_timeout'));
    // At the bound, a request queued now would be beyond it: not reached by this pump whatever
    // it waits for (whether more entries were left or not).
    this.#passedBound = passes >= maxPasses;
  }

  /**
   * The backend chosen for `req` (#choose) when it can start there now; otherwise null, and when
   * that choice is a busy backend the request waits for it: it is closed to the entries after
   * this one in the round.
   */
  #startable(
    req: ScheduledRequest,
    available: readonly Backend[],
    round: Round,
    excluded: ReadonlySet<string> | null,
    onTime: Waiting | null = null,
  ): Choice | null {
    const choice = this.#choose(req, available, round, excluded, onTime);
    if (choice === null || choice.view.hasRoom) return choice;
    const backend = choice.backend.name;
    round.ahead.set(backend, (round.ahead.get(backend) ?? 0) + 1);
    round.aheadTokens.set(backend, (round.aheadTokens.get(backend) ?? 0) + choice.view.uncachedTokens);
    round.closed.add(backend);
    // Blocked by its limit, which the control loop may raise; not by prefill room or by an entry
    // ahead, which a higher limit would not cure (counted as binding, they wound the limit up to
    // max with one request in flight).
    if (this.#deps.live.load(backend) >= this.#limitOf(backend)) this.#controlOf(backend).block();
    return null;
  }

  /**
   * Invariant: an entry of a model no usable backend serves any more (its last one removed,
   * down, or no longer listing it) gets null at the pump that finds it so, as a new request for it
   * gets 503 at once, whatever room the other models' backends have. The scan of a round stops at
   * the first entry when every backend is full, so it alone left such an entry to its guard (a 429
   * queue_timeout up to its budget later). A backend whose models are held (a reload added it)
   * still may serve its models: their entries wait for it. Costs one look per queued model when
   * there is none.
   */
  #settleOrphans(usable: readonly Backend[]): void {
    let gone: Set<string> | null = null;
    for (const model of this.#queue.byModel().keys()) {
      if (usable.some((b) => b.mayServe(model))) continue;
      gone ??= new Set();
      gone.add(model);
    }
    if (gone === null) return;
    this.#queue.scan((e) => {
      const w = e as Waiting;
      if (!gone.has(w.req.model) || anyUsable(usable, w.excluded, w.req.model)) return 'pass';
      w.state = 'removed';
      w.settle(null);
      return 'take';
    });
  }

  /** Some backend is open in this round (with `model`: one that serves it). */
  #anyOpen(available: readonly Backend[], round: Round, model?: string): boolean {
    for (const b of available)
      if (
        (round.room.get(b.name) ?? 0) > 0 &&
        !round.closed.has(b.name) &&
        (model === undefined || b.serves(model))
      )
        return true;
    return false;
  }

  /**
   * The backend chosen among every available backend the attempt may use (not excluded, and
   * serving the request's model),
   * each with whether it can start the request now and how long a slot there would take; with
   * what it read about it and the candidates it ranked. Null when there is no such backend.
   *
   * With `onTime` (a fresh entry), the first in the router's order on which that entry's first
   * token, after the wait for a slot there, is not predicted past its budget (#tooLate); the
   * router's first when none is. A request sent where it is late only misses, and refusing it
   * while a backend further down the ranking can still meet its budget refuses what could be
   * served: the router's order weighs what a backend costs the fleet (its tie-break prefers a
   * backend with room now, and a share of requests explores), not whether this request is on
   * time there. `ranked` stays the router's order (the debug log shows it, and `backend` says
   * where the request went).
   */
  #choose(
    req: ScheduledRequest,
    available: readonly Backend[],
    round: Round,
    excluded: ReadonlySet<string> | null,
    onTime: Waiting | null = null,
  ): Choice | null {
    const views: BackendView[] = [];
    const byName = new Map<string, Backend>();
    // A request that may not wait (x-slagate-no-queue, or no queue at all) is offered only the
    // backends that can start it now: waiting for a busy one would be refusing it.
    const mayWait = !req.noQueue && round.queues;
    const pin = this.#pinOf(req, excluded);
    const pinned = pin === null ? undefined : available.find((b) => b.name === pin && b.serves(req.model));
    if (pinned !== undefined) {
      // Only while it can start the request now: waiting there alone, it would hold the backend
      // closed to every entry behind it, on a prediction made at arrival. Else routed as any other.
      const view = this.#view(req, pinned, round);
      if (view.hasRoom) return { backend: pinned, view, ranked: this.#deps.router().rank(req.route, [view]) };
    }
    for (const b of available) {
      if (excluded?.has(b.name) || !b.serves(req.model)) continue;
      const view = this.#view(req, b, round);
      if (!mayWait && !view.hasRoom) continue;
      views.push(view);
      byName.set(b.name, b);
    }
    if (views.length === 0) return null;
    const ranked = this.#deps.router().rank(req.route, views);
    if (onTime !== null && onTime === this.#mustReach && this.#reachFull) {
      for (const c of ranked) {
        const view = views.find((v) => v.name === c.backend);
        if (view?.hasRoom && !this.#tooLate(onTime, view, 0))
          return { backend: byName.get(c.backend)!, view, ranked };
      }
    }
    let first: Choice | null = null;
    for (const c of ranked) {
      const b = byName.get(c.backend);
      if (b === undefined) continue;
      const view = views.find((v) => v.name === b.name)!;
      if (onTime === null || !this.#tooLate(onTime, view, view.hasRoom ? 0 : view.slotWaitMs)) {
        return { backend: b, view, ranked };
      }
      first ??= { backend: b, view, ranked };
    }
    return first;
  }

  /**
   * Can `b` start this request now: a slot under its limit, no earlier entry of this round
   * waiting for it, and (slagate) prefill room. If not, the predicted wait for a slot there: the
   * entries of this round waiting for it, plus this one, less the slots free, over the rate the
   * backend frees slots, and at least the prefill those entries add there (#prefillWaitMs); with
   * slots for all of them, that prefill alone (the prefill already waiting on the backend is in
   * predictedTtftMs, not here). A backend running over its limit (the controller cut it below the batch) counts as having no
   * slot free, not minus its excess: the limit moves back up as the batch recovers, faster than
   * its releases pay the excess off, and counting it cost 7% of the goodput at twice the fleet's
   * capacity (docs/benchmarks.md, "Counting a backend's excess over its limit as entries ahead").
   */
  #slot(b: Backend, round: Round, uncached: number): { open: boolean; waitMs: number | null } {
    if (this.#opens(b.name, round, uncached)) return { open: true, waitMs: 0 };
    const free = round.room.get(b.name) ?? 0;
    const needed = (round.ahead.get(b.name) ?? 0) + 1 - Math.max(0, free);
    const prefillWaitMs = this.#prefillWaitMs(b.name, round);
    if (needed <= 0) return { open: false, waitMs: prefillWaitMs };
    // Short of slots too: it waits for the later of a slot and the prefill queued ahead of it.
    const rate = this.#controlOf(b.name).releaseRate;
    return {
      open: false,
      waitMs: rate === null || rate <= 0 ? null : Math.max((needed / rate) * 1000, prefillWaitMs),
    };
  }

  /**
   * The wait for prefill room on `name` behind the entries of this round waiting there: the
   * prefill of those entries, at the TTFT fit's rate (all of the wait when `name` has slots for
   * them and one more; with slots short too, the least of it). Each goes as the prefill ahead of
   * it drains under the cap, so a request behind them starts once theirs has
   * drained as far as the backlog there now, which its prediction counts already (predictedTtftMs:
   * it would wait behind that backlog inside the engine). 0 without a fit (as every wait was before
   * one). Invariant: a backend held closed by a cold prompt over the cap is not shown as free of
   * wait: at 0, a request that ranked the holder of its prefix first waited there "on time" behind
   * the cold prompt, was late once it left, and was refused or seeded elsewhere, where it would
   * have been on time at its arrival.
   */
  #prefillWaitMs(name: string, round: Round): number {
    return (round.aheadTokens.get(name) ?? 0) * (this.#deps.live.prefillMs(name, 1) ?? 0);
  }

  /** `name` has a slot free in this round, no earlier entry of it waiting there, and prefill room. */
  #opens(name: string, round: Round, uncached: number): boolean {
    return (
      (round.room.get(name) ?? 0) > 0 &&
      !round.closed.has(name) &&
      this.#prefillRoom(name, uncached, round.prefillCap)
    );
  }

  /**
   * The prefill still ahead on `name` leaves room for `uncached` more under `cap` (0: no cap), or
   * none is ahead. Ahead, not pending until the first token: a backend most of the way through a
   * cold prompt has room for the next one's prefill to queue behind the rest, and a prompt larger
   * than the cap goes alone, once the one before it is estimated done rather than once its first
   * token is back (kept over the exact count on measurement: docs/benchmarks.md, "Prefill still
   * ahead"). The estimate is the TTFT fit's, which every prediction trusts too, and it does not
   * drain while a peer has prefill ahead there.
   */
  #prefillRoom(name: string, uncached: number, cap: number): boolean {
    if (cap <= 0) return true;
    const ahead = this.#deps.live.prefillAheadTokens(name);
    return ahead === 0 || ahead + uncached <= cap;
  }

  /** The prefill cap a pump applies: `scheduler.concurrency.prefill_tokens` under slagate, else none. */
  #prefillCap(): number {
    const settings = this.#deps.settings();
    return settings.policy === 'slagate' ? settings.concurrency.prefillTokens : 0;
  }

  /** What the router reads about `b` for this request, from the live state now. */
  #view(req: ScheduledRequest, b: Backend, round: Round): BackendView {
    const { live } = this.#deps;
    const cached = cachedOn(req.route, b.name, this.#match);
    const inflight = live.load(b.name);
    const size = live.prefixSize(b.name);
    const slot = this.#slot(b, round, cached.uncached);
    return {
      name: b.name,
      weight: b.weight,
      hasRoom: slot.open,
      slotWaitMs: slot.waitMs,
      inflight,
      cachedBlocks: cached.blocks,
      cachedTokens: cached.tokens,
      uncachedTokens: cached.uncached,
      predictedTtftMs: live.predictTtftMs(b.name, cached.uncached),
      prefillMs: live.prefillMs(b.name, cached.uncached),
      // The TPOT fit is learnt at the load a request found when it was sent, itself not counted
      // (the grant's loadAtDispatch): this request, sent now, finds `inflight`.
      tpotMs: live.predictTpotMs(b.name, inflight),
      cacheFill: size.capacity > 0 ? Math.min(1, size.tokens / size.capacity) : 0,
    };
  }

  #grant(w: Waiting, choice: Choice, round: Round, seed = false): void {
    const { live } = this.#deps;
    const { backend: b, view } = choice;
    const req = w.req;
    const loadAtDispatch = live.load(b.name);
    const prefillAheadTokens = live.prefillAheadTokens(b.name);
    const lease = live.lease(b.name, {
      promptTokens: req.promptTokens,
      expectedOutputTokens: req.expectedOutputTokens,
      uncachedPromptTokens: view.uncachedTokens,
    });
    // Sent there: its blocks are (about to be) in that backend's cache, so the next request with
    // this prefix finds them even while this one is still prefilling.
    live.prefixInsert(b.name, req.route.blocks, req.route.blockSizeTokens, req.route.tokensPerBlock);
    this.#deps.router().sent?.(req.route, b.name);
    const trial = b.takeTrial();
    // A half-open backend's one trial is taken: no other entry of this round goes there.
    round.room.set(b.name, b.available ? this.#room(b.name) : 0);
    const control = this.#controlFor(b);
    control.granted(req.tpotTargetMs);
    const grant: Grant = {
      backend: b.name,
      server: b,
      grantedAt: this.#now(),
      loadAtDispatch,
      prefillAheadTokens,
      cachedBlocks: view.cachedBlocks,
      cachedTokens: view.cachedTokens,
      uncachedTokens: view.uncachedTokens,
      prefixHit:
        req.promptTokens > 0 && req.route.blocks.length > 0 ? view.cachedTokens / req.promptTokens : null,
      candidates: choice.ranked.slice(0, CANDIDATES_KEPT),
      seed,
    };
    if (seed) this.#seeding.add(b.name);
    w.ticket.grants.push(grant);
    const settings = this.#deps.settings();
    const predicted = view.predictedTtftMs;
    // Invariant: a first token late because the cached part the index counted on was gone (evicted
    // since) is no backend failure: the backend is prefilling it. The timeout adds that part's
    // prefill, once, to the allowance on the prediction. Without it, a cold 5,000-token prompt the
    // index took for cached was cut at the 500 ms target mid-prefill, blamed on its backend, and sent
    // cold to another: its first token came later than if it had stayed (docs/benchmarks.md). Not
    // the factor times it: a backend that hangs would then hold a request with 5,000 tokens cached
    // about 2 s, one with 32,000 about 12 s, before it is let go.
    const cachedPrefillMs = (this.#deps.live.prefillMs(b.name, 1) ?? 0) * grant.cachedTokens;
    const firstTokenTimeoutMs = Math.min(
      settings.firstTokenTimeoutMaxMs,
      Math.max(req.ttftTargetMs, settings.firstTokenTimeoutFactor * (predicted ?? req.ttftTargetMs)) +
        cachedPrefillMs,
    );
    w.settle(new GrantedSlot(this, b, lease, grant, w, control, firstTokenTimeoutMs, predicted, trial));
  }

  /** Called by a slot at its streamed first token: the controller's TTFT signal, the TTFT fit. */
  firstToken(slot: GrantedSlot): void {
    const req = slot.waiting.req;
    const { grant } = slot;
    const now = this.#now();
    const backendTtft = now - grant.grantedAt;
    const live = this.#deps.live;
    // Invariant: what is learnt from a first token is the prefill the backend really ran. A first
    // token as late as a prefill of the cached part too found the blocks the index counted on gone
    // (evicted since, or not yet computed by the request that brought them), and that part is learnt
    // as prefilled: in the planning ratio (taken at its P99, the bound every request is refused
    // on), the fit, and the controller's wait. Learnt as waits, the few such requests (under 1% of
    // first tokens on prefix-sharing traffic) raised that P99 from about 2.2 to about 3 late in a
    // run (docs/benchmarks.md, "A prefix the index counted on was gone").
    const predicted = slot.predictedBackendMs;
    // The fit's prefill cost is linear in tokens: one lookup serves both parts of the prompt.
    const perToken = live.prefillMs(slot.backend.name, 1);
    const msPerToken = perToken ?? 0;
    // The floor the backend is planned on (the server it was granted on: a reload may have put
    // another under its name since).
    const floorMs = (slot.control.plan ?? this.#plan)?.floorMs ?? 0;
    const goneMs = gonePrefillMs(predicted, backendTtft, msPerToken * grant.cachedTokens, floorMs);
    if (goneMs !== null) this.#prefixJudged++;
    if (goneMs) this.#prefixGone++;
    const prefilledMs = msPerToken * grant.uncachedTokens + (goneMs ?? 0);
    if (predicted !== null) {
      const learnt = goneMs ? Math.max(predicted, floorMs) + goneMs : predicted;
      this.#ring.push(learnt, backendTtft, now);
      slot.control.ring.push(learnt, backendTtft, now);
    }
    // Without a prefill fit (a backend's first few first tokens), or with one whose own prompts
    // were all of about one size (a templated workload at a load where prefills do not overlap:
    // its rate is the fleet's, or next to 0 with its prefill in the intercept), the wait cannot be
    // told from the prefill: taken whole as waiting, a cold first request cut every new backend's
    // limit at once, and templated prompts cut it to its minimum while nothing waited.
    if (perToken !== null && live.prefillRateTold(slot.backend.name)) {
      slot.control.firstToken(backendTtft - prefilledMs, req.ttftTargetMs);
    }
    // The TTFT fit learns it now, not when the request ends a generation later; not of a server
    // a reload took away (the name may hold another server now).
    if (!retired(grant))
      live.recordFirstToken({
        backend: slot.backend.name,
        backendTtftMs: backendTtft,
        uncachedPromptTokens: grant.uncachedTokens + (goneMs ? goneMs / msPerToken : 0),
        prefillAheadTokens: grant.prefillAheadTokens,
        loadAtDispatch: grant.loadAtDispatch,
      });
    // Its prefill is done: prefill room may have opened for the next entry.
    this.pump();
  }

  /** Called by a slot when its attempt ended. */
  released(slot: GrantedSlot): void {
    slot.control.released(slot.waiting.req.tpotTargetMs);
    this.#releases++;
    this.pump();
  }

  /** A finished request's TPOT, for the outer loop of the backend that served it. */
  observeTpot(backend: string, tpotMs: number, targetMs: number): void {
    if (targetMs > 0) this.#controls.get(backend)?.completed(tpotMs / targetMs);
  }

  /**
   * The last check before a queued request is sent: with the chosen backend's state now, its first
   * token (taken at the P99 of how predictions turned out) would come after its target. The guard
   * timer judged it on the prediction made at arrival; the backend it gets may be slower than that
   * one was, and a request sent now would only miss and take a slot from one that can meet it.
   */
  #tooLate(w: Waiting, view: BackendView, waitMs: number | null = 0): boolean {
    if (view.predictedTtftMs === null) return false;
    // A wait nobody can predict yet (null) is not planned on, as in the slagate cost.
    const wait = waitMs ?? Number.POSITIVE_INFINITY;
    return (
      this.#now() + wait + this.upperBackendMs(view.name, view.predictedTtftMs) >
      w.req.arrivedAt + w.req.ttftBudgetMs
    );
  }

  #dropRetry(w: Waiting): void {
    const i = this.#retries.indexOf(w);
    if (i >= 0) this.#retries.splice(i, 1);
    w.state = 'removed';
  }

  #refusal(req: ScheduledRequest, code: 'queue_full' | 'queue_timeout', message?: string): GatewayError {
    // A full queue has room again only as the overload ends: its drain. A request that waited past
    // its start: once what waits ahead of it in the queue's order has left (a less urgent backlog
    // it passes is none of its wait).
    const wait = code === 'queue_full' ? this.drainMs(req.model) : this.estimateWaitMs(req);
    const retryAfterS = wait === null ? 1 : Math.min(60, Math.max(1, Math.ceil(wait / 1000)));
    const text =
      message ??
      (code === 'queue_full'
        ? 'The gateway queue is full.'
        : `The request could not be started within ${budgetWords(req)}.`);
    const err = new GatewayError(code, text, { retryAfterS });
    this.#deps.onRefused?.(req, err);
    return err;
  }

  // ---- the guard ----

  #armExpiry(): void {
    const next = this.#expiries.peek();
    if (next === undefined) {
      if (this.#expiryTimer !== null) clearTimeout(this.#expiryTimer);
      this.#expiryTimer = null;
      this.#expiryAt = Number.POSITIVE_INFINITY;
      return;
    }
    if (this.#expiryTimer !== null && next.expiresAt >= this.#expiryAt) return;
    if (this.#expiryTimer !== null) clearTimeout(this.#expiryTimer);
    this.#expiryAt = next.expiresAt;
    this.#expiryTimer = setTimeout(() => this.#expire(), Math.max(0, next.expiresAt - this.#now()));
    this.#expiryTimer.unref();
  }

  #expire(): void {
    this.#expiryTimer = null;
    this.#expiryAt = Number.POSITIVE_INFINITY;
    const now = this.#now();
    for (let w = this.#expiries.peek(); w !== undefined && w.expiresAt <= now; w = this.#expiries.peek()) {
      this.#expiries.pop();
      if (w.retry) {
        this.#dropRetry(w);
        w.settle(null);
      } else {
        this.#queue.remove(w);
        w.settle(null, this.#refusal(w.req, 'queue_timeout'));
      }
    }
    this.#armExpiry();
    // As after an abort: what the expired entries held closed is open to those behind them.
    this.pump();
  }

  // ---- the control loop ----

  #control(): void {
    const now = this.#now();
    const elapsedS = Math.max(1e-3, (now - this.#lastTick) / 1000);
    this.#lastTick = now;
    const rate = this.#releases / elapsedS;
    // Invariant: the rates at which slots free are learnt from periods that say something of them:
    // one in which a slot freed, or one in which a request waited for a slot that did not. A lull
    // frees none because little ran, not because slots free slowly: decayed by 0.7 in each period
    // (a peer's requests, or one long stream of this instance, running through it), a few seconds
    // left a rate near 0, and the burst after it was refused with a predicted wait of many seconds
    // for slots that were about to free.
    const waited =
      this.#queue.size + this.#retries.length > 0 ||
      this.#deps.backends().some((b) => this.#controlOf(b.name).blocked);
    const learn = this.#releases > 0 || waited;
    this.#releases = 0;
    if (learn) {
      this.#releaseRate =
        this.#releaseRate === null ? rate : this.#releaseRate + RATE_ALPHA * (rate - this.#releaseRate);
    }
    this.#plan = this.#ring.read(now);
    const settings = this.#deps.settings();
    const names = new Set<string>();
    const period = { now, elapsedS, looping: settings.policy !== 'fcfs', settings: settings.concurrency };
    for (const b of this.#deps.backends()) {
      names.add(b.name);
      this.#controlFor(b).period({ ...period, inflight: this.#deps.live.load(b.name) }, this.#deps.live);
    }
    for (const name of this.#controls.keys()) if (!names.has(name)) this.#controls.delete(name);
    // A limit may have grown, and queued entries may be waiting for exactly that.
    this.pump();
  }

  // ---- helpers ----

  #controlOf(name: string): BackendControl {
    let c = this.#controls.get(name);
    if (c === undefined) {
      c = new BackendControl(name, this.#deps.settings().concurrency);
      this.#controls.set(name, c);
    }
    return c;
  }

  /**
   * The control of backend `b`. Invariant: a control describes one server: a reload that gives a
   * name another URL puts another server under it, which starts from the initial limit and share
   * (as the live state starts its fits afresh); the old server's requests, still draining, keep the
   * control they were granted under.
   */
  #controlFor(b: Backend): BackendControl {
    let c = this.#controlOf(b.name);
    if (c.server !== null && c.server !== b) {
      this.#controls.delete(b.name);
      c = this.#controlOf(b.name);
    }
    c.server = b;
    return c;
  }

  /**
   * `name`'s limit, read within the bounds the settings give now. Invariant: every reader (the
   * room to dispatch, the binding test, /admin/state and the limit gauge) sees this one value, so a
   * reload that moves the bounds takes effect at its own pump, not at the next control period.
   */
  #limitOf(name: string): number {
    return Math.floor(this.limit(name));
  }

  /** Slots free under `name`'s limit. */
  #room(name: string): number {
    return this.#limitOf(name) - this.#deps.live.load(name);
  }

  #totalRoom(): number {
    let free = 0;
    for (const b of this.#deps.backends()) if (b.available) free += Math.max(0, this.#room(b.name));
    return free;
  }

  /**
   * The queue of the configured order (policy, aging_ms, class priorities); a reload that changes
   * it moves the waiting entries to a new queue (at the reload's pump, or the first request after
   * it). Invariant: every entry's key is the one the order in force gives it: a moved entry is keyed
   * again, from the time of its first ask, as if it had waited in the new queue all along (an fcfs
   * key has no priority term, and a slagate key puts a lower class behind its aging), and each
   * tenant keeps its work counter (SlagateQueue.carry). Otherwise a
   * class a reload made urgent would wait out its old aging offset behind the classes it now
   * precedes, and an aging_ms made shorter would let the class's new entries pass its old ones.
   */
  #discipline(settings: SchedulerSettings): QueueDiscipline {
    // The settings are one object per configuration: compared again only after a reload.
    if (settings === this.#orderedBy) return this.#queue;
    this.#orderedBy = settings;
    if (this.#queue.ordersAs(settings)) return this.#queue;
    const old = this.#queue;
    const queue = this.#makeQueue(settings);
    this.#queue = queue;
    // Read before the move: taking the entries out charges their tenants as if they were served.
    const counters = old instanceof SlagateQueue ? old.counters() : null;
    const moving: Waiting[] = [];
    old.scan((e) => {
      moving.push(e as Waiting);
      return 'take';
    });
    for (const e of moving) {
      e.state = 'queued';
      e.key = queue.keyFor(e.req, e.ticket.firstAskedAt(e.queuedAt));
      queue.push(e);
    }
    // What each tenant has been served stays (a reload to fcfs and back starts them afresh).
    if (counters !== null && queue instanceof SlagateQueue) queue.carry(counters);
    return queue;
  }

  #makeQueue(order: QueueOrder): QueueDiscipline {
    return order.policy === 'fcfs' ? new FifoQueue() : new SlagateQueue(order);
  }
}

/** A request may wait in the queue: it did not ask not to (x-slagate-no-queue), and the gateway queues (max_queue > 0). */
function mayWait(noQueue: boolean, settings: SchedulerSettings): boolean {
  return !noQueue && settings.maxQueue > 0;
}

/** Some available backend does not serve `model`: a fleet of several models, as `model` sees it. */
function someServeOthers(backends: readonly Backend[], model: string): boolean {
  return backends.some((b) => b.available && !b.serves(model));
}

/**
 * Some backend of `backends` is usable (available, or will be once its breaker's trial ends), is
 * not one the request was given already, and serves `model` or will once its models are known
 * (mayServe).
 */
function anyUsable(backends: readonly Backend[], excluded: ReadonlySet<string>, model: string): boolean {
  for (const b of backends) if (b.usable && !excluded.has(b.name) && b.mayServe(model)) return true;
  return false;
}

/** A reload took the grant's server away: what its request shows is not about the server under the name now. */
export function retired(grant: Grant): boolean {
  return grant.server.state === 'removed';
}

/** One request's scheduling context: the attempts it has been granted. */
export class Ticket {
  readonly req: ScheduledRequest;
  readonly grants: Grant[] = [];
  readonly #scheduler: Scheduler;

  constructor(scheduler: Scheduler, req: ScheduledRequest) {
    this.#scheduler = scheduler;
    this.req = req;
  }

  /** The AcquireSlot the attempt loop calls. */
  readonly acquire = (sr: SlotRequest): Promise<Slot | null> => this.#scheduler.enqueue(this, sr);

  #firstAskedAt: number | null = null;

  /** When the request first asked for a slot (`now` on its first ask). */
  firstAskedAt(now: number): number {
    this.#firstAskedAt ??= now;
    return this.#firstAskedAt;
  }

  /** The last grant (the attempt that served, when one did). */
  get lastGrant(): Grant | null {
    return this.grants.at(-1) ?? null;
  }

  /** A completed request's TPOT on its backend: the outer loop's sample (none of a retired server). */
  completed(backend: string, tpotMs: number): void {
    const grant = this.lastGrant;
    if (grant !== null && retired(grant)) return;
    this.#scheduler.observeTpot(backend, tpotMs, this.req.tpotTargetMs);
  }
}

class GrantedSlot implements Slot {
  readonly backend: Backend;
  readonly predictedTtftMs: number | null;
  readonly prefixHit: number | null;
  readonly firstTokenTimeoutMs: number;
  readonly meter: DecodeMeter;
  readonly grant: Grant;
  readonly waiting: Waiting;
  readonly control: BackendControl;
  /** The live state's prediction of dispatch to first token at grant time; null without a fit. */
  readonly predictedBackendMs: number | null;
  readonly #scheduler: Scheduler;
  readonly #lease: Lease;
  #firstToken = false;
  #released = false;
  /** expectNoFirstToken()'s timer, while it runs. */
  #presumed: NodeJS.Timeout | null = null;
  /** The half-open breaker's trial this slot holds (Backend.takeTrial), or null. */
  readonly #trial: object | null;

  constructor(
    scheduler: Scheduler,
    backend: Backend,
    lease: Lease,
    grant: Grant,
    waiting: Waiting,
    control: BackendControl,
    firstTokenTimeoutMs: number,
    predictedBackendMs: number | null,
    trial: object | null,
  ) {
    this.predictedBackendMs = predictedBackendMs;
    this.#trial = trial;
    this.#scheduler = scheduler;
    this.backend = backend;
    this.#lease = lease;
    this.grant = grant;
    this.waiting = waiting;
    this.control = control;
    this.meter = control.meter;
    this.firstTokenTimeoutMs = firstTokenTimeoutMs;
    this.predictedTtftMs = waiting.req.predictions.get(backend.name)?.totalMs ?? null;
    this.prefixHit = grant.prefixHit;
  }

  prefillDone(): void {
    if (this.#endPrefill()) this.#scheduler.firstToken(this);
  }

  expectNoFirstToken(): void {
    if (this.#firstToken || this.#released || this.#presumed !== null) return;
    const ms = this.predictedBackendMs ?? this.firstTokenTimeoutMs;
    this.#presumed = setTimeout(
      () => {
        this.#presumed = null;
        // No sample to learn from; prefill room may have opened for the next entry.
        if (this.#endPrefill()) this.#scheduler.pump();
      },
      Math.max(0, ms),
    );
    this.#presumed.unref();
  }

  /** The prefill stops counting as pending; false when it already had (or the slot is released). */
  #endPrefill(): boolean {
    if (this.#firstToken || this.#released) return false;
    this.#firstToken = true;
    this.#lease.prefillDone();
    if (this.grant.seed) this.#scheduler.seedEnded(this.backend.name);
    return true;
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    if (!this.#firstToken && this.grant.seed) this.#scheduler.seedEnded(this.backend.name);
    if (this.#presumed !== null) clearTimeout(this.#presumed);
    this.#presumed = null;
    this.#lease.end();
    if (this.#trial !== null) this.backend.returnTrial(this.#trial);
    this.#scheduler.released(this);
  }
}
