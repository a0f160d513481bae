import { describe, expect, it } from 'vitest';
import { getProfile, kvCapacityTokens, PROFILES, stepTimeMs } from '../../src/sim/profiles.ts';

const decode = (seqs: number, ctx: number) => ({
  prefillTokens: 0,
  decodeSeqs: seqs,
  seqs,
  contextTokens: seqs * ctx,
  prefillAttnPairs: 0,
});
/** One prefill chunk of `n` tokens after `cached` computed ones. */
const prefillAfter = (n: number, cached = 0) => ({
  prefillTokens: n,
  decodeSeqs: 0,
  seqs: 1,
  contextTokens: cached + n,
  prefillAttnPairs: n * cached + (n * (n + 1)) / 2,
});

describe('GPU profiles', () => {
  it('has the documented profiles and rejects unknown names with the list', () => {
    for (const name of ['llama3-8b-h100', 'llama3-8b-a100', 'llama3-70b-h100-tp4']) {
      expect(getProfile(name).name).toBe(name);
    }
    expect(() => getProfile('h200')).toThrow(/llama3-8b-h100, llama3-8b-a100, llama3-70b-h100-tp4/);
  });

  it('every profile can hold one request of max_model_len (vLLM refuses to start otherwise)', () => {
    for (const p of Object.values(PROFILES))
      expect(kvCapacityTokens(p)).toBeGreaterThanOrEqual(p.maxModelLen);
  });

  it('a single decode costs at least the weight read, and never less than the roofline', () => {
    for (const p of Object.values(PROFILES)) {
      const floor = (p.weightBytes / p.hbmBytesPerS) * 1000;
      const t = stepTimeMs(p, decode(1, 500));
      expect(t).toBeGreaterThan(floor);
      expect(t).toBeLessThan(floor * 1.6);
    }
  });

  it('decode is memory-bound: 16 sequences cost far less than 16 single steps', () => {
    const p = getProfile('llama3-8b-h100');
    expect(stepTimeMs(p, decode(16, 300))).toBeLessThan(2 * stepTimeMs(p, decode(1, 300)));
    expect(stepTimeMs(p, decode(256, 2000))).toBeGreaterThan(stepTimeMs(p, decode(256, 200)));
  });

  it('prefill is compute-bound: a full 8192-token chunk scales with tokens, A100 slower than H100', () => {
    const h100 = getProfile('llama3-8b-h100');
    const a100 = getProfile('llama3-8b-a100');
    const prefill = (n: number) => prefillAfter(n);
    const big = stepTimeMs(h100, prefill(8192));
    expect(big).toBeGreaterThan(3.5 * stepTimeMs(h100, prefill(2048)));
    expect(stepTimeMs(a100, prefill(2048))).toBeGreaterThan(2 * stepTimeMs(h100, prefill(2048)));
  });

  it('prefill attention is quadratic: a chunk late in a long prompt costs more than the same chunk at its start', () => {
    const p = getProfile('llama3-8b-a100');
    const noAttn = { ...p, attnFlopsPerPair: 0 };
    // The same 2,048 tokens: alone, and after 6,000 tokens already computed (a long prompt's last
    // chunk, or a question after a long cached prefix).
    const first = stepTimeMs(p, prefillAfter(2048));
    const late = stepTimeMs(p, prefillAfter(2048, 6000));
    expect(late).toBeGreaterThan(first * 1.1);
    // What the term adds: 4 × 32 × 4096 FLOP per pair at the profile's MFU.
    const pairs = 2048 * 6000 + (2048 * 2049) / 2;
    const expected = (p.attnFlopsPerPair * pairs) / ((p.peakFlops * p.mfu) / 1000);
    expect(late - stepTimeMs(noAttn, prefillAfter(2048, 6000))).toBeCloseTo(expected, 6);
    // A decode step's attention is its KV read alone.
    expect(stepTimeMs(p, decode(64, 4000))).toBe(stepTimeMs(noAttn, decode(64, 4000)));
  });

  it('tensor parallelism adds collective time', () => {
    const p = getProfile('llama3-70b-h100-tp4');
    const withoutComm = { ...p, commFixedMs: 0, commMsPerToken: 0 };
    expect(stepTimeMs(p, decode(1, 100))).toBeGreaterThan(stepTimeMs(withoutComm, decode(1, 100)) + 1);
  });
});
