// The contract between the simulated vLLM engine (src/sim/engine) and the HTTP front end
// (src/sim/server). The engine knows token ids and simulated time; the front end knows JSON,
// SSE and sockets. Nothing in the engine touches the network.

export type FinishReason = 'stop' | 'length' | 'abort';

/** What the front end hands the engine for one request. */
export interface EngineRequestSpec {
  /** Unique per engine; the front end makes it (vLLM: `chatcmpl-<x-request-id>`). */
  id: string;
  /** The whole prompt as token ids (chat template already applied). */
  promptTokens: readonly number[];
  /** Hard cap on generated tokens (vLLM `max_tokens`, default max_model_len - prompt). */
  maxTokens: number;
  /**
   * How many tokens the model "wants" to write before its EOS token when `ignoreEos` is false.
   * The front end draws it deterministically from the seed and the prompt; the engine stops at
   * min(maxTokens, naturalLength) with finish reason `stop` when naturalLength wins.
   */
  naturalLength: number;
  ignoreEos: boolean;
  /** Seed for the generated token ids (same seed and prompt → same output). */
  seed: number;
  /** Multiplies this request's share of step time (fault "slow down" per request); 1 = normal. */
  slowFactor?: number;
  /** vLLM's cache_salt: mixed into the first block's hash, so other salts share no cached block. */
  cacheSalt?: string | undefined;
  /** vLLM's skip_reading_prefix_cache: no cache hit is looked up (nor counted); its blocks are still cached. */
  skipReadingPrefixCache?: boolean | undefined;
}

/** Callbacks the engine calls; all of them run on the engine's own timer turn. */
export interface EngineSink {
  /** The request left the waiting queue for the first time (vLLM's SCHEDULED event). */
  onScheduled?(atMs: number): void;
  /**
   * One step produced a new output token for this request. `index` counts from 0; the first
   * call is the first token (TTFT). When `finish` is set this is the last token.
   */
  onToken(tokenId: number, index: number, finish: FinishReason | null): void;
}

/** Live counters of one engine, read by /metrics and by tests. */
export interface EngineStats {
  running: number;
  waiting: number;
  /** vLLM `kv_cache_usage_perc`: 1 - free/(numGpuBlocks - 1); cached blocks with refcount 0 are free. */
  kvCacheUsage: number;
  numGpuBlocks: number;
  blockSize: number;
  /** Totals since start, in tokens, as vLLM counts them. */
  prefixCacheQueries: number;
  prefixCacheHits: number;
  preemptions: number;
  promptTokens: number;
  generationTokens: number;
  steps: number;
}

/** Observation hooks for /metrics histograms (seconds, as vLLM reports them). */
export interface EngineObserver {
  onRequestFinished?(r: {
    id: string;
    reason: FinishReason;
    promptTokens: number;
    generationTokens: number;
    queueS: number;
    ttftS: number;
    e2eS: number;
    prefillS: number;
    decodeS: number;
  }): void;
  /** A request's first token: arrival to it, seconds (vLLM observes its TTFT then, not at the end). */
  onFirstToken?(ttftS: number): void;
  onInterTokenLatency?(seconds: number): void;
}

export interface Engine {
  add(spec: EngineRequestSpec, sink: EngineSink): void;
  /**
   * Client went away: the request leaves the running/waiting set within one step. False when the
   * engine no longer held it (it finished, or a crash dropped it with everything else).
   */
  abort(id: string): boolean;
  stats(): EngineStats;
  /** Oracle for benchmarks: how many leading tokens of `tokens` are cached right now. */
  cachedPrefixTokens(tokens: readonly number[], cacheSalt?: string): number;
  /** Slow every step down by `factor` (fault injection); 1 restores. */
  setSlowdown(factor: number): void;
  /**
   * Drop every request; with `restart` (a crash: a new process), the prefix cache and the
   * counters too, as a restarted vLLM starts cold and counts from 0.
   */
  reset(opts?: { restart?: boolean }): void;
  /** Stops the step loop; pending requests are dropped without callbacks. */
  close(): void;
}
