import { describe, expect, it } from 'vitest';
import { generatedText, generatedToken, naturalLength, requestSeed } from '../../src/sim/textgen.ts';
import { EOT, Tokenizer } from '../../src/tokenizer/tokenizer.ts';

const textOf = (seed: number, n: number) => {
  let s = '';
  for (let i = 0; i < n; i++) s += generatedText(generatedToken(seed, i));
  return s;
};

describe('generated text', () => {
  it('is a pure function of the seed', () => {
    expect(textOf(7, 50)).toBe(textOf(7, 50));
    expect(textOf(7, 50)).not.toBe(textOf(8, 50));
  });

  it('reads as words and re-encodes to the very same token ids', () => {
    const t = new Tokenizer();
    for (const seed of [1, 2, 3, 1234567]) {
      const ids = Array.from({ length: 200 }, (_, i) => generatedToken(seed, i));
      const text = textOf(seed, 200);
      expect(text).toMatch(/^[A-Z][a-z]+( [A-Za-z]+|[,.])+$/);
      expect(text).not.toMatch(/[,.][,.]/);
      expect([...t.encode(text)]).toEqual(ids);
      expect(ids.every((id) => id < 100000)).toBe(true);
    }
  });

  it('ends a natural stop with the empty end-of-turn token', () => {
    expect(generatedToken(5, 10, true)).toBe(EOT);
    expect(generatedText(EOT)).toBe('');
  });
});

describe('naturalLength', () => {
  it('is deterministic, bounded and centred near 160 tokens', () => {
    const lengths = Array.from({ length: 4000 }, (_, i) => naturalLength(i * 7919));
    expect(naturalLength(42)).toBe(naturalLength(42));
    expect(Math.min(...lengths)).toBeGreaterThanOrEqual(4);
    expect(Math.max(...lengths)).toBeLessThanOrEqual(2048);
    const sorted = [...lengths].sort((a, b) => a - b);
    const median = sorted[2000] as number;
    expect(median).toBeGreaterThan(140);
    expect(median).toBeLessThan(180);
    const mean = lengths.reduce((a, b) => a + b, 0) / lengths.length;
    expect(mean).toBeGreaterThan(190);
    expect(mean).toBeLessThan(250);
  });
});

describe('requestSeed', () => {
  it('uses the body seed when given, else the fleet seed and the prompt', () => {
    expect(requestSeed(1, [1, 2, 3], 99)).toBe(requestSeed(2, [4, 5], 99));
    expect(requestSeed(1, [1, 2, 3], 99)).not.toBe(requestSeed(1, [1, 2, 3], 100));
    expect(requestSeed(1, [1, 2, 3])).toBe(requestSeed(1, [1, 2, 3]));
    expect(requestSeed(1, [1, 2, 3])).not.toBe(requestSeed(2, [1, 2, 3]));
    expect(requestSeed(1, [1, 2, 3])).not.toBe(requestSeed(1, [1, 2, 4]));
    // Distinct int64 seeds stay distinct.
    expect(requestSeed(0, [], 2 ** 40)).not.toBe(requestSeed(0, [], 0));
  });
});
