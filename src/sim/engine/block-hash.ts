// Chained hashes of full KV blocks, as vLLM's automatic prefix caching keys them:
// hash_i = H(hash_{i-1}, tokens of block i). Two murmur3-style 32-bit lanes give a 53-bit value
// (a safe JS integer), so collisions among a few million cached blocks are negligible.
// The root parent is a fixed constant (vLLM uses a random NONE_HASH unless PYTHONHASHSEED is
// set); a fixed root lets a gateway compute the same hashes as every replica.

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
