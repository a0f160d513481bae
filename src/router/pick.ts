// Small helpers the policies share: ranking by a cost with ties broken at random.
import type { Candidate } from './types.ts';

export type Random = () => number;

/**
 * Sorts by cost, lowest first; equal costs in a random order. A burst that arrives while every
 * backend reads the same must spread out, not herd onto the first backend of the list.
 */
export function byCost(
  scored: { backend: string; cost: number; terms?: Candidate['terms'] }[],
  random: Random,
): Candidate[] {
  const keyed = scored.map((s) => ({ s, tie: random() }));
  keyed.sort((a, b) => a.s.cost - b.s.cost || a.tie - b.tie);
  return keyed.map((k) => k.s);
}

/**
 * The backends that can start the request now, or all of them when none can. The baselines rank
 * only these: the peers they copy dispatch at once and never hold a request back for a backend.
 */
export function withRoom<T extends { readonly hasRoom: boolean }>(backends: readonly T[]): readonly T[] {
  const open = backends.filter((b) => b.hasRoom);
  return open.length > 0 ? open : backends;
}

/** `first` moved to the front of `ranked` (which is otherwise kept in order). */
export function promote(ranked: Candidate[], first: string): Candidate[] {
  const i = ranked.findIndex((c) => c.backend === first);
  if (i <= 0) return ranked;
  const [c] = ranked.splice(i, 1);
  ranked.unshift(c as Candidate);
  return ranked;
}
