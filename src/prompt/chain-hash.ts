// Chained hashes of full blocks, as vLLM's automatic prefix caching keys its KV blocks:
// hash_i = H(hash_{i-1}, values of block i), so a block's hash names its whole prefix. Two
// murmur3-style 32-bit lanes give a 53-bit value (a safe JS integer), so collisions among a few
// million cached blocks are negligible. Two users: the simulator hashes token ids (as vLLM
// does, `hashBlock`), the router hashes the canonical prompt's text two UTF-16 units at a time
// (`TextBlocks`, a cheaper step with the same chaining and finish), which needs no tokenizer on
// the request path.
// The root parent is a fixed constant (vLLM uses a random NONE_HASH unless PYTHONHASHSEED is set),
// or for the router one named after what else keys vLLM's cache (`namedRoot`).

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

/**
 * A root parent that names `key`: vLLM's block hashes carry, besides the tokens, the LoRA adapter
 * (the served model name) and the request's `cache_salt`, so the same text under another of them
 * is another cache entry, and must be another chain of hashes here.
 */
export function namedRoot(key: string, parent = ROOT_HASH): number {
  const units = new Uint16Array(key.length);
  for (let i = 0; i < key.length; i++) units[i] = key.charCodeAt(i);
  return hashBlock(parent, units, 0, units.length);
}

/**
 * Names the salt's level of a root: no rendering key is this string (each holds a `=`), and its 11
 * units hash as no full block of token ids does (a block's length is in its hash).
 */
const SALT_TAG = '\u0000cache_salt';

/**
 * The root a `cache_salt` names under `parent`, hung from a tag of its own: no salt's root is the
 * root of another key named there (a rendering key, a block of token ids), however it is spelt.
 */
export function saltedRoot(salt: string, parent = ROOT_HASH): number {
  return namedRoot(salt, namedRoot(SALT_TAG, parent));
}

/** Hashes of every full block of `tokens`, appended to `out` (which is returned). */
export function blockHashes(
  tokens: ArrayLike<number>,
  blockSize: number,
  out: number[] = [],
  root = ROOT_HASH,
): number[] {
  const full = Math.floor(tokens.length / blockSize);
  let parent = out.length > 0 ? out[out.length - 1]! : root;
  for (let i = out.length; i < full; i++) {
    parent = hashBlock(parent, tokens, i * blockSize, blockSize);
    out.push(parent);
  }
  return out;
}

/**
 * Chained hashes of a text fed piece by piece, one per full block of `blockChars` UTF-16 units
 * (an even number). Invariant: the hashes depend only on the concatenation of the pieces, never on
 * where they were split, and only full blocks are hashed.
 *
 * This is the request path's one pass over a prompt's characters, so it reads them two at a time:
 * a 32-bit word of two units (the first the low half) is mixed once and taken by two murmur3-style
 * lanes seeded from the parent hash, and each full block is finished with murmur3's mixer into 53
 * bits, as `hashBlock` finishes token blocks. Not cryptographic: a collision only makes the router
 * believe a block is cached that is not.
 */
export class TextBlocks {
  readonly blockChars: number;
  readonly hashes: number[] = [];
  /** UTF-16 units fed so far. */
  chars = 0;
  /** Words of the current block so far, and its two lanes. */
  #words = 0;
  #h1: number;
  #h2: number;
  /** The last unit of an odd-length feed, waiting for the unit that completes its word; or -1. */
  #carry = -1;

  constructor(blockChars: number, root = ROOT_HASH) {
    if (!(blockChars >= 2 && Number.isInteger(blockChars) && blockChars % 2 === 0))
      throw new RangeError('blockChars must be an even integer >= 2');
    this.blockChars = blockChars;
    this.#h1 = seed1(root);
    this.#h2 = seed2(root);
  }

