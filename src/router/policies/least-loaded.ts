import { byCost, type Random } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/** Fewest in-flight requests per unit of weight first, ties at random. Reads: inflight, weight. */
export function leastLoaded(random: Random = Math.random): RoutingPolicy {
  return {
    name: 'least_loaded',
    rank(_req: RouteRequest, backends: readonly BackendView[]): Candidate[] {
      return byCost(
        backends.map((b) => ({ backend: b.name, cost: b.inflight / Math.max(b.weight, 1e-9) })),
        random,
      );
    },
  };
}
