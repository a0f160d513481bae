import { byCost, promote, type Random, withRoom } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/** SGLang Model Gateway's documented defaults (research/peers.md section 4). */
export const CACHE_AWARE_DEFAULTS = { cacheThreshold: 0.3, balanceAbs: 64, balanceRel: 1.5 };

/**
 * A baseline after SGLang's cache-aware load balancer. When the load is imbalanced (the busiest
 * backend runs more than `balanceAbs` requests over the idlest and more than `balanceRel` times
 * it), the shortest queue wins. Otherwise the best prefix match wins if it covers more than
 * `cacheThreshold` of the prompt, else the least loaded backend; among the backends with room now.
 * The least loaded on a miss is SGLang's router since its PR #14650 (December 2025); before that it
 * took the backend with the smallest prefix tree. Reads: hasRoom, inflight, cachedTokens.
 */
export function cacheAware(random: Random = Math.random, p = CACHE_AWARE_DEFAULTS): RoutingPolicy {
  return {
    name: 'cache_aware',
    rank(req: RouteRequest, all: readonly BackendView[]): Candidate[] {
      const backends = withRoom(all);
      const byLoad = byCost(
        backends.map((b) => ({ backend: b.name, cost: b.inflight })),
        random,
      );
      if (backends.length === 0) return byLoad;
      let max = Number.NEGATIVE_INFINITY;
      let min = Number.POSITIVE_INFINITY;
      for (const b of backends) {
        max = Math.max(max, b.inflight);
        min = Math.min(min, b.inflight);
      }
      if (max - min > p.balanceAbs && max > p.balanceRel * min) return byLoad;
      const best = byCost(
        backends.map((b) => ({ backend: b.name, cost: -b.cachedTokens })),
        random,
      )[0] as Candidate;
      const share = req.promptTokens > 0 ? -best.cost / req.promptTokens : 0;
      return share > p.cacheThreshold ? promote(byLoad, best.backend) : byLoad;
    },
  };
}
