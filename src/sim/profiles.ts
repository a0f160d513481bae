// Named GPU profiles of the simulated vLLM replica. Each number is either a hardware or model
// fact, a vLLM default, or a constant calibrated against a published measurement; the
// derivations and sources are in docs/simulator.md (section "Profiles").

import type { GpuProfile } from './engine/profile-types.ts';

export type { GpuProfile, StepShape } from './engine/profile-types.ts';
export { stepTimeMs } from './engine/step-time.ts';

const KiB = 1024;

/** Llama-3.1-8B: 32 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes. */
const LLAMA3_8B_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2;
/** Llama-3.1-70B: 80 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes. */
const LLAMA3_70B_KV_PER_TOKEN = 2 * 80 * 8 * 128 * 2;
/** Llama-3.1-8B's attention FLOPs per query-context pair: 4 × 32 layers × 4096 (32 heads × 128). */
const LLAMA3_8B_ATTN_FLOPS_PER_PAIR = 4 * 32 * 4096;
/** Llama-3.1-70B's: 4 × 80 layers × 8192 (64 heads × 128). */
const LLAMA3_70B_ATTN_FLOPS_PER_PAIR = 4 * 80 * 8192;

const H100_SXM = { hbmBytesPerS: 3.35e12, peakFlops: 989e12 };
const A100_40GB = { hbmBytesPerS: 1.555e12, peakFlops: 312e12 };

/** Host-side constants of vLLM's engine and API server, shared by the profiles. */
const VLLM_HOST = { stepOverheadMs: 0.4, perSeqOverheadMs: 0.1, frontendOverheadMs: 5 };

export const PROFILES: Record<string, GpuProfile> = {
  'llama3-8b-h100': {
    name: 'llama3-8b-h100',
    model: 'meta-llama/Llama-3.1-8B-Instruct',
    maxModelLen: 131072,
    maxNumBatchedTokens: 8192,
    maxNumSeqs: 1024,
    blockSize: 16,
    // 0.9 × 79.6 GiB − 15 GiB weights − ≈3.5 GiB activations/graphs ≈ 53 GiB ≈ 432k tokens.
    numGpuBlocks: 27000,
    paramsB: 8.03,
    weightBytes: 8.03e9 * 2,
    kvBytesPerToken: LLAMA3_8B_KV_PER_TOKEN,
    attnFlopsPerPair: LLAMA3_8B_ATTN_FLOPS_PER_PAIR,
    ...H100_SXM,
    mfu: 0.5,
    memEfficiency: 0.8,
    ...VLLM_HOST,
  },
  'llama3-8b-a100': {
    name: 'llama3-8b-a100',
    model: 'meta-llama/Llama-3.1-8B-Instruct',
    maxModelLen: 131072,
    // vLLM keeps A100 on the lower serve defaults (PR #17885).
    maxNumBatchedTokens: 2048,
    maxNumSeqs: 256,
    blockSize: 16,
    // A100-40GB: 0.9 × 39.6 GiB − 15 GiB weights − ≈3 GiB ≈ 17.6 GiB ≈ 144k tokens.
    numGpuBlocks: 9000,
    paramsB: 8.03,
    weightBytes: 8.03e9 * 2,
    kvBytesPerToken: LLAMA3_8B_KV_PER_TOKEN,
    attnFlopsPerPair: LLAMA3_8B_ATTN_FLOPS_PER_PAIR,
    ...A100_40GB,
    mfu: 0.65,
    memEfficiency: 0.8,
    ...VLLM_HOST,
  },
  'llama3-70b-h100-tp4': {
    name: 'llama3-70b-h100-tp4',
    model: 'meta-llama/Llama-3.1-70B-Instruct',
    maxModelLen: 131072,
    maxNumBatchedTokens: 8192,
    maxNumSeqs: 1024,
    blockSize: 16,
    // Per GPU: 0.9 × 79.6 GiB − 32.9 GiB weight shard − ≈4 GiB ≈ 34.8 GiB; × 4 ≈ 456k tokens.
    numGpuBlocks: 28000,
    paramsB: 70.6,
    weightBytes: 70.6e9 * 2,
    kvBytesPerToken: LLAMA3_70B_KV_PER_TOKEN,
    attnFlopsPerPair: LLAMA3_70B_ATTN_FLOPS_PER_PAIR,
    hbmBytesPerS: 4 * H100_SXM.hbmBytesPerS,
    peakFlops: 4 * H100_SXM.peakFlops,
    mfu: 0.45,
    memEfficiency: 0.8,
    ...VLLM_HOST,
    // 2 all-reduces per layer × 80 layers ≈ 160 × ~10 µs NVLink latency.
    commFixedMs: 1.6,
    // Ring all-reduce moves 2·(4−1)/4 × 16 KiB per token per all-reduce: 160 × 24 KiB ≈ 3.9 MB
    // per token at ≈360 GB/s effective NVLink ≈ 0.011 ms.
    commMsPerToken: ((160 * 1.5 * 16 * KiB) / 360e9) * 1000,
  },
};

export function getProfile(name: string): GpuProfile {
  const p = PROFILES[name];
  if (p === undefined) {
    throw new Error(`unknown GPU profile "${name}"; valid profiles: ${Object.keys(PROFILES).join(', ')}`);
  }
  return p;
}

/** KV capacity of a profile in tokens (for docs and sanity checks). */
export function kvCapacityTokens(p: GpuProfile): number {
  return (p.numGpuBlocks - 1) * p.blockSize;
}
