// One backend's closed loop, as this gateway instance runs it: the state the concurrency limit is
// learnt from (token gaps, first tokens, completions, slots freed) and the period step that moves
// the limit and the outer loop's tpot_share. controller.ts holds the pure rules it applies; the
// scheduler owns one BackendControl per backend name, feeds it from the slots it grants, and steps
// every control interval (src/scheduler/README.md, "Concurrency limits (the control law)").
//
//   grant ─▶ granted(tpot target)          first token ─▶ firstToken(wait, TTFT target)
//   slot ends ─▶ released(tpot target)      completion ─▶ completed(TPOT ÷ target)
//   every interval ─▶ period(): signals of the last SIGNAL_PERIODS periods ─▶ nextLimit;
//                     each outer_periods ─▶ nextTpotShare
import type { LiveState } from '../state/index.ts';
import { type Backend, DecodeMeter, gapStats } from '../upstream/index.ts';
import { type LimitBounds, nextLimit, nextTpotShare, quantile, type Setpoints } from './controller.ts';
import { MIN_BACKEND_RATIO_SAMPLES, type Plan, PlanRing, RATIO_SAMPLES, RATIO_WINDOW_MS } from './plan.ts';

/** Fewest gaps, and first tokens, over the recent periods (SIGNAL_PERIODS) for the controller to act. */
const MIN_GAPS = 16;
const MIN_FIRST_TOKENS = 8;

/** First tokens of one target for a P90 of its own: 20, so that its P90 is not its maximum. */
const MIN_TARGET_FIRST_TOKENS = 20;

/**
 * The TTFT signal: the P90, over recent first tokens, of the waiting beyond `steps` as a share of
 * each one's class target; null with fewer than MIN_FIRST_TOKENS. Invariant: a target of few first
 * tokens among many of a laxer one is not lost in the pool: the signal is the largest of the pool's
 * P90 and each target's own P90 (a target with MIN_TARGET_FIRST_TOKENS first tokens). Pooled alone,
 * a backend serving 95% batch (30 s) and 5% interactive (500 ms) first tokens took its P90 from the
 * batch ones, and a second of waiting inside the backend, eight times what the interactive class may
 * wait there, read as a thirtieth of the share.
 */
function waitingShare(
  firstTokens: readonly { waitMs: number; targetMs: number }[],
  steps: number,
): number | null {
  if (firstTokens.length < MIN_FIRST_TOKENS) return null;
  const byTarget = new Map<number, number[]>();
  for (const f of firstTokens) {
    const share = Math.max(0, f.waitMs - steps) / f.targetMs;
    const list = byTarget.get(f.targetMs);
    if (list === undefined) byTarget.set(f.targetMs, [share]);
    else list.push(share);
  }
  const pooled: number[] = [];
  let worst = 0;
  for (const shares of byTarget.values()) {
    for (const x of shares) pooled.push(x);
    if (shares.length >= MIN_TARGET_FIRST_TOKENS) worst = Math.max(worst, quantile(shares, 0.9));
  }
  return Math.max(worst, quantile(pooled, 0.9));
}
/**
 * Periods both signals are taken over: a few decode steps and first tokens per period are too
 * few for a steady median or a p90. Decreases step from the running batch, so this lag does not
 * make them compound.
 */
const SIGNAL_PERIODS = 4;
/** Completed requests the outer loop needs in its window before it moves tpot_share. */
const MIN_OUTER_SAMPLES = 50;
/** Outer periods the TPOT window spans at least: a P99 of one period's completions is too noisy. */
const OUTER_WINDOW = 4;
/** Outer periods the TPOT window may reach back to gather MIN_OUTER_SAMPLES (2 minutes at the defaults). */
const OUTER_WINDOW_MAX = 24;
/**
 * A period counts as TPOT-bound when the backend was at its limit with an error of at least this:
 * only then does the measured TPOT say anything about what a higher share would cost.
 */
const TPOT_BOUND_ERROR = 0.8;
/** Samples one period keeps, of first tokens and of completions. */
const SAMPLE_CAP = 4096;
/** Smoothing of the release rates (the fleet's and each backend's), per control period. */
export const RATE_ALPHA = 0.3;

/** The concurrency settings a period reads (SchedulerSettings.concurrency). */
export interface ControlSettings extends LimitBounds {
  initial: number;
  tpotShare: number;
  ttftShare: number;
  outerPeriods: number;
}

/** What one control period is stepped with. */
export interface ControlPeriod {
  now: number;
  /** Seconds since the last period. */
  elapsedS: number;
  /** The requests the backend runs now, every gateway instance's. */
  inflight: number;
  /** fcfs runs no loop: the limit is `initial`. */
  looping: boolean;
  settings: ControlSettings;
}

