// Which backend holds which prompt blocks: learnt from dispatch decisions (a request's blocks are
// inserted on the backend it is sent to, at once, so a burst of one prefix does not all miss while
// the first of them is prefilled) and aged out least-recently-used, within a capacity per backend.
// Each block weighs what it takes of that capacity: live-state.ts counts both in tokens (the KV
// cache's, and the tokens the request's tenant's estimate gives one block of its text), so a
// tenant writing in a script of fewer characters per token fills the cache as fast as it does in
// vLLM, not at the fleet's ratio. An estimate of what vLLM's prefix cache holds, never a copy of
// it: vLLM evicts only blocks no running request uses, and may evict sooner.
//
// Invariants:
// - per backend, the weights held sum to at most `capacity(backend)` (one block is kept whatever it
//   weighs); inserting past it evicts the least recently inserted or matched ones. Every weight is
//   at least MIN_WEIGHT, so at most capacity / MIN_WEIGHT hashes are held: memory is bounded
//   whatever the traffic;
// - a request's blocks are touched from the last to the first, so a prompt's leading blocks are
//   always at least as recent as its later ones: what a backend holds of one chain is (nearly
//   always) a prefix of it, and the longest match is found by bisection, O(log n) lookups;
// - lookups never allocate per block, and never touch (matching is not use: only dispatch is);
// - every operation is O(1) per block and allocates nothing: recency is an intrusive list over
//   slot arrays, so touching a held block never deletes and re-adds a table entry, and eviction
//   never iterates a map (a map's iteration walks the holes its deletions leave: hundreds of
//   microseconds per grant); hash to slot is an open-addressing table of typed arrays
//   (hash-slots.ts), which never boxes a 53-bit hash as a Map<number, number> does;
// - shared with peers (several gateway instances): every block this instance sends to a backend,
//   new there or already held, is told to the peers, at most once per SHARE_EVERY_MS per block
//   (a block a peer told of counts as told). Peers must see uses, not only inserts: an instance
//   that saw only the first dispatch of a prefix every instance keeps using would age it out of
//   its index while the backend, whose LRU every use refreshes, still holds it, and send that
//   prefix's next request elsewhere, cold;
// - insert() only keeps a reference to the request's hash list (O(1) on the request path): the
//   request is sent before its blocks are touched. Every read (match, size, drainRecent) and every
//   other write applies what insert() kept first, so none ever sees the index without a block
//   already sent; a timer applies it otherwise, after this turn's sends. The per-block work of
//   telling peers happens in drainRecent(), on the sync timer, and what waits for it is bounded by
//   MAX_RECENT_BLOCKS (past it, peers are told less, the local index is as exact): what is kept
//   is always the newest, in two generations of half the bound each (a full one becomes the older
//   and the one before it goes), so a Redis outage leaves the blocks sent last to be told; and one
//   drain tells at most MAX_TOLD_BLOCKS, the newest, which encode to well under one shared-log
//   entry's 1 MiB.

import { HashSlots } from './hash-slots.ts';

/** A backend's capacity when none is given: 16,384 blocks of the default weight (1). */
export const DEFAULT_CAPACITY = 16_384;
/** The least a block may weigh (a weight under it, or not a number, counts as it; see the invariants). */
export const MIN_WEIGHT = 1 / 64;
/** A backend's KV cache in tokens until its metrics say (16,384 of vLLM's 16-token blocks). */
export const DEFAULT_KV_TOKENS = 262_144;
/** vLLM's KV block size on CUDA, taken when a backend's metrics give its block count alone. */
export const VLLM_BLOCK_TOKENS = 16;
/** A block in use is told to peers again after this long: well within an LRU's lifetime. */
export const SHARE_EVERY_MS = 2_000;
/** Blocks kept for telling between two drains, at most, repeats included (a Redis outage must not grow it). */
export const MAX_RECENT_BLOCKS = 1 << 18;
/**
 * Blocks one drain tells, at most (the newest): encoded for the shared log, at most 12 characters
 * a block, they stay well under one entry's 1 MiB.
 */
export const MAX_TOLD_BLOCKS = 1 << 16;

/** One request's blocks, as sent to one backend, and what each weighs. */
interface Sent {
  readonly backend: string;
  readonly hashes: readonly number[];
  readonly weight: number;
}

const weightOf = (w: number): number => (w >= MIN_WEIGHT ? w : Number.isFinite(w) ? MIN_WEIGHT : 1);

