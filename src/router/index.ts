// The routing policies `router.policy` names, built from the router config. Every name the
// schema accepts is built here, so `check-config` and `serve` accept exactly the same policies.
import type { RouterPolicy } from '../config/index.ts';
import type { Random } from './pick.ts';
import { cacheAware } from './policies/cache-aware.ts';
import { leastLoaded } from './policies/least-loaded.ts';
import { oracle } from './policies/oracle.ts';
import { prefixOnly } from './policies/prefix-only.ts';
import { roundRobin } from './policies/round-robin.ts';
import { slagate } from './policies/slagate.ts';
import type { RoutingPolicy } from './types.ts';

export type {
  BackendAddress,
  BackendView,
  Candidate,
  RouteRequest,
  RoutingPolicy,
} from './types.ts';

export interface PolicyOptions {
  exploreRatio: number;
  /** The TTFT predictor's typical relative error, or null before it has one (slagate, oracle). */
  tolerance: () => number | null;
  random?: Random;
}

const FACTORIES: Record<RouterPolicy, (o: PolicyOptions) => RoutingPolicy> = {
  slagate: (o) => slagate(o),
  oracle: (o) => oracle(o),
  round_robin: () => roundRobin(),
  least_loaded: (o) => leastLoaded(o.random),
  prefix_only: (o) => prefixOnly(o.random),
  cache_aware: (o) => cacheAware(o.random),
};

export const ROUTER_POLICY_NAMES = Object.keys(FACTORIES) as RouterPolicy[];

export function createRoutingPolicy(name: RouterPolicy, opts: PolicyOptions): RoutingPolicy {
  return FACTORIES[name](opts);
}
