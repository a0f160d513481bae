import { request } from 'undici';
import type { BackendAddress, RouteRequest, RoutingPolicy } from '../types.ts';
import { type SlagateOptions, slagate } from './slagate.ts';

/** A replica that does not answer within this is taken to hold nothing of the prompt. */
const ASK_TIMEOUT_MS = 1_000;

/**
 * For benchmarks against the simulator only: the slagate cost, with each backend's cached tokens
 * asked of the backend itself (the simulator's `POST /sim/cached-tokens`) before admission
 * instead of estimated from the prefix index. It asks once, at arrival: a request that waits is
 * ranked on what the caches held then, and the requests of a burst of one new prefix all see it
 * cached nowhere (none has finished its prefill), where the index, written at each dispatch, keeps
 * them together. So it is not an upper bound on the index: the gap between it and `slagate` is
 * what the index's guesses cost against answers as old as the request's wait. A real vLLM has no
 * such endpoint: every backend then counts as holding nothing, and this policy is not for
 * production.
 */
export function oracle(opts: SlagateOptions): RoutingPolicy {
  const inner = slagate(opts, 'oracle');
  return {
    name: 'oracle',
    rank: inner.rank,
    sent: inner.sent,
    async prepare(
      req: RouteRequest,
      backends: readonly BackendAddress[],
      body: unknown,
    ): Promise<RouteRequest> {
      const payload = JSON.stringify(body);
      const known = new Map<string, number>();
      await Promise.all(
        backends.map(async (b) => {
          known.set(b.name, await cachedTokens(b.url, payload));
        }),
      );
      return { ...req, knownCachedTokens: known };
    },
  };
}

async function cachedTokens(url: string, payload: string): Promise<number> {
  try {
    const res = await request(`${url}/sim/cached-tokens`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: payload,
      headersTimeout: ASK_TIMEOUT_MS,
      bodyTimeout: ASK_TIMEOUT_MS,
    });
    const json = (await res.body.json()) as { cached_tokens?: unknown };
    return res.statusCode === 200 && typeof json.cached_tokens === 'number' ? json.cached_tokens : 0;
  } catch {
    return 0;
  }
}
