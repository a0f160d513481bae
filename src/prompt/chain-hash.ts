// Chained hashes of full blocks, as vLLM's automatic prefix caching keys its KV blocks:
// hash_i = H(hash_{i-1}, values of block i), so a block's hash names its whole prefix. Two
// murmur3-style 32-bit lanes give a 53-bit value (a safe JS integer), so collisions among a few
// million cached blocks are negligible. One hash, two users: the simulator hashes token ids (as
// vLLM does), the router hashes the canonical prompt's text (two UTF-16 units per value,
// `TextBlocks`), which needs no tokenizer on the request path.
// The root parent is a fixed constant (vLLM uses a random NONE_HASH unless PYTHONHASHSEED is set).

/** Parent hash of block 0. */
export const ROOT_HASH = 0x1b873593;

const TWO_32 = 4294967296;

function fmix32(h: number): number {
  let x = h ^ (h >>> 16);
  x = Math.imul(x, 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  return (x ^ (x >>> 16)) >>> 0;
}

/**
 * Hash of the block `tokenAt(start) .. tokenAt(start + blockSize - 1)` chained on `parent`.
 * `tokens` is read by index only, so callers pass either the prompt array or a scratch buffer.
 */
export function hashBlock(
  parent: number,
  tokens: ArrayLike<number>,
  start: number,
  blockSize: number,
): number {
  let h1 = (parent >>> 0) ^ 0x9e3779b9;
  let h2 = Math.floor(parent / TWO_32) ^ 0x7f4a7c15;
  const end = start + blockSize;
  for (let i = start; i < end; i++) {
    const t = tokens[i]! | 0;
    let k = Math.imul(t, 0xcc9e2d51);
    k = (k << 15) | (k >>> 17);
    k = Math.imul(k, 0x1b873593);
    h1 ^= k;
    h1 = (h1 << 13) | (h1 >>> 19);
    h1 = (Math.imul(h1, 5) + 0xe6546b64) | 0;
    h2 ^= Math.imul(t ^ h1, 0x2545f491);
    h2 = (h2 << 17) | (h2 >>> 15);
    h2 = (Math.imul(h2, 9) + 0x38495ab5) | 0;
  }
  const a = fmix32(h1 ^ blockSize);
  const b = fmix32(h2 ^ a);
  return (b >>> 11) * TWO_32 + a;
}

/** Hashes of every full block of `tokens`, appended to `out` (which is returned). */
export function blockHashes(tokens: ArrayLike<number>, blockSize: number, out: number[] = []): number[] {
  const full = Math.floor(tokens.length / blockSize);
  let parent = out.length > 0 ? out[out.length - 1]! : ROOT_HASH;
  for (let i = out.length; i < full; i++) {
    parent = hashBlock(parent, tokens, i * blockSize, blockSize);
    out.push(parent);
  }
  return out;
}

/**
 * Chained hashes of a text fed piece by piece, one per full block of `blockChars` UTF-16 units
 * (two units per hashed value). Invariant: the hashes depend only on the concatenation of the
 * pieces, never on where they were split, and only full blocks are hashed.
 */
export class TextBlocks {
  readonly blockChars: number;
  readonly hashes: number[] = [];
  /** UTF-16 units fed so far. */
  chars = 0;
  readonly #units: Int32Array;
  /** Units of the current block so far. */
  #fill = 0;

  constructor(blockChars: number) {
    if (!(blockChars >= 2 && blockChars % 2 === 0)) throw new RangeError('blockChars must be even and >= 2');
    this.blockChars = blockChars;
    this.#units = new Int32Array(blockChars / 2);
  }

  add(text: string): void {
    const units = this.#units;
    const half = units.length;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      const slot = this.#fill >> 1;
      units[slot] = this.#fill & 1 ? units[slot]! | (c << 16) : c;
      if (++this.#fill === this.blockChars) {
        const parent = this.hashes.length > 0 ? this.hashes[this.hashes.length - 1]! : ROOT_HASH;
        this.hashes.push(hashBlock(parent, units, 0, half));
        this.#fill = 0;
      }
    }
    this.chars += text.length;
  }
}
