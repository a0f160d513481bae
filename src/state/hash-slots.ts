// A hash table from a block hash (a non-negative safe integer, src/prompt/chain-hash.ts) to a
// small non-negative integer, for the prefix index's LRU. Open addressing with linear probing in
// two typed arrays: a lookup or an insert allocates nothing and a hash is never boxed, where a
// Map<number, number> boxes every 53-bit key it is handed and chases a pointer per entry (on the
// request path a grant inserts and evicts one entry per prompt block: hundreds for a long prompt).
//
// Invariants:
// - `#keys[i]` is EMPTY or a held hash; a held hash sits at its home slot (both 32-bit halves
//   mixed by a Fibonacci multiply, the top bits kept: keys that differ only in some bits still
//   spread) or after it with no EMPTY slot between: a probe that meets EMPTY has seen every slot
//   the hash could be in;
// - delete keeps that without tombstones: it shifts back each later entry of the run whose home
//   does not lie (cyclically) after the freed slot;
// - at most half the slots are held (growth doubles the table), so probes stay short.

const EMPTY = -1;

export class HashSlots {
  #keys: Float64Array;
  #vals: Int32Array;
  #mask: number;
  /** 32 − log2(table size): the product's top bits index the table. */
  #shift: number;
  #size = 0;

  constructor(initialCapacity = 64) {
    let n = 16;
    while (n < initialCapacity * 2) n *= 2;
    this.#keys = new Float64Array(n).fill(EMPTY);
    this.#vals = new Int32Array(n);
    this.#mask = n - 1;
    this.#shift = 32 - Math.log2(n);
  }

  get size(): number {
    return this.#size;
  }

  #home(hash: number): number {
    return Math.imul((hash >>> 0) ^ ((hash / 4294967296) | 0), 0x9e3779b1) >>> this.#shift;
  }

  /** Where `hash` is held, or else the EMPTY slot that ends its probe run (where it would go). */
  #find(hash: number): number {
    const keys = this.#keys;
    const mask = this.#mask;
    let i = this.#home(hash);
    for (let k = keys[i]!; k !== hash && k !== EMPTY; k = keys[i]!) i = (i + 1) & mask;
    return i;
  }

  /** The value held for `hash`, or −1. */
  get(hash: number): number {
    const i = this.#find(hash);
    return this.#keys[i] === EMPTY ? -1 : this.#vals[i]!;
  }

  has(hash: number): boolean {
    return this.get(hash) >= 0;
  }

  /** Holds `value` (≥ 0) for `hash`, replacing what was held. A hash below 0 (or NaN) is ignored. */
  set(hash: number, value: number): void {
    if (!(hash >= 0)) return;
    if ((this.#size + 1) * 2 > this.#keys.length) this.#grow();
    const i = this.#find(hash);
    if (this.#keys[i] === EMPTY) {
      this.#keys[i] = hash;
      this.#size++;
    }
    this.#vals[i] = value;
  }

  /** Forgets `hash`; false when it was not held. */
  delete(hash: number): boolean {
    const keys = this.#keys;
    const mask = this.#mask;
    let i = this.#find(hash);
    if (keys[i] === EMPTY) return false;
    // Backward shift: move up each entry of the run after `i` that may not sit after the hole.
    for (let j = (i + 1) & mask; ; j = (j + 1) & mask) {
      const k = keys[j]!;
      if (k === EMPTY) break;
      const home = this.#home(k);
      // The entry at j may stay only if its home lies cyclically in (i, j].
      const stays = i <= j ? home > i && home <= j : home > i || home <= j;
      if (stays) continue;
      keys[i] = k;
      this.#vals[i] = this.#vals[j]!;
      i = j;
    }
    keys[i] = EMPTY;
    this.#size--;
    return true;
  }

  #grow(): void {
    const oldKeys = this.#keys;
    const oldVals = this.#vals;
    const n = oldKeys.length * 2;
    this.#keys = new Float64Array(n).fill(EMPTY);
    this.#vals = new Int32Array(n);
    this.#mask = n - 1;
    this.#shift = 32 - Math.log2(n);
    this.#size = 0;
    for (let i = 0; i < oldKeys.length; i++) {
      const k = oldKeys[i]!;
      if (k !== EMPTY) this.set(k, oldVals[i]!);
    }
  }
}
