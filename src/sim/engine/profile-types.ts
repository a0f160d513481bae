// A GPU profile: what one simulated vLLM replica is (model, hardware, engine limits) and the
// numbers its step-time formula uses. Values and their sources live in ../profiles.ts and
// docs/simulator.md.

export interface GpuProfile {
  name: string;
  /** Served model name, e.g. meta-llama/Llama-3.1-8B-Instruct. */
  model: string;
  maxModelLen: number;

  // Engine limits (vLLM SchedulerConfig / CacheConfig).
  maxNumBatchedTokens: number;
  maxNumSeqs: number;
  blockSize: number;
  numGpuBlocks: number;

  // Hardware and model facts the roofline uses.
  /** Parameters of the model, in billions. */
  paramsB: number;
  /** Bytes of weights read per step, across all GPUs of the replica. */
  weightBytes: number;
  /** KV cache bytes per token (all layers, K and V). */
  kvBytesPerToken: number;
  /**
   * Attention FLOPs of one query token against one context token, all layers: 4 × layers × the
   * query width (heads × head dim; QKᵀ and AV, 2 FLOP per multiply-add each). Grouped KV heads
   * shrink the KV read, not these.
   */
  attnFlopsPerPair: number;
  /** Aggregate HBM bandwidth of the replica, bytes/s. */
  hbmBytesPerS: number;
  /** Aggregate dense BF16 peak, FLOP/s. */
  peakFlops: number;
  /** Fraction of peak that prefill GEMMs reach. */
  mfu: number;
  /** Fraction of HBM bandwidth decode reaches. */
  memEfficiency: number;
  /** Fixed per-step cost (scheduler, kernel launches, sampling), ms. */
  stepOverheadMs: number;
  /** Per-sequence per-step host cost (input prep, sampling, detokenize), ms. */
  perSeqOverheadMs: number;
  /** API-server time before a request reaches the engine (HTTP, tokenization), ms. */
  frontendOverheadMs: number;
  /** Tensor-parallel collectives: fixed per-step cost (all-reduce latency × count), ms. */
  commFixedMs?: number;
  /** Tensor-parallel collectives: cost per token in the step (all-reduce bytes / link bandwidth), ms. */
  commMsPerToken?: number;
}

/** What one step asks of the GPU; the step-time formula reads only this. */
export interface StepShape {
  /** Prompt tokens computed this step (all prefill chunks). */
  prefillTokens: number;
  /** Sequences decoding one token this step. */
  decodeSeqs: number;
  /** Sequences in the step (prefill chunks + decodes). */
  seqs: number;
  /** KV tokens read by attention this step (sum of context lengths of scheduled sequences). */
  contextTokens: number;
  /**
   * Query-context token pairs the prefill chunks' causal attention computes: for a chunk of n new
   * tokens after c computed ones, n·c + n(n+1)/2. Decode's attention is bound by its KV read.
   */
  prefillAttnPairs: number;
}
