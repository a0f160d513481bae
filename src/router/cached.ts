// How much of a prompt a backend holds: the one computation the admission controller (its
// prediction at arrival) and the scheduler (the views it gives the router at grant) share, so the
// queue orders by the same uncached work the router weighs.
import type { RouteRequest } from './types.ts';

export interface Cached {
  /** Leading blocks of the prompt held. */
  blocks: number;
  /** Prompt tokens held; always below the prompt (vLLM computes the last token). */
  tokens: number;
  /** promptTokens − tokens. */
  uncached: number;
}

/** `match(backend, hashes)`: leading blocks the prefix index says `backend` holds. */
export type PrefixMatch = (backend: string, hashes: readonly number[]) => number;

export function cachedOn(req: RouteRequest, backend: string, match: PrefixMatch): Cached {
  if (req.readsNoCache === true) return { blocks: 0, tokens: 0, uncached: req.promptTokens };
  const ceiling = Math.max(0, req.promptTokens - 1);
  const known = req.knownCachedTokens?.get(backend);
  let blocks: number;
  let tokens: number;
  if (known !== undefined) {
    tokens = Math.min(ceiling, Math.max(0, known));
    blocks = Math.min(req.blocks.length, Math.floor(tokens / Math.max(1e-9, req.tokensPerBlock)));
  } else {
    blocks = req.blocks.length === 0 ? 0 : match(backend, req.blocks);
    tokens = Math.min(ceiling, Math.round(blocks * req.tokensPerBlock));
  }
  return { blocks, tokens, uncached: req.promptTokens - tokens };
}
