// The KV block pool with automatic prefix caching, as vLLM v1's BlockPool keeps it.
// Invariants:
// - Block 0 is the null block and is never handed out, so at most numBlocks - 1 are usable.
// - A block is in the free queue exactly when its refcount is 0. Free blocks keep their hash,
//   so they stay hittable until a new allocation pops them from the head (LRU over free blocks).
// - Every block registered under a hash is findable while it keeps it, as vLLM's
//   BlockHashToBlockMap keeps every copy: `byHash` names one, `copies` the others (two requests
//   with one prompt and one seed compute the same blocks side by side). Evicting the one named
//   hands the name to another copy.

/** Returned by allocate() and lookup() when there is no block. */
export const NO_BLOCK = -1;

export class BlockPool {
  readonly numBlocks: number;
  readonly blockSize: number;
  private readonly refCount: Int32Array;
  private readonly hashOf: Float64Array;
  // Doubly linked free queue over block ids; index numBlocks is the sentinel.
  private readonly next: Int32Array;
  private readonly prev: Int32Array;
  private readonly byHash = new Map<number, number>();
  /** The other blocks registered under a hash `byHash` names, for the few hashes that have them. */
  private readonly copies = new Map<number, number[]>();
  private free = 0;

  constructor(numBlocks: number, blockSize: number) {
    if (numBlocks < 2) throw new RangeError('a block pool needs at least 2 blocks (one is the null block)');
    this.numBlocks = numBlocks;
    this.blockSize = blockSize;
    this.refCount = new Int32Array(numBlocks);
    this.hashOf = new Float64Array(numBlocks);
    this.next = new Int32Array(numBlocks + 1);
    this.prev = new Int32Array(numBlocks + 1);
    this.clear();
  }

  /** Forget every hash and put every usable block in the free queue, in id order. */
  clear(): void {
    const s = this.numBlocks;
    this.byHash.clear();
    this.copies.clear();
    this.refCount.fill(0);
    this.hashOf.fill(Number.NaN);
    this.next[s] = s;
    this.prev[s] = s;
    this.free = 0;
    for (let b = 1; b < this.numBlocks; b++) this.pushTail(b);
  }

  get numFree(): number {
    return this.free;
  }

  /** vLLM `kv_cache_usage_perc`. */
  usage(): number {
    return 1 - this.free / (this.numBlocks - 1);
  }

  /** Pop the least recently freed block, evicting its cached hash. Returns NO_BLOCK when empty. */
  allocate(): number {
    const s = this.numBlocks;
    const b = this.next[s]!;
    if (b === s) return NO_BLOCK;
    this.unlink(b);
    this.evictHash(b);
    this.refCount[b] = 1;
    return b;
  }

  /** Take a reference on a cached block (a prefix hit), pulling it out of the free queue. */
  touch(b: number): void {
    if (this.refCount[b] === 0) this.unlink(b);
    this.refCount[b]!++;
  }

  /** Drop one reference; a block reaching 0 goes to the tail of the free queue. */
  release(b: number): void {
    const rc = this.refCount[b]! - 1;
    this.refCount[b] = rc;
    if (rc === 0) this.pushTail(b);
  }

  /**
   * Release a request's blocks in reverse order, so its deepest blocks sit nearer the head and
   * are evicted before the shared prefix blocks.
   */
  releaseAll(blocks: readonly number[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) this.release(blocks[i]!);
  }

  /** Register a full block under its chained hash so later requests can hit it. */
  cache(b: number, hash: number): void {
    if (this.hashOf[b] === hash) return;
    // A block is registered once between allocations; one holding another hash gives it up first.
    this.evictHash(b);
    this.hashOf[b] = hash;
    const named = this.byHash.get(hash);
    if (named === undefined) this.byHash.set(hash, b);
    else {
      const more = this.copies.get(hash);
      if (more === undefined) this.copies.set(hash, [b]);
      else more.push(b);
    }
  }

  /** The cached block for `hash`, or NO_BLOCK. */
  lookup(hash: number): number {
    return this.byHash.get(hash) ?? NO_BLOCK;
  }

  /** How many leading hashes are cached (the longest hit chain), at most `limit`. */
  longestHit(hashes: readonly number[], limit: number): number {
    const n = Math.min(limit, hashes.length);
    let i = 0;
    while (i < n && this.byHash.has(hashes[i]!)) i++;
    return i;
  }

  refCountOf(b: number): number {
    return this.refCount[b]!;
  }

  private evictHash(b: number): void {
    const h = this.hashOf[b]!;
    if (Number.isNaN(h)) return;
    this.hashOf[b] = Number.NaN;
    const more = this.copies.get(h);
    if (this.byHash.get(h) === b) {
      if (more === undefined) this.byHash.delete(h);
      else {
        this.byHash.set(h, more.pop()!);
        if (more.length === 0) this.copies.delete(h);
      }
    } else if (more !== undefined) {
      more.splice(more.indexOf(b), 1);
      if (more.length === 0) this.copies.delete(h);
    }
  }

  private pushTail(b: number): void {
    const s = this.numBlocks;
    const last = this.prev[s]!;
    this.next[last] = b;
    this.prev[b] = last;
    this.next[b] = s;
    this.prev[s] = b;
    this.free++;
  }

  private unlink(b: number): void {
    const p = this.prev[b]!;
    const n = this.next[b]!;
    this.next[p] = n;
    this.prev[n] = p;
    this.free--;
  }
}
