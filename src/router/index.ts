import { leastLoaded } from './policies/least-loaded.ts';
import { roundRobin } from './policies/round-robin.ts';
import type { RoutingPolicy } from './types.ts';

export type { BackendView, Candidate, RouteRequest, RoutingPolicy } from './types.ts';

/** Policies implemented so far; the YAML schema also names the ones the scheduler work adds. */
const FACTORIES: Record<string, () => RoutingPolicy> = {
  round_robin: roundRobin,
  least_loaded: () => leastLoaded(),
};

export function createRoutingPolicy(name: string): RoutingPolicy {
  const make = FACTORIES[name];
  if (make === undefined) {
    throw new Error(
      `router.policy '${name}' is not implemented yet (available: ${Object.keys(FACTORIES).join(', ')})`,
    );
  }
  return make();
}
