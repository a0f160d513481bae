import { byCost, type Random } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/**
 * The longest prefix match wins, whatever the load; ties (no match anywhere included) at random.
 * A baseline after vLLM production-stack's `prefixaware` routing. Reads: cachedBlocks only.
 */
export function prefixOnly(random: Random = Math.random): RoutingPolicy {
  return {
    name: 'prefix_only',
    rank(_req: RouteRequest, backends: readonly BackendView[]): Candidate[] {
      return byCost(
        backends.map((b) => ({ backend: b.name, cost: -b.cachedBlocks })),
        random,
      );
    },
  };
}
