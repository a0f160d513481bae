// How long one engine step takes on a profile, from the roofline of the kernels it runs.
//
//   tokens   = prefillTokens + decodeSeqs
//   gemm     = max(weightBytes / (hbm × memEfficiency), 2 × params × tokens / (peakFlops × mfu))
//   attn     = kvBytesPerToken × contextTokens / (hbm × memEfficiency)
//            + attnFlopsPerPair × prefillAttnPairs / (peakFlops × mfu)
//   comm     = commFixedMs + commMsPerToken × tokens                       (tensor parallel only)
//   host     = stepOverheadMs + perSeqOverheadMs × seqs
//   step     = host + gemm + attn + comm
//
// The weight GEMMs read every weight once per step whatever the batch, and do 2 FLOP per
// parameter per token: with few tokens they wait on memory, with many on compute, so their
// time is the larger of the two (one roofline). Attention reads each scheduled sequence's KV in
// separate kernels, collectives and host work do not overlap the GEMMs in vLLM's synchronous
// step, so those terms add. A prefill chunk's attention also computes every query against its
// whole context so far, quadratic in the prompt: about 11% of a cold 7,000-token prompt's prefill
// for an 8B model, and more of a chunk late in a long prompt or after a long cached prefix (a
// decode token's attention FLOPs are far below the time its KV read takes, and are left out).

import type { GpuProfile, StepShape } from './profile-types.ts';

export function stepTimeMs(p: GpuProfile, s: StepShape): number {
  const bytesPerMs = (p.hbmBytesPerS * p.memEfficiency) / 1000;
  const flopsPerMs = (p.peakFlops * p.mfu) / 1000;
  const tokens = s.prefillTokens + s.decodeSeqs;
  const weightMs = p.weightBytes / bytesPerMs;
  const computeMs = (2 * p.paramsB * 1e9 * tokens) / flopsPerMs;
  const attnMs =
    (p.kvBytesPerToken * s.contextTokens) / bytesPerMs +
    (p.attnFlopsPerPair * s.prefillAttnPairs) / flopsPerMs;
  const commMs = (p.commFixedMs ?? 0) + (p.commMsPerToken ?? 0) * tokens;
  const hostMs = p.stepOverheadMs + p.perSeqOverheadMs * s.seqs;
  return hostMs + Math.max(weightMs, computeMs) + attnMs + commMs;
}