export class BackendControl {
  readonly name: string;
  /** The server it was learnt on (null until a grant or a control step saw it). */
  server: Backend | null = null;
  #limit: number;
  /** This instance's own evidence set the limit (not `initial`, not a reload's clamp, not a peer's limit it followed). */
  #limitOwn = false;
  /** Control periods in a row without a signal. */
  #lapsed = 0;
  #tpotShare: number;
  /** Token gaps of the period under way (the slots granted here add to it). */
  readonly meter = new DecodeMeter();
  /** Token gaps of the last SIGNAL_PERIODS periods, a ring: `#gapsAt` is the oldest. */
  readonly #gaps = Array.from({ length: SIGNAL_PERIODS }, () => new DecodeMeter());
  /** The requests the backend ran in each of those periods (the mean of its two ends), the same ring. */
  readonly #batches = new Array<number>(SIGNAL_PERIODS).fill(0);
  #gapsAt = 0;
  /** The requests the backend ran at the end of the last period (null before the first). */
  #lastInflight: number | null = null;
  /**
   * First tokens of the last few periods (the newest last): the wait from dispatch to first token
   * minus the request's own predicted prefill, and the request's TTFT target.
   */
  readonly #firstTokens: { waitMs: number; targetMs: number }[][] = [[]];
  /** TPOT ÷ target of completed requests, one array per outer period (the newest last; see trimOuterWindow). */
  #tpotRatios: number[][] = [[]];
  /** Inner periods of the current outer period in which the backend was bound by its limit near the setpoint. */
  #boundPeriods = 0;
  /** TPOT targets of the slots held on the backend now, with their counts (the tightest is controlled). */
  readonly #targets = new Map<number, number>();
  /** A request waited for this backend at its limit in this period. */
  #blocked = false;
  #error: number | null = null;
  #periods = 0;
  /** Slots this instance freed on the backend since the last period, and their rate (smoothed, per second). */
  #releases = 0;
  #releaseRate: number | null = null;
  /** How its own predictions of dispatch to first token turned out, and the plan read from them. */
  readonly ring = new PlanRing(RATIO_SAMPLES, MIN_BACKEND_RATIO_SAMPLES, RATIO_WINDOW_MS);
  #plan: Plan | null = null;

  constructor(name: string, settings: ControlSettings) {
    this.name = name;
    this.#limit = settings.initial;
    this.#tpotShare = settings.tpotShare;
  }

