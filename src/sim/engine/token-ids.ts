// Generated token ids. The front end decodes them with the cl100k_base vocabulary, so every id
// here is one cl100k token for a common English word with its leading space (" the", " of", ...)
// or "." / ","; test/sim/engine-tokens.test.ts checks that against gpt-tokenizer.

export const OUTPUT_VOCAB: readonly number[] = [
  279, 315, 323, 311, 304, 374, 430, 369, 433, 439, 574, 449, 387, 555, 389, 539, 568, 420, 527, 477, 813,
  505, 520, 902, 719, 617, 459, 814, 499, 1051, 1077, 1364, 1070, 832, 682, 584, 872, 649, 706, 810, 690,
  1053, 922, 422, 779, 1148, 994, 892, 1139, 1063, 1646, 828, 1887, 1715, 4037, 1274, 1176, 502, 1667, 1648,
  1253, 1193, 927, 1778, 1023, 1403, 1101, 1306, 1664, 1060, 1455, 1436, 1405, 1521, 1093, 1120, 1243, 1903,
  990, 1555, 1790, 1603, 1203, 1511, 1690, 1990, 2380, 1440, 1317, 2225, 1855, 1234, 1890, 1566, 1917, 1614,
  1418, 2294, 961, 1695, 1396, 2324, 2697, 3363, 2678, 2391, 1579, 2533, 2403, 1866, 1938, 2085, 2103, 2035,
  1766, 2500, 4869, 1912, 2212, 1304, 1486, 13, 11,
];

/** The token id a request with `seed` generates at output position `index` (pure function). */
export function pickTokenId(seed: number, index: number): number {
  const s = (seed >>> 0) ^ Math.floor(seed / 4294967296);
  let x = Math.imul(s ^ 0x27d4eb2d, 0x165667b1) ^ Math.imul(index + 1, 0x9e3779b1);
  x ^= x >>> 15;
  x = Math.imul(x, 0x2c1b3c6d);
  x ^= x >>> 12;
  x = Math.imul(x, 0x297a2d39);
  x ^= x >>> 15;
  return OUTPUT_VOCAB[(x >>> 0) % OUTPUT_VOCAB.length]!;
}
