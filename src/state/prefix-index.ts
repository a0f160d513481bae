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
// - lookups never allocate per block, and never touch (matching is not use: only dispatch is);
// - every operation is O(1) per block: recency is an intrusive list over slot arrays, so touching
//   a held block never deletes and re-adds a map entry, and eviction never iterates a map (a
//   map's iteration walks the holes its deletions leave: hundreds of microseconds per grant).

/** Hashes a backend's LRU holds when vLLM has not told us its KV size yet (~16k blocks). */
export const DEFAULT_CAPACITY = 16_384;

export class PrefixIndex {
  readonly #backends = new Map<string, Lru>();
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
      lru = new Lru();
      this.#backends.set(backend, lru);
    }
    let firstNew = -1;
    for (let i = hashes.length - 1; i >= 0; i--) if (lru.touch(hashes[i]!)) firstNew = i;
    if (record && firstNew >= 0) {
      let fresh = this.#recent.get(backend);
      if (fresh === undefined) {
        fresh = [];
        this.#recent.set(backend, fresh);
      }
      for (let i = firstNew; i < hashes.length; i++) fresh.push(hashes[i]!);
    }
    lru.trim(Math.max(1, this.#capacity(backend)));
  }
}

/**
 * Hashes in recency order: a map from hash to slot, and a doubly linked list through the slots
 * (most recent at `head`). Freed slots are reused; the arrays grow by doubling.
 */
class Lru {
  readonly #slot = new Map<number, number>();
  #keys = new Float64Array(64);
  #prev = new Int32Array(64);
  #next = new Int32Array(64);
  #head = -1;
  #tail = -1;
  #used = 0;
  readonly #free: number[] = [];

  get size(): number {
    return this.#slot.size;
  }

  has(hash: number): boolean {
    return this.#slot.has(hash);
  }

  /** Makes `hash` the most recent; true when it was not held. */
  touch(hash: number): boolean {
    const s = this.#slot.get(hash);
    if (s !== undefined) {
      if (s !== this.#head) {
        this.#unlink(s);
        this.#pushHead(s);
      }
      return false;
    }
    const n = this.#alloc();
    this.#keys[n] = hash;
    this.#slot.set(hash, n);
    this.#pushHead(n);
    return true;
  }

  /** Drops the least recent hashes until at most `cap` are held. */
  trim(cap: number): void {
    while (this.#slot.size > cap && this.#tail >= 0) {
      const s = this.#tail;
      this.#unlink(s);
      this.#slot.delete(this.#keys[s]!);
      this.#free.push(s);
    }
  }

  #alloc(): number {
    const f = this.#free.pop();
    if (f !== undefined) return f;
    if (this.#used === this.#keys.length) {
      const grow = <T extends Float64Array | Int32Array>(a: T, make: (n: number) => T): T => {
        const b = make(a.length * 2);
        b.set(a);
        return b;
      };
      this.#keys = grow(this.#keys, (n) => new Float64Array(n));
      this.#prev = grow(this.#prev, (n) => new Int32Array(n));
      this.#next = grow(this.#next, (n) => new Int32Array(n));
    }
    return this.#used++;
  }

  #unlink(s: number): void {
    const p = this.#prev[s]!;
    const n = this.#next[s]!;
    if (p >= 0) this.#next[p] = n;
    else this.#head = n;
    if (n >= 0) this.#prev[n] = p;
    else this.#tail = p;
  }

  #pushHead(s: number): void {
    this.#prev[s] = -1;
    this.#next[s] = this.#head;
    if (this.#head >= 0) this.#prev[this.#head] = s;
    this.#head = s;
    if (this.#tail < 0) this.#tail = s;
  }
}
