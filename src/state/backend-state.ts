// Everything one gateway instance knows about one backend from its OWN traffic: in-flight leases,
// per-class sliding windows and the two rate fits. Peers' data is kept apart (RemoteBackend) and
// only added at read time, so local data is never lost or double-counted when a sync fails.

import { DecayingFit, FitStats } from './fit.ts';
import { type InflightCounts, type PrefillListener, zeroCounts } from './leases.ts';
import { PrefillBacklog } from './prefill-backlog.ts';
import { emptyTotals, SlidingWindow, type WindowTotals } from './window.ts';

/** TTFT-after-queue fit features: [uncached prompt tokens, load]. */
export const TTFT_FEATURES = 2;
/** TPOT fit features: [load]. */
export const TPOT_FEATURES = 1;
/** A backend tracks at most this many classes, so a bad class label cannot grow memory. */
export const MAX_CLASSES = 64;

export interface WindowShape {
  bucketMs: number;
  buckets: number;
}

/** A backend's in-flight counts and the backlog their prefill drains from: carried together. */
export interface Inflight {
  readonly counts: InflightCounts;
  /** What this instance's leases on the backend tell the backlog. */
  readonly listener: PrefillListener;
  /** The backlog now, drained at `msPerToken`: this instance's prefill still ahead on the backend. */
  ahead(msPerToken: number | null): number;
  /** Drains the backlog up to now at `msPerToken`, the rate that held until now. */
  catchUp(msPerToken: number | null): void;
}

export class BackendState {
  readonly inflight: InflightCounts;
  /** This instance's in-flight leases' prefill as it drains; `prefill` is what they tell it. */
  readonly #carried: Inflight;
  readonly prefill: PrefillListener;
  readonly windows = new Map<string, SlidingWindow>();
  readonly ttftFit: DecayingFit;
  readonly tpotFit: DecayingFit;
  /** Bumped by every finished request (the windows); keys the façade's latency view cache. */
  version = 0;
  /** Bumped by every sample either fit learns; keys the façade's fit cache (leases are never cached). */
  fitVersion = 0;
  /** This instance's concurrency limit for the backend, told to the peers with its in-flight part (null: none set). */
  limit: number | null = null;

  constructor(
    readonly name: string,
    private readonly shape: WindowShape,
    fitHalfLifeMs: number,
    /**
     * Fresh (newInflight), or the counts and backlog that open leases still update (a backend
     * removed and added back while they ran).
     */
    inflight: Inflight,
  ) {
    this.inflight = inflight.counts;
    this.#carried = inflight;
    this.prefill = inflight.listener;
    this.ttftFit = new DecayingFit(TTFT_FEATURES, fitHalfLifeMs);
    this.tpotFit = new DecayingFit(TPOT_FEATURES, fitHalfLifeMs);
  }

  /** What a backend added back while these leases run must keep updating. */
  carry(): Inflight {
    return this.#carried;
  }

  /** This instance's prefill still ahead on the backend now, at the fit's `msPerToken` (prefill-backlog.ts). */
  prefillAhead(msPerToken: number | null): number {
    return this.#carried.ahead(msPerToken);
  }

  /** Drains this instance's prefill backlog up to now at `msPerToken`, before its rate changes. */
  catchUpPrefill(msPerToken: number | null): void {
    this.#carried.catchUp(msPerToken);
  }

  /** The class's window, created on first use; undefined past MAX_CLASSES. */
  window(cls: string): SlidingWindow | undefined {
    let w = this.windows.get(cls);
    if (w === undefined && this.windows.size < MAX_CLASSES) {
      w = new SlidingWindow(this.shape.bucketMs, this.shape.buckets);
      this.windows.set(cls, w);
    }
    return w;
  }
}

/**
 * The sum of every live peer's snapshot for one backend: the in-flight part (replaced at each
 * exchange) and the full one (windows and fits, replaced when the full snapshots are).
 */
export class RemoteBackend {
  readonly inflight: InflightCounts = zeroCounts();
  /** The peers' prefill still ahead on the backend, as their in-flight parts had it. */
  prefillAhead = 0;
  /** The lowest concurrency limit a peer's in-flight part gave for the backend (null: none did). */
  peerLimit: number | null = null;
  readonly classes = new Map<string, WindowTotals>();
  readonly ttft = new FitStats(TTFT_FEATURES);
  readonly tpot = new FitStats(TPOT_FEATURES);

  /** Forgets the in-flight part, before the next one is summed in. */
  clearInflight(): void {
    this.inflight.requests = 0;
    this.inflight.promptTokens = 0;
    this.inflight.expectedOutputTokens = 0;
    this.inflight.pendingPrefillTokens = 0;
    this.prefillAhead = 0;
    this.peerLimit = null;
  }

  classTotals(cls: string): WindowTotals | undefined {
    let t = this.classes.get(cls);
    if (t === undefined && this.classes.size < MAX_CLASSES) {
      t = emptyTotals();
      this.classes.set(cls, t);
    }
    return t;
  }
}

/**
 * Fresh counts, with a backlog told of every lease's prefill as the counts change, drained at
 * `msPerToken()` (the backend's TTFT fit) on the clock `now`.
 */
export function newInflight(now: () => number, msPerToken: () => number | null): Inflight {
  const counts = zeroCounts();
  const backlog = new PrefillBacklog();
  const catchUp = (rate: number | null) => backlog.settle(counts.pendingPrefillTokens, now(), rate);
  return {
    counts,
    listener: {
      dispatched: (tokens) => backlog.add(tokens, now(), msPerToken()),
      // A request's prefill ended: the same step as a catch-up, at the rate that holds now.
      settled: () => catchUp(msPerToken()),
    },
    ahead: (rate) => backlog.ahead(counts.pendingPrefillTokens, now(), rate),
    catchUp,
  };
}