export class PrefixIndex {
  readonly #backends = new Map<string, Lru>();
  readonly #capacity: (backend: string) => number;
  readonly #now: () => number;
  /**
   * The hash lists sent since the last drain (what this instance tells its peers), in the order
   * sent, in two generations of at most half of MAX_RECENT_BLOCKS each.
   */
  #recent: Sent[] = [];
  #recentBlocks = 0;
  #older: Sent[] = [];
  #recording = false;
  /** Inserts not yet applied (see settle()), in order. */
  readonly #pending: Sent[] = [];
  #settleTimer: NodeJS.Timeout | null = null;

  constructor(
    capacity: (backend: string) => number = () => DEFAULT_CAPACITY,
    now: () => number = () => performance.now(),
  ) {
    this.#capacity = capacity;
    this.#now = now;
  }

  /** Keep what this instance sends until drainRecent() (for sharing with peers). */
  record(on: boolean): void {
    this.settle();
    this.#recording = on;
    if (!on) this.#forgetRecent();
  }

  /**
   * The request's blocks are on `backend` now (it is being sent there), each weighing `weight` (a
   * block already held takes this weight: the latest estimate of its size). `hashes` is kept as
   * given; the index holds them for every later read, and touches them after this turn's sends.
   */
  insert(backend: string, hashes: readonly number[], weight = 1): void {
    if (hashes.length === 0) return;
    this.#pending.push({ backend, hashes, weight: weightOf(weight) });
    if (this.#settleTimer === null) {
      this.#settleTimer = setTimeout(this.#onSettleTimer, 0);
      this.#settleTimer.unref();
    }
  }

  /** Applies every insert kept so far (reads call it first; so does a timer). */
  settle(): void {
    const pending = this.#pending;
    if (pending.length === 0) return;
    for (let i = 0; i < pending.length; i++) {
      const { backend, hashes, weight } = pending[i]!;
      this.#lru(backend).touchAll(hashes, weight, true, this.#capacity(backend), null);
      if (!this.#recording || hashes.length > MAX_RECENT_BLOCKS / 2) continue;
      if (this.#recentBlocks + hashes.length > MAX_RECENT_BLOCKS / 2) {
        // The newest generation is full: it becomes the older one, and the older one goes.
        this.#older = this.#recent;
        this.#recent = [];
        this.#recentBlocks = 0;
      }
      this.#recentBlocks += hashes.length;
      this.#recent.push(pending[i]!);
    }
    pending.length = 0;
  }

  readonly #onSettleTimer = (): void => {
    this.#settleTimer = null;
    this.settle();
  };

  /**
   * A peer sent these blocks to `backend` (and told of them: not to be told again for a while). A
   * peer tells no weight: a block new here weighs `weight`, one held keeps its own.
   */
  insertPeer(backend: string, hashes: readonly number[], weight = 1): void {
    this.settle();
    this.#lru(backend).touchAll(hashes, weightOf(weight), false, this.#capacity(backend), this.#now());
  }

  /** Leading blocks of `hashes` that `backend` holds. */
  match(backend: string, hashes: readonly number[]): number {
    this.settle();
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

  /** Blocks held for `backend`. */
  size(backend: string): number {
    this.settle();
    return this.#backends.get(backend)?.size ?? 0;
  }

  /** What the blocks held for `backend` weigh together (of its capacity). */
  held(backend: string): number {
    this.settle();
    return this.#backends.get(backend)?.held ?? 0;
  }

  /** Forget every block, those not applied yet included (they were hashed some other way). */
  clear(): void {
    this.#pending.length = 0;
    this.#backends.clear();
    this.#forgetRecent();
  }

  /** Forget a backend (removed on reload). */
  drop(backend: string): void {
    this.settle();
    this.#backends.delete(backend);
    this.#recent = this.#recent.filter((s) => s.backend !== backend);
    this.#older = this.#older.filter((s) => s.backend !== backend);
  }

  /**
   * What to tell peers: per backend, the blocks sent there since the last call that are still
   * held and were not told (by this instance or a peer) in the last SHARE_EVERY_MS, each once, in
   * chain order (a peer touches them last to first, as insert() does). Empties what was kept.
   */
  drainRecent(): Map<string, number[]> {
    this.settle();
    const now = this.#now();
    const sent = [...this.#older, ...this.#recent];
    // The newest lists whose distinct blocks number at most MAX_TOLD_BLOCKS (older ones are not
    // told now, nor marked told: their next use tells them) ...
    let from = sent.length;
    const distinct = new Map<string, Set<number>>();
    let count = 0;
    while (from > 0) {
      const { backend, hashes } = sent[from - 1]!;
      let seen = distinct.get(backend);
      if (seen === undefined) {
        seen = new Set();
        distinct.set(backend, seen);
      }
      let added = 0;
      for (const h of hashes) if (!seen.has(h)) added++;
      if (count + added > MAX_TOLD_BLOCKS) break;
      for (const h of hashes) seen.add(h);
      count += added;
      from--;
    }
    // ... told in the order they were sent, so that a chain's blocks go in chain order.
    const out = new Map<string, number[]>();
    for (let i = from; i < sent.length; i++) {
      const { backend, hashes } = sent[i]!;
      const lru = this.#backends.get(backend);
      if (lru === undefined) continue;
      let tell = out.get(backend);
      for (const h of hashes) {
        if (!lru.markTold(h, now)) continue;
        if (tell === undefined) {
          tell = [];
          out.set(backend, tell);
        }
        tell.push(h);
      }
    }
    this.#forgetRecent();
    return out;
  }

  #forgetRecent(): void {
    this.#recent = [];
    this.#older = [];
    this.#recentBlocks = 0;
  }

  #lru(backend: string): Lru {
    let lru = this.#backends.get(backend);
    if (lru === undefined) {
      lru = new Lru();
      this.#backends.set(backend, lru);
    }
    return lru;
  }
}