  /** The loop's own limit, which moves in fractions, read within `bounds`. */
  limit(bounds: LimitBounds): number {
    return Math.min(bounds.max, Math.max(bounds.min, this.#limit));
  }

  /** The last period's error (1 = at the setpoint); null before any signal, and under fcfs. */
  get error(): number | null {
    return this.#error;
  }

  get tpotShare(): number {
    return this.#tpotShare;
  }

  /** Slots this instance frees here per second (smoothed); null while unmeasured. */
  get releaseRate(): number | null {
    return this.#releaseRate;
  }

  /** The plan its own ring gave at the last period; null while too few of its own came in the window. */
  get plan(): Plan | null {
    return this.#plan;
  }

  /** A request waited for this backend at its limit in this period. */
  get blocked(): boolean {
    return this.#blocked;
  }

  /** A request waited for this backend while it had no room. */
  block(): void {
    this.#blocked = true;
  }

  /** A slot of TPOT target `tpotTargetMs` was granted here. */
  granted(tpotTargetMs: number): void {
    this.#targets.set(tpotTargetMs, (this.#targets.get(tpotTargetMs) ?? 0) + 1);
  }

  /** A slot granted here ended. */
  released(tpotTargetMs: number): void {
    const n = (this.#targets.get(tpotTargetMs) ?? 1) - 1;
    if (n > 0) this.#targets.set(tpotTargetMs, n);
    else this.#targets.delete(tpotTargetMs);
    this.#releases++;
  }

  /** A first token's wait beyond its own prefill, for the TTFT signal. */
  firstToken(waitMs: number, targetMs: number): void {
    const current = this.#firstTokens.at(-1);
    if (current !== undefined && current.length < SAMPLE_CAP) current.push({ waitMs, targetMs });
  }

  /** A completed request's TPOT ÷ its target, for the outer loop. */
  completed(tpotRatio: number): void {
    const period = this.#tpotRatios.at(-1);
    if (period !== undefined && period.length < SAMPLE_CAP) period.push(tpotRatio);
  }

  /**
   * One control period. `live` tells the limits peers' evidence set and takes the one this
   * instance's own evidence sets.
   */
  period(p: ControlPeriod, live: Pick<LiveState, 'peersLimit' | 'shareLimit'>): void {
    const { now, elapsedS, inflight, settings: cc } = p;
    // Its own only from enough of its own in the window: a backend whose traffic fell off would
    // otherwise plan, long after, on the last 100 it had, a burst of late ones included (a
    // restart at the same URL keeps its control), where the fleet's window holds fresh ones.
    const own = this.ring.read(now);
    this.#plan = own !== null && own.inWindow >= MIN_BACKEND_RATIO_SAMPLES ? own : null;
    const freed = this.#releases / elapsedS;
    if (this.#releases > 0 || this.#blocked) {
      this.#releaseRate =
        this.#releaseRate === null ? freed : this.#releaseRate + RATE_ALPHA * (freed - this.#releaseRate);
    }
    this.#releases = 0;
    // This period's gaps, and the batch they were measured on, replace the oldest period's.
    this.meter.drainInto(this.#gaps[this.#gapsAt] as DecodeMeter);
    this.#batches[this.#gapsAt] = ((this.#lastInflight ?? inflight) + inflight) / 2;
    this.#lastInflight = inflight;
    this.#gapsAt = (this.#gapsAt + 1) % SIGNAL_PERIODS;
    if (!p.looping) {
      this.#limit = cc.initial;
      this.#limitOwn = false;
      // Nothing measured it: not a limit for the peers to follow.
      live.shareLimit(this.name, null);
      // No outer loop runs: completions from a fixed limit must not wait in its window for a
      // reload to slagate, to be judged then as if they came from its loop.
      this.#tpotRatios = [[]];
      this.#periods = 0;
      this.#boundPeriods = 0;
      // Nothing measures an error against a setpoint here: the last loop's would read as current.
      this.#error = null;
    } else {
      this.#step(p, live);
    }
    // A new period's first tokens; the oldest period leaves the p90 window.
    this.#firstTokens.push([]);
    if (this.#firstTokens.length > SIGNAL_PERIODS) this.#firstTokens.shift();
    this.#blocked = false;
  }

  /** A period of the loop (slagate): the limit from the signals, then the outer loop's share. */
  #step(p: ControlPeriod, live: Pick<LiveState, 'peersLimit' | 'shareLimit'>): void {
    const { inflight, settings: cc } = p;
    // The median gap over the last few periods (controller.ts says why it leads, and why the
    // mean still bounds it): one period holds only a few decode steps.
    const stats = gapStats(this.#gaps);
    const pace = stats !== null && stats.count >= MIN_GAPS ? stats : null;
    const itlMs = pace?.medianMs ?? null;
    const meanItlMs = pace?.meanMs ?? null;
    // Every first token waits for the decode step under way and then its own: the waiting
    // beyond those two steps is what a lower limit can take away. The steps are the window's
    // own, however few its gaps (a few are still this batch's steps), and none without a gap
    // (nothing decoding, no step to wait for). Invariant: no gap from a batch that has left
    // is taken off today's waits (a gap kept from a large batch's chat, once its traffic
    // turned to one-token answers, hid 90 ms of every first token's wait from the loop).
    const steps = 2 * (stats?.medianMs ?? 0);
    const ttftQueueShare = waitingShare(this.#firstTokens.flat(), steps);
    const setpoints: Setpoints = { tpotShare: this.#tpotShare, ttftShare: cc.ttftShare };
    const binding = this.#blocked || inflight >= Math.floor(this.limit(cc));
    const step = nextLimit(
      this.#limit,
      inflight,
      {
        itlMs,
        meanItlMs,
        tpotTargetMs: tightest(this.#targets),
        ttftQueueShare,
        binding,
        batch: signalBatch(this.#gaps, this.#batches),
      },
      setpoints,
      cc,
    );
    // A limit a reload's bounds clamp is not moved by evidence.
    const held = this.limit(cc);
    if (step.error !== null && step.limit !== held) this.#limitOwn = true;
    this.#lapsed = step.error === null ? this.#lapsed + 1 : 0;
    this.#limit = step.limit;
    this.#error = step.error;
    // Invariant: an instance without evidence of its own follows the instances with it. Every
    // instance's room on a backend is its own limit less the load of all of them, and its loop
    // learns only from what it sent there: one whose limit is below the load the others keep
    // there (it started, or restarted in a rolling deploy, at `initial`) was granted nothing,
    // so it measured nothing, and its limit never moved; its requests waited and were refused
    // while the backend ran at the others' limit. So a period with no signal, in an instance
    // whose own evidence set nothing (or set it more than the signal's window ago), takes the
    // lowest limit a peer's current evidence set; while it has nothing of its own running there,
    // with room for one more request than the backend runs, so that it has a slot to learn from
    // (following a lower limit set for a tighter target would otherwise lock it out the same
    // way), and only that one (followers each adding one a period would push the load up
    // together). A limit is told to the peers only while this instance's own evidence sets it,
    // this period: a follower telling what it followed, a limit held on a signal that moved
    // nothing, or one an idle instance set long ago, would hold the others to it; and an instance
    // whose own evidence set its limit holds it through a short lapse of its signal.
    if (step.error === null && (!this.#limitOwn || this.#lapsed >= SIGNAL_PERIODS)) {
      const peers = live.peersLimit(this.name);
      if (peers !== null) {
        let own = 0;
        for (const n of this.#targets.values()) own += n;
        const followed = own > 0 ? peers : Math.max(peers, inflight + 1);
        this.#limit = Math.min(cc.max, Math.max(cc.min, followed));
        this.#limitOwn = false;
      }
    }
    live.shareLimit(this.name, this.#limitOwn && step.error !== null ? this.#limit : null);
    if (binding && step.error !== null && step.error >= TPOT_BOUND_ERROR) this.#boundPeriods++;
    if (++this.#periods >= cc.outerPeriods) this.#outerStep(cc.outerPeriods);
  }

  /**
   * The outer loop: tpot_share moves toward the share at which the P99 TPOT of the requests the
   * backend completed sits at the outer target. Invariant: the share rises only when the backend
   * spent most of the outer period bound by its limit near the setpoint. Completions lag their
   * decode by a whole output, so while load ramps up they report the lighter batches before it;
   * a share raised on that evidence would let the batch grow past its TPOT target.
   */
  #outerStep(period: number): void {
    const ratios = this.#tpotRatios.flat();
    if (ratios.length >= MIN_OUTER_SAMPLES) {
      // Invariant: a completion moves the share about as much whatever the window's length. The
      // window holds each outer period for OUTER_WINDOW steps when completions are plentiful, and
      // for as many as this.#tpotRatios.length when it reaches back: a slow request on a backend that
      // completes few (its P99 is then the window's maximum) would otherwise pull the share down
      // at every one of up to 24 steps, where a busy backend's would count in four.
      const weight = Math.min(1, OUTER_WINDOW / this.#tpotRatios.length);
      const next = nextTpotShare(this.#tpotShare, quantile(ratios, 0.99), weight);
      if (next < this.#tpotShare || 2 * this.#boundPeriods >= period) this.#tpotShare = next;
    }
    this.#periods = 0;
    this.#boundPeriods = 0;
    this.#tpotRatios.push([]);
    trimOuterWindow(this.#tpotRatios);
  }
}

/**
 * Keeps the outer loop's window (one array of TPOT ratios per outer period, the newest last): the
 * newest OUTER_WINDOW periods, and older ones only while the newer ones hold fewer than
 * MIN_OUTER_SAMPLES completions, up to OUTER_WINDOW_MAX. Invariant: a backend that completes few
 * requests (long outputs, or many backends sharing a modest load: at 2.5 a second, four periods
 * of 5 s held 50 completions only now and then) still gathers the samples its P99 needs, from as
 * little of the past as gives them; one that completes many is judged on the last four periods.
 */
function trimOuterWindow(periods: number[][]): void {
  let newer = 0;
  for (let i = 1; i < periods.length; i++) newer += (periods[i] as number[]).length;
  while (periods.length > OUTER_WINDOW && (periods.length > OUTER_WINDOW_MAX || newer >= MIN_OUTER_SAMPLES)) {
    periods.shift();
    newer -= (periods[0] as number[]).length;
  }
}

/**
 * The batch the window's token gaps were measured on: each period's requests weighted by the gaps
 * it measured (a gap is one sequence's, so a period of a large batch speaks for more of them);
 * null when the window holds no gap.
 */
function signalBatch(gaps: readonly DecodeMeter[], batches: readonly number[]): number | null {
  let count = 0;
  let weighted = 0;
  for (let k = 0; k < SIGNAL_PERIODS; k++) {
    const n = (gaps[k] as DecodeMeter).gaps;
    count += n;
    weighted += n * (batches[k] as number);
  }
  return count === 0 ? null : weighted / count;
}

/** The tightest of the targets held (Infinity when none: no TPOT signal is judged then). */
function tightest(targets: ReadonlyMap<number, number>): number {
  let min = Number.POSITIVE_INFINITY;
  for (const t of targets.keys()) if (t < min) min = t;
  return min;
}
