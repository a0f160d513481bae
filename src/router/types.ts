// The router's contract: given one request and every available backend it may use (a retry's
// tried backends left out), each saying whether it can start the request now and how long a slot
// there would take, rank them best first. The scheduler starts the request on the first when it
// has room; when it has none, the request waits for that backend (and later requests do not take
// it meanwhile), so a policy that ranks a busy backend first is choosing to wait for it. Policies
// are pure functions of these two views (plus their own small memory, such as a round robin's
// position or a session's last backend): everything they read is computed for them from the live
// state, so a policy never reads the clock, the network or another module.

/** What a policy may read about a backend, for this request. */
export interface BackendView {
  readonly name: string;
  /** Relative capacity from the config (default 1). */
  readonly weight: number;
  /**
   * It can start this request now: a slot under its concurrency limit that no earlier waiting
   * request is owed, and room for this prompt's prefill (`scheduler.concurrency.prefill_tokens`).
   */
  readonly hasRoom: boolean;
  /**
   * Predicted wait for a slot there, ms: 0 with room; else the requests of this pump waiting for
   * it, this one included, less its free slots, over the rate it frees slots, and at least the
   * prefill those requests will add there at its prefill rate (with slots for all of them, that
   * prefill alone: prefill room holds them; the backlog already on the backend is in
   * predictedTtftMs). Null when the rate it frees slots is needed and not measured yet.
   */
  readonly slotWaitMs: number | null;
  /** Requests the backend runs now, every gateway instance. */
  readonly inflight: number;
  /** Leading blocks of this prompt the backend is believed to hold in its prefix cache. */
  readonly cachedBlocks: number;
  /** Tokens of this prompt believed cached there (blocks × tokens per block, below the prompt). */
  readonly cachedTokens: number;
  /** The prompt's tokens the backend would have to prefill: promptTokens − cachedTokens. */
  readonly uncachedTokens: number;
  /**
   * Predicted dispatch-to-first-token time on this backend with `uncachedTokens` to prefill, ms:
   * the base, the prefill already waiting there, this prompt's own prefill, the load term (the
   * live state's fit). Null when the backend has no fit yet.
   */
  readonly predictedTtftMs: number | null;
  /** The part of predictedTtftMs that is this prompt's own prefill, ms; null without a fit. */
  readonly prefillMs: number | null;
  /** Predicted TPOT on this backend with this request added, ms; null without a fit. */
  readonly tpotMs: number | null;
  /** How full the prefix index believes this backend's cache is: blocks held ÷ capacity, 0..1. */
  readonly cacheFill: number;
}

/** What a policy may read about the request. */
export interface RouteRequest {
  readonly reqId: string;
  /** Estimated prompt tokens (exact for token-id prompts). */
  readonly promptTokens: number;
  /** Chained hashes of the canonical prompt's blocks (src/prompt). */
  readonly blocks: readonly number[];
  /** The block size `blocks` were hashed at (`router.block_size_tokens` when the request came in). */
  readonly blockSizeTokens: number;
  /** Tokens one block stands for (estimated from characters for text prompts). */
  readonly tokensPerBlock: number;
  /**
   * The backend reads no prefix cache for it (it asks for its prompt's logprobs): no backend holds
   * any of it for this request, though its blocks are cached once it is sent (cachedOn).
   */
  readonly readsNoCache?: true | undefined;
  /**
   * The decode steps one sequence is expected to take (its `n` choices, or several completion
   * prompts, decode side by side): its tenant's learnt output per sequence, or its max_tokens when
   * that is fewer.
   */
  readonly outputTokensPerSequence: number;
  /** The request's class TPOT target, ms. */
  readonly tpotTargetMs: number;
  readonly sessionId?: string | undefined;
  /**
   * Cached prompt tokens per backend as the backends themselves report them, when a policy
   * asked them (the benchmark-only `oracle`); used instead of the prefix index.
   */
  readonly knownCachedTokens?: ReadonlyMap<string, number> | undefined;
}

export interface Candidate {
  readonly backend: string;
  /** Lower is better; the unit is the policy's own (seconds for the slagate cost). */
  readonly cost: number;
  /** The cost's terms, for the debug log line (names → values). */
  readonly terms?: Readonly<Record<string, number | string | null>>;
}

/** Where each backend of a `prepare` step can be reached. */
export interface BackendAddress {
  readonly name: string;
  readonly url: string;
}

export interface RoutingPolicy {
  readonly name: string;
  /**
   * Best first. Never empty when `backends` is not. Must not mutate its inputs. A first backend
   * without room means the request waits for it.
   */
  rank(req: RouteRequest, backends: readonly BackendView[]): Candidate[];
  /**
   * Optional: the scheduler says where an attempt of `req` was sent, once per attempt, when it
   * is granted. A request that waits is ranked many times and may be sent to a backend other than
   * the policy's first (the scheduler passes over one where the request would be late), so memory
   * of where requests went (a session's backend) is kept here, not in `rank`.
   */
  sent?(req: RouteRequest, backend: string): void;
  /**
   * Optional, asynchronous, before admission: what the policy needs that the live state does not
   * have (the oracle asks each backend for its cached tokens). Never awaited by other policies.
   */
  prepare?(req: RouteRequest, backends: readonly BackendAddress[], body: unknown): Promise<RouteRequest>;
}