/**
 * Hashes in recency order: a table from hash to slot (hash-slots.ts), and a doubly linked list
 * through the slots (most recent at `head`). Freed slots are reused; the arrays grow by doubling.
 */
class Lru {
  readonly #slot = new HashSlots();
  #keys = new Float64Array(64);
  #weight = new Float64Array(64);
  /** Σ #weight over the slots held. */
  #held = 0;
  /** When each slot's hash was last told to (or by) a peer; −Infinity: never. */
  #told = new Float64Array(64).fill(Number.NEGATIVE_INFINITY);
  #prev = new Int32Array(64);
  #next = new Int32Array(64);
  #head = -1;
  #tail = -1;
  #used = 0;
  readonly #free: number[] = [];

  get size(): number {
    return this.#slot.size;
  }

  get held(): number {
    return this.#held;
  }

  has(hash: number): boolean {
    return this.#slot.has(hash);
  }

  /**
   * Touches `hashes` from the last to the first (the leading blocks end most recent), each new one
   * weighing `weight` (and each held one too when `reweigh`), marks them told at `toldAt` unless
   * null, and trims to `cap`.
   */
  touchAll(
    hashes: readonly number[],
    weight: number,
    reweigh: boolean,
    cap: number,
    toldAt: number | null,
  ): void {
    for (let i = hashes.length - 1; i >= 0; i--) {
      const s = this.touch(hashes[i]!, weight, reweigh);
      if (toldAt !== null) this.#told[s] = toldAt;
    }
    this.trim(cap);
  }

  /**
   * Marks `hash` told at `now` and returns true, unless it is not held or was told within
   * SHARE_EVERY_MS. A time told after `now` (the wall clock stepped back) is due: otherwise nothing
   * told in the span the clock went back would be told again until the clock caught up.
   */
  markTold(hash: number, now: number): boolean {
    const s = this.#slot.get(hash);
    if (s < 0) return false;
    const age = now - this.#told[s]!;
    if (age >= 0 && age < SHARE_EVERY_MS) return false;
    this.#told[s] = now;
    return true;
  }

  /** Makes `hash` the most recent, weighing `weight` if new (or if `reweigh`); returns its slot. */
  touch(hash: number, weight: number, reweigh: boolean): number {
    const s = this.#slot.get(hash);
    if (s >= 0) {
      if (reweigh) {
        this.#held += weight - this.#weight[s]!;
        this.#weight[s] = weight;
      }
      if (s !== this.#head) {
        this.#unlink(s);
        this.#pushHead(s);
      }
      return s;
    }
    const n = this.#alloc();
    this.#keys[n] = hash;
    this.#weight[n] = weight;
    this.#held += weight;
    this.#told[n] = Number.NEGATIVE_INFINITY;
    this.#slot.set(hash, n);
    this.#pushHead(n);
    return n;
  }

  /** Drops the least recent hashes until what is held weighs at most `cap` (or one is left). */
  trim(cap: number): void {
    while (this.#held > cap && this.#slot.size > 1) {
      const s = this.#tail;
      this.#unlink(s);
      this.#slot.delete(this.#keys[s]!);
      this.#held -= this.#weight[s]!;
      this.#free.push(s);
    }
    // Sums of fractions drift; an empty LRU holds nothing.
    if (this.#slot.size === 0) this.#held = 0;
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
      this.#weight = grow(this.#weight, (n) => new Float64Array(n));
      this.#told = grow(this.#told, (n) => new Float64Array(n));
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
