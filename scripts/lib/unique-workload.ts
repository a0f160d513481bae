// Unique prompts for the request-path benchmarks: no two requests share a first block, so no cache
// or index helps any path. `short` is 512 characters, `long` about 8,000 tokens (32,000 characters).
import { syntheticText } from '../../src/bench/text.ts';
import type { Workload, WorkloadRequest } from '../../src/bench/workloads.ts';
import { Rng } from '../../src/sim/rng.ts';

/** Workloads made so far in this process: each call's nonces differ, whatever its seed. */
let made = 0;

/**
 * Unique prompts, made before any clock starts; each begins with its own nonce. Unique across
 * calls too: two cells of a run given the same seed must not send each other's prompts (the
 * gateway's prefix index would find them).
 */
export function uniqueWorkload(
  kind: 'short' | 'long',
  n: number,
  outputTokens: number,
  seed: number,
): Workload {
  const rng = new Rng(seed);
  const call = made++;
  const prompts: string[] = [];
  for (let i = 0; i < n; i++) {
    const nonce = `Request ${seed}-${call}-${i}-${rng.int(0, 1e9)}. `;
    prompts.push(
      kind === 'short' ? (nonce + syntheticText(rng, 140)).slice(0, 512) : nonce + syntheticText(rng, 8000),
    );
  }
  let i = 0;
  return {
    name: 'sharegpt',
    ignoreEos: true,
    next(): WorkloadRequest {
      const content = prompts[i % n]!;
      const req = {
        index: i,
        messages: [{ role: 'user' as const, content }],
        promptTokens: Math.round(content.length / 4),
        outputTokens,
      };
      i++;
      return req;
    },
  };
}
