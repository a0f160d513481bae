import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/**
 * Fewest in-flight requests per unit of weight first. Ties are broken at random: a burst that
 * arrives while every backend reads the same load must spread out, not herd onto the first
 * backend of the list.
 */
export function leastLoaded(random: () => number = Math.random): RoutingPolicy {
  return {
    name: 'least_loaded',
    rank(_req: RouteRequest, backends: readonly BackendView[]): Candidate[] {
      const scored = backends.map((b) => ({
        backend: b.name,
        cost: b.inflight / Math.max(b.weight, 1e-9),
        tie: random(),
      }));
      scored.sort((a, b) => a.cost - b.cost || a.tie - b.tie);
      return scored.map(({ backend, cost }) => ({ backend, cost }));
    },
  };
}
