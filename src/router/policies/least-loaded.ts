import { byCost, type Random, withRoom } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/**
 * Fewest in-flight requests per unit of weight first, ties at random, among the backends with
 * room now. Reads: hasRoom, inflight, weight.
 */
export function leastLoaded(random: Random = Math.random): RoutingPolicy {
  return {
    name: 'least_loaded',
    rank(_req: RouteRequest, backends: readonly BackendView[]): Candidate[] {
      return byCost(
        withRoom(backends).map((b) => ({ backend: b.name, cost: b.inflight / Math.max(b.weight, 1e-9) })),
        random,
      );
    },
  };
}
