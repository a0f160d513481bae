// Everything one gateway instance knows about one backend from its OWN traffic: in-flight leases,
// per-class sliding windows and the two rate fits. Peers' data is kept apart (RemoteBackend) and
// only added at read time, so local data is never lost or double-counted when a sync fails.

import { DecayingFit, FitStats } from './fit.ts';
import { type InflightCounts, zeroCounts } from './leases.ts';
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

export class BackendState {
  readonly inflight: InflightCounts;
  readonly windows = new Map<string, SlidingWindow>();
  readonly ttftFit: DecayingFit;
  readonly tpotFit: DecayingFit;
  /** Bumped by every finished request (the windows); keys the façade's latency view cache. */
  version = 0;
  /** Bumped by every sample either fit learns; keys the façade's fit cache (leases are never cached). */
  fitVersion = 0;

  constructor(
    readonly name: string,
    private readonly shape: WindowShape,
    fitHalfLifeMs: number,
    /** The counts open leases still decrement (a backend removed and added back while they ran). */
    inflight: InflightCounts = zeroCounts(),
  ) {
    this.inflight = inflight;
    this.ttftFit = new DecayingFit(TTFT_FEATURES, fitHalfLifeMs);
    this.tpotFit = new DecayingFit(TPOT_FEATURES, fitHalfLifeMs);
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

/** The sum of every live peer's snapshot for one backend. */
export class RemoteBackend {
  readonly inflight: InflightCounts = zeroCounts();
  readonly classes = new Map<string, WindowTotals>();
  readonly ttft = new FitStats(TTFT_FEATURES);
  readonly tpot = new FitStats(TPOT_FEATURES);

  classTotals(cls: string): WindowTotals | undefined {
    let t = this.classes.get(cls);
    if (t === undefined && this.classes.size < MAX_CLASSES) {
      t = emptyTotals();
      this.classes.set(cls, t);
    }
    return t;
  }
}
