// Which backend holds which prompt blocks: learnt from dispatch decisions (a request's blocks are
// inserted on the backend it is sent to, at once, so a burst of one prefix does not all miss while
// the first of them is prefilled) and aged out least-recently-used, within a capacity per backend
// (its KV cache in blocks, as vLLM reports it). An estimate of what vLLM's prefix cache holds,
// never a copy of it: vLLM evicts only blocks no running request uses, and may evict sooner.
//
// Invariants:
// - per backend, at most `capacity(backend)` hashes are held; inserting past it evicts the least
//   recently inserted or matched ones, so memory is bounded whatever the traffic;
// - a request's blocks are touched from the last to the first, so a prompt's leading blocks are
//   always at least as recent as its later ones: what a backend holds of one chain is (nearly
//   always) a prefix of it, and the longest match is found by bisection, O(log n) lookups;
// - lookups never allocate per block, and never touch (matching is not use: only dispatch is).

/** Hashes a backend's LRU holds when vLLM has not told us its KV size yet (~16k blocks). */
export const DEFAULT_CAPACITY = 16_384;

export class PrefixIndex {
  readonly #backends = new Map<string, Map<number, true>>();
  readonly #capacity: (backend: string) => number;
  /** Hashes inserted since the last drain, per backend (what this instance tells its peers). */
  readonly #recent = new Map<string, number[]>();
  #recording = false;

  constructor(capacity: (backend: string) => number = () => DEFAULT_CAPACITY) {
    this.#capacity = capacity;
  }

  /** Keep a copy of what this instance inserts until drainRecent() (for sharing with peers). */
  record(on: boolean): void {
    this.#recording = on;
    if (!on) this.#recent.clear();
  }

  /** The request's blocks are on `backend` now (it was just sent there). */
  insert(backend: string, hashes: readonly number[]): void {
    this.#insert(backend, hashes, this.#recording);
  }

  /** A peer sent these blocks to `backend`. */
  insertPeer(backend: string, hashes: readonly number[]): void {
    this.#insert(backend, hashes, false);
  }

  /** Leading blocks of `hashes` that `backend` holds. */
  match(backend: string, hashes: readonly number[]): number {
    const lru = this.#backends.get(backend);
    if (lru === undefined || hashes.length === 0 || !lru.has(hashes[0]!)) return 0;
    // Bisection on the prefix property: `lo` blocks are held, `hi` is not.
    let lo = 1;
    let hi = hashes.length + 1;
    if (lru.has(hashes[hashes.length - 1]!)) return hashes.length;
    hi = hashes.length;
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1;
      if (lru.has(hashes[mid - 1]!)) lo = mid;
      else hi = mid;
    }
    return lo;
  }

  size(backend: string): number {
    return this.#backends.get(backend)?.size ?? 0;
  }

  /** Forget a backend (removed on reload). */
  drop(backend: string): void {
    this.#backends.delete(backend);
    this.#recent.delete(backend);
  }

  /** What was inserted here since the last call, per backend; empties it. */
  drainRecent(): Map<string, number[]> {
    const out = new Map(this.#recent);
    this.#recent.clear();
    return out;
  }

  #insert(backend: string, hashes: readonly number[], record: boolean): void {
    if (hashes.length === 0) return;
    let lru = this.#backends.get(backend);
    if (lru === undefined) {
      lru = new Map();
      this.#backends.set(backend, lru);
    }
    // Last to first: the leading blocks end up the most recent (see the invariants).
    let firstNew = -1;
    for (let i = hashes.length - 1; i >= 0; i--) {
      const h = hashes[i]!;
      if (!lru.delete(h)) firstNew = i;
      lru.set(h, true);
    }
    // Peers get the chain from its first block new here, in order, so they touch it as we did
    // (blocks held already stay out: a shared system prompt is told once, not per request).
    if (record && firstNew >= 0) {
      let fresh = this.#recent.get(backend);
      if (fresh === undefined) {
        fresh = [];
        this.#recent.set(backend, fresh);
      }
      for (let i = firstNew; i < hashes.length; i++) fresh.push(hashes[i]!);
    }
    const cap = Math.max(1, this.#capacity(backend));
    if (lru.size > cap) {
      let over = lru.size - cap;
      for (const h of lru.keys()) {
        if (over-- <= 0) break;
        lru.delete(h);
      }
    }
  }
}
