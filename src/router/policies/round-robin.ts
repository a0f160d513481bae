import { withRoom } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

/**
 * Weighted round robin over the available backends with room now. The cursor advances once per
 * request, so the i-th request starts at the i-th slot of a ring where a backend of weight w holds
 * w slots; backends that are out (ejected, unhealthy) are simply absent from the list it is given.
 *
 * Invariant: a request keeps its place in the ring however often it is ranked (the scheduler ranks
 * a waiting request at every pump, a retry again), so the cursor counts requests, not rankings.
 * The ring is of the backends with room (withRoom, as for every baseline: the peers it copies
 * dispatch at once and never hold a request back), so a request that waited for its place's
 * backend while all were full goes to whichever frees a slot first. Under the benchmark's cap,
 * which never binds, every backend has room and the ring is the whole fleet's.
 */
export function roundRobin(): RoutingPolicy {
  let cursor = 0;
  const places = new WeakMap<RouteRequest, number>();
  return {
    name: 'round_robin',
    rank(req: RouteRequest, all: readonly BackendView[]): Candidate[] {
      const backends = withRoom(all);
      if (backends.length === 0) return [];
      const ring: string[] = [];
      for (const b of backends) for (let i = 0; i < Math.max(1, Math.round(b.weight)); i++) ring.push(b.name);
      let place = places.get(req);
      if (place === undefined) {
        place = cursor++;
        places.set(req, place);
      }
      const start = place % ring.length;
      const order: Candidate[] = [];
      const seen = new Set<string>();
      for (let i = 0; i < ring.length && seen.size < backends.length; i++) {
        const name = ring[(start + i) % ring.length]!;
        if (seen.has(name)) continue;
        seen.add(name);
        order.push({ backend: name, cost: order.length });
      }
      return order;
    },
  };
}
