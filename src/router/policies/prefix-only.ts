import { byCost, type Random, withRoom } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/**
 * The longest prefix match among the backends with room now wins, whatever their load; ties (no
 * match anywhere included) at random. A baseline after vLLM production-stack's `prefixaware`
 * routing. Reads: hasRoom, cachedBlocks.
 */
export function prefixOnly(random: Random = Math.random): RoutingPolicy {
  return {
    name: 'prefix_only',
    rank(_req: RouteRequest, backends: readonly BackendView[]): Candidate[] {
      return byCost(
        withRoom(backends).map((b) => ({ backend: b.name, cost: -b.cachedBlocks })),
        random,
      );
    },
  };
}
