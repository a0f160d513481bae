import { decode } from 'gpt-tokenizer/encoding/cl100k_base';
import { describe, expect, it } from 'vitest';
import { OUTPUT_VOCAB, pickTokenId } from '../../src/sim/engine/token-ids.ts';

describe('generated token ids', () => {
  it('are single cl100k tokens for a common word with its leading space, or . and ,', () => {
    expect(new Set(OUTPUT_VOCAB).size).toBe(OUTPUT_VOCAB.length);
    for (const id of OUTPUT_VOCAB) expect(decode([id])).toMatch(/^( [a-z]+|\.|,)$/);
  });

  it('are a pure function of seed and index, spread over the vocabulary', () => {
    const seq = (seed: number) => Array.from({ length: 400 }, (_, i) => pickTokenId(seed, i));
    expect(seq(1)).toEqual(seq(1));
    expect(seq(1)).not.toEqual(seq(2));
    expect(seq(2 ** 40 + 1)).not.toEqual(seq(1));
    expect(new Set(seq(3)).size).toBeGreaterThan(OUTPUT_VOCAB.length * 0.8);
  });
});
