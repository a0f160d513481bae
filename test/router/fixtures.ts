// Requests and backend views for the router's, the scheduler's and admission's unit tests.
import type { BackendView, RouteRequest, RoutingPolicy } from '../../src/router/types.ts';

export function route(over: Partial<RouteRequest> = {}): RouteRequest {
  return {
    reqId: 'r',
    promptTokens: 100,
    blocks: [],
    blockSizeTokens: 16,
    tokensPerBlock: 16,
    outputTokensPerSequence: 100,
    tpotTargetMs: 50,
    ...over,
  };
}

/** A backend with no fit yet (no prediction) unless `over` gives one. */
export function view(name: string, over: Partial<BackendView> = {}): BackendView {
  return {
    name,
    weight: 1,
    hasRoom: true,
    slotWaitMs: 0,
    inflight: 0,
    cachedBlocks: 0,
    cachedTokens: 0,
    uncachedTokens: 100,
    predictedTtftMs: null,
    prefillMs: null,
    tpotMs: null,
    cacheFill: 0,
    ...over,
  };
}

/** A router that ranks `first` first whatever the views say, the others after it in their order. */
export function rankingFirst(first: string): RoutingPolicy {
  return {
    name: `${first}-first`,
    rank: (_r, views) =>
      [...views]
        .sort((x, y) => (x.name === first ? 0 : 1) - (y.name === first ? 0 : 1))
        .map((v) => ({ backend: v.name, cost: 0 })),
  };
}
