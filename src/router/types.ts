// The router's contract: given one request and the backends that may take it right now, rank
// them best first. The upstream layer walks that ranking, skipping backends already tried, so a
// retry lands on the next-best backend rather than a random one.

/** What a policy may read about a backend. Kept small so policies stay pure and testable. */
export interface BackendView {
  readonly name: string;
  /** Requests this gateway has dispatched to the backend and not yet finished. */
  readonly inflight: number;
  /** Relative capacity from the config (default 1). */
  readonly weight: number;
}

/** What a policy may read about the request. */
export interface RouteRequest {
  readonly reqId: string;
  readonly promptTokensEst: number;
  readonly sessionId?: string | undefined;
}

export interface Candidate {
  readonly backend: string;
  /** Lower is better; the unit is the policy's own (seconds for cost-based policies). */
  readonly cost: number;
}

export interface RoutingPolicy {
  readonly name: string;
  /** Best first. Never empty when `backends` is not. Must not mutate its inputs. */
  rank(req: RouteRequest, backends: readonly BackendView[]): Candidate[];
}
