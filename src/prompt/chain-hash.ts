// Chained hashes of full blocks, as vLLM's automatic prefix caching keys its KV blocks:
// hash_i = H(hash_{i-1}, values of block i), so a block's hash names its whole prefix. Two
// murmur3-style 32-bit lanes give a 53-bit value (a safe JS integer), so collisions among a few
// million cached blocks are negligible. Two users: the simulator hashes token ids (as vLLM
// does, `hashBlock`), the router hashes the canonical prompt's text character by character
// (`TextBlocks`, a cheaper per-character step with the same chaining and finish), which needs no
// tokenizer on the request path.
// The root parent is a fixed constant (vLLM uses a random NONE_HASH unless PYTHONHASHSEED is set).

import { endianness } from 'node:os';

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
 * Chained hashes of a text fed piece by piece, one per full block of `blockChars` UTF-16 units.
 * Invariant: the hashes depend only on the concatenation of the pieces, never on where they were
 * split, and only full blocks are hashed.
 *
 * This is the request path's one pass over a prompt's characters, so each character costs two
 * multiply-xor steps (two FNV-1a-style lanes seeded from the parent hash) and nothing else; each
 * full block is finished with murmur3's mixer into 53 bits, as `hashBlock` finishes token blocks.
 * Not cryptographic: a collision only makes the router believe a block is cached that is not.
 */
export class TextBlocks {
  readonly blockChars: number;
  readonly hashes: number[] = [];
  /** UTF-16 units fed so far. */
  chars = 0;
  /** Units of the current block so far, and its two lanes. */
  #fill = 0;
  #h1: number;
  #h2: number;

  constructor(blockChars: number) {
    if (!(blockChars >= 1 && Number.isInteger(blockChars)))
      throw new RangeError('blockChars must be an integer >= 1');
    this.blockChars = blockChars;
    this.#h1 = seed1(ROOT_HASH);
    this.#h2 = seed2(ROOT_HASH);
  }

  add(text: string): void {
    const n = text.length;
    const units = n >= SCRATCH_FROM_CHARS ? utf16Units(text) : null;
    // Locals, not fields, in the per-character loop.
    const blockChars = this.blockChars;
    const hashes = this.hashes;
    let fill = this.#fill;
    let h1 = this.#h1;
    let h2 = this.#h2;
    for (let i = 0; i < n; i++) {
      const c = units === null ? text.charCodeAt(i) : (units[i] as number);
      h1 = Math.imul(h1 ^ c, 0x01000193);
      h2 = Math.imul(h2 ^ c, 0x5bd1e995);
      if (++fill === blockChars) {
        const lo = fmix32(h1 ^ blockChars);
        const hi = fmix32(h2 ^ lo);
        const hash = (hi >>> 11) * TWO_32 + lo;
        hashes.push(hash);
        h1 = seed1(hash);
        h2 = seed2(hash);
        fill = 0;
      }
    }
    this.#fill = fill;
    this.#h1 = h1;
    this.#h2 = h2;
    this.chars += n;
  }
}

// A long text's UTF-16 code units are read from a typed array, not with charCodeAt: the same
// values, but V8 slows every charCodeAt loop about 5x once any code has subclassed String (ioredis
// does, for RESP3 verbatim strings), measured at 0.35 against 0.05 ms for 42,000 characters. One
// C++ copy (Buffer#write, utf16le) fills a scratch array reused across calls; the array is
// little-endian like the machines Node runs on here (on a big-endian one charCodeAt is used).
const SCRATCH_FROM_CHARS = endianness() === 'LE' ? 256 : Number.POSITIVE_INFINITY;
/** Longest text whose scratch array is kept for the next call (2 MB). */
const SCRATCH_KEEP_CHARS = 1 << 20;
let scratch = new Uint16Array(4096);
let scratchBytes = Buffer.from(scratch.buffer);

function utf16Units(text: string): Uint16Array {
  if (text.length > scratch.length) {
    const units = new Uint16Array(Math.max(text.length, 2 * scratch.length));
    const bytes = Buffer.from(units.buffer);
    bytes.write(text, 0, 'utf16le');
    if (units.length <= SCRATCH_KEEP_CHARS) {
      scratch = units;
      scratchBytes = bytes;
    }
    return units;
  }
  scratchBytes.write(text, 0, 'utf16le');
  return scratch;
}

const seed1 = (parent: number): number => ((parent >>> 0) ^ 0x811c9dc5) | 0;
const seed2 = (parent: number): number => (Math.floor(parent / TWO_32) ^ 0x9e3779b9) | 0;