  add(text: string): void {
    const n = text.length;
    if (n === 0) return;
    const at = this.#carry >= 0 ? 1 : 0;
    const s = scratchOf(at + n);
    fill(s, text, at);
    const units = s.units;
    const wordAt = s.words;
    if (at === 1) units[SWAP] = this.#carry;
    const total = at + n;
    const words = total >> 1;
    this.#carry = (total & 1) === 1 ? (units[(total - 1) ^ SWAP] as number) : -1;
    // Locals, not fields, in the per-word loop; the inner loop runs to the end of a block or of
    // the words, so it tests no block boundary per word.
    const perBlock = this.blockChars >> 1;
    const hashes = this.hashes;
    let filled = this.#words;
    let h1 = this.#h1;
    let h2 = this.#h2;
    for (let w = 0; w < words; ) {
      const end = Math.min(words, w + perBlock - filled);
      for (let i = w; i < end; i++) {
        // murmur3's word step. The word is mixed before either lane takes it, and each lane
        // rotates: a multiply alone carries a difference only upwards, so two words differing
        // only in their top bit would cancel each other out of a multiply-xor lane.
        let k = Math.imul(wordAt[i] as number, 0xcc9e2d51);
        k = Math.imul((k << 15) | (k >>> 17), 0x1b873593);
        h1 ^= k;
        h1 = (Math.imul((h1 << 13) | (h1 >>> 19), 5) + 0xe6546b64) | 0;
        h2 ^= k;
        h2 = (Math.imul((h2 << 17) | (h2 >>> 15), 9) + 0x38495ab5) | 0;
      }
      filled += end - w;
      w = end;
      if (filled === perBlock) {
        const lo = fmix32(h1 ^ this.blockChars);
        const hi = fmix32(h2 ^ lo);
        const hash = (hi >>> 11) * TWO_32 + lo;
        hashes.push(hash);
        h1 = seed1(hash);
        h2 = seed2(hash);
        filled = 0;
      }
    }
    this.#words = filled;
    this.#h1 = h1;
    this.#h2 = h2;
    this.chars += n;
  }
}

// A text's UTF-16 code units are read from a typed array. A long text is copied there by one C++
// call (Buffer#write, utf16le), not with charCodeAt: V8 slows every charCodeAt loop about 5x once
// any code has subclassed String (ioredis does, for RESP3 verbatim strings), measured at 0.35
// against 0.05 ms for 42,000 characters. The hash loop then reads each two-unit word in one load
// through a Uint32Array over the same memory.
// Invariant: word i = unit 2i | unit 2i+1 << 16 on any machine. On a little-endian one that is how
// the units lie; on a big-endian one Buffer#write (always little-endian) cannot be used, and
// charCodeAt stores unit j at index j ^ 1, so each pair lies swapped and the word reads the same.
const LE = endianness() === 'LE';
const SWAP = LE ? 0 : 1;
const WRITE_FROM_CHARS = LE ? 32 : Number.POSITIVE_INFINITY;
/** Longest text whose scratch memory is kept for the next call (2 MB). */
const SCRATCH_KEEP_CHARS = 1 << 20;

interface Scratch {
  readonly units: Uint16Array;
  readonly words: Uint32Array;
  readonly bytes: Buffer;
}

function makeScratch(units: number): Scratch {
  const buffer = new ArrayBuffer(2 * (units + (units & 1)));
  return { units: new Uint16Array(buffer), words: new Uint32Array(buffer), bytes: Buffer.from(buffer) };
}

let scratch = makeScratch(4096);

/** Scratch memory for at least `n` units (an even count), kept if not too large. */
function scratchOf(n: number): Scratch {
  if (n <= scratch.units.length) return scratch;
  const s = makeScratch(Math.max(n, 2 * scratch.units.length));
  if (s.units.length <= SCRATCH_KEEP_CHARS) scratch = s;
  return s;
}

/** Writes `text`'s units into `s` from unit `at` (what is before `at` is the caller's). */
function fill(s: Scratch, text: string, at: number): void {
  const n = text.length;
  if (n >= WRITE_FROM_CHARS) s.bytes.write(text, 2 * at, 'utf16le');
  else for (let i = 0; i < n; i++) s.units[(at + i) ^ SWAP] = text.charCodeAt(i);
}

const seed1 = (parent: number): number => ((parent >>> 0) ^ 0x811c9dc5) | 0;
const seed2 = (parent: number): number => (Math.floor(parent / TWO_32) ^ 0x9e3779b9) | 0;
