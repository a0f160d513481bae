import { byCost, promote, type Random } from '../pick.ts';
import type { BackendView, Candidate, RouteRequest, RoutingPolicy } from '../types.ts';

export interface SlagateOptions {
  /**
   * Share of requests sent where their prefill would start soonest among the backends with room
   * that hold the most of the prompt (all of them for a prompt none holds); none explores when
   * every backend holding that much is busy.
   */
  exploreRatio: number;
  /**
   * The TTFT predictor's typical relative error (its median |actual ÷ predicted − 1|), or null
   * before it has one: costs closer than that to the lowest are ties.
   */
  tolerance: () => number | null;
  random?: Random;
}

/** Sessions remembered for affinity (least recently routed forgotten first). */
const SESSIONS = 65_536;

/**
 * The default policy: the lowest predicted cost in seconds.
 *
 *   cost = the wait for a slot there (0 with room now; else the requests waiting for it over
 *          the rate it frees slots: every backend is ranked, busy ones too, and a request whose
 *          best backend is busy waits for it rather than go cold elsewhere)
 *        + predicted TTFT on the backend with its own uncached tokens to prefill (the live
 *          state's fit: base + prefill waiting there + this prefill + load term)
 *        + decode pressure suffered: how much the request's output would take longer than its
 *          class allows there, max(0, TPOT with it added − TPOT target) × one sequence's expected output tokens (n choices decode side by side)
 *        + decode pressure caused: its prefill time there × the requests running there, each of
 *          which waits about that long in the steps that carry the prefill
 *        + cache displaced: its prefill time there × how full that backend's cache is (the tokens
 *          the prefix index holds there ÷ its KV cache): what a miss on a full cache evicts, someone
 *          prefills again
 *
 * Costs within the predictor's typical error of the lowest are ties: among them one that can start
 * the request now wins, then the backend this request's session last went to, then the one
 * holding more of the prompt, then the lowest. So affinity holds only while it costs no more than
 * the predictor can tell apart, and a hot prefix spreads once its backend is predicted slower by
 * more than that. A share of `exploreRatio` goes where the prefill would start soonest among the
 * backends with room that hold the most of its prompt (any backend with room, for a prompt none
 * holds): a prompt nobody holds, and ties between holders, are placed by the work ahead rather
 * than by the cost, and no exploration throws a cached prefix away.
 * Before every backend has a fit (a cold start) the cost is LMetric's uncached tokens × (requests
 * running + 1), in token-requests rather than seconds, over the backends with room: no wait is
 * planned on without a fit.
 *
 * Reads: hasRoom, slotWaitMs, predictedTtftMs, prefillMs, tpotMs, cacheFill, cachedBlocks,
 * uncachedTokens, inflight, weight.
 */
export function slagate(opts: SlagateOptions, name = 'slagate'): RoutingPolicy {
  const random = opts.random ?? Math.random;
  const sessions = new Map<string, string>();
  // Invariant: whether a request explores is drawn once per request, not once per ranking. A
  // request that waits for a busy backend is ranked again at every pump (hundreds a second under
  // load); a draw per ranking explored about half of those that waited 300 ms, each sent to a
  // backend that holds none of its prompt, where a cold prefill made it late and the queue guard
  // refused it (docs/benchmarks.md, "Refusals where the router's first choice was late").
  const drawn = new WeakMap<RouteRequest, boolean>();
  const explores = (req: RouteRequest): boolean => {
    if (opts.exploreRatio <= 0) return false;
    let e = drawn.get(req);
    if (e === undefined) {
      e = random() < opts.exploreRatio;
      drawn.set(req, e);
    }
    return e;
  };
  return {
    name,
    rank(req: RouteRequest, backends: readonly BackendView[]): Candidate[] {
      if (backends.length === 0) return [];
      const fitted = backends.every((b) => b.predictedTtftMs !== null);
      const ranked = byCost(
        backends.map((b) => (fitted ? seconds(req, b) : lmetric(b))),
        random,
      );
      const explored = explores(req) ? soonestStart(backends, random) : null;
      const chosen =
        explored ??
        tieBreak(ranked, backends, fitted ? (opts.tolerance() ?? 0) : 0, sessionOf(req, sessions));
      return promote(ranked, chosen);
    },
    sent(req: RouteRequest, backend: string): void {
      if (req.sessionId !== undefined) remember(sessions, req.sessionId, backend);
    },
  };
}

function seconds(req: RouteRequest, b: BackendView): Candidate {
  // A wait nobody can predict yet (the backend has freed no slot so far) is not planned on.
  const waitMs = b.slotWaitMs ?? Number.POSITIVE_INFINITY;
  const ttftMs = b.predictedTtftMs as number;
  // Suffered: its own output decoded slower than its class allows there.
  const sufferMs =
    b.tpotMs === null
      ? 0
      : Math.max(0, b.tpotMs - req.tpotTargetMs) * Math.max(0, req.outputTokensPerSequence);
  // Caused: its prefill runs in the steps of every sequence decoding there, each delayed by about
  // that prefill's time. This is what makes a miss expensive for the replica as well as for the
  // request, and what keeps a prefix where it is cached until the load says otherwise.
  const causeMs = (b.prefillMs ?? 0) * b.inflight;
  // Displaced: on a full cache the blocks this prefill writes evict as many cached ones, which
  // someone prefills again when they come back. Charged at this backend's rate, in full (as if
  // every evicted block would be asked for again): the bound that keeps a fleet whose caches are
  // full from trading one tenant's hit for another's miss.
  const evictMs = (b.prefillMs ?? 0) * b.cacheFill;
  const decodeMs = sufferMs + causeMs;
  return {
    backend: b.name,
    cost: (waitMs + ttftMs + decodeMs + evictMs) / 1000,
    terms: {
      wait_s: Number.isFinite(waitMs) ? round(waitMs / 1000) : null,
      ttft_s: round(ttftMs / 1000),
      prefill_s: b.prefillMs === null ? null : round(b.prefillMs / 1000),
      // A term whose input is not measured yet is planned on as 0 and logged as null.
      decode_s: b.tpotMs === null ? null : round(sufferMs / 1000),
      stall_s: b.prefillMs === null ? null : round(causeMs / 1000),
      evict_s: b.prefillMs === null ? null : round(evictMs / 1000),
      cached_tokens: Math.round(b.cachedTokens),
      inflight: b.inflight,
    },
  };
}

function lmetric(b: BackendView): Candidate {
  return {
    backend: b.name,
    cost: b.hasRoom
      ? (Math.max(1, b.uncachedTokens) * (b.inflight + 1)) / Math.max(b.weight, 1e-9)
      : Number.POSITIVE_INFINITY,
    terms: {
      lmetric: 'uncached×(inflight+1)',
      cached_tokens: Math.round(b.cachedTokens),
      inflight: b.inflight,
    },
  };
}

/**
 * Among the costs within `tolerance` of the lowest: one with room now, then the session's backend,
 * then more cached blocks, then the lowest (compared in that order).
 */
function tieBreak(
  ranked: readonly Candidate[],
  backends: readonly BackendView[],
  tolerance: number,
  session: string | undefined,
): string {
  const best = ranked[0] as Candidate;
  const limit = best.cost + Math.abs(best.cost) * tolerance;
  const byName = new Map(backends.map((b) => [b.name, b]));
  // c is preferred to p: room now, else the session's backend, else more cached blocks.
  const preferred = (c: Candidate, p: Candidate): boolean => {
    const cb = byName.get(c.backend);
    const pb = byName.get(p.backend);
    const cRoom = cb?.hasRoom === true;
    if (cRoom !== (pb?.hasRoom === true)) return cRoom;
    const cSession = c.backend === session;
    if (cSession !== (p.backend === session)) return cSession;
    return (cb?.cachedBlocks ?? 0) > (pb?.cachedBlocks ?? 0);
  };
  let pick = best;
  for (const c of ranked) {
    if (c.cost > limit) break;
    if (preferred(c, pick)) pick = c;
  }
  return pick.backend;
}

/**
 * Where this request's own prefill would start soonest (the least predicted work ahead of it),
 * among the backends with room now that hold the most of its prompt any backend holds; null (the
 * request does not explore) when every backend holding that much is busy.
 *
 * Invariant: exploring never costs a cache hit. Drawn among all backends, a 1% share of the
 * prefix-sharing benchmark's requests went to a replica holding none of a 5,000-token prompt
 * that another held: each a cold prefill that stalled that replica's batch and evicted another
 * tenant's prefix (P90 TTFT 546 ms and hit rate 79.6%, against 515 ms and 81.5% with no
 * exploration; docs/benchmarks.md, "Cold prefills the router caused"). A hot prefix is spread by
 * the cost, once its backend is predicted slower by more than the tie margin.
 */
function soonestStart(backends: readonly BackendView[], random: Random): string | null {
  let most = 0;
  for (const b of backends) most = Math.max(most, b.cachedBlocks);
  const holders = backends.filter((b) => b.hasRoom && b.cachedBlocks === most);
  if (holders.length === 0) return null;
  // One unit for all: milliseconds of predicted wait when every holder has a fit, else requests in
  // flight per weight (a fitted holder's tens of milliseconds against an unfitted one's handful of
  // requests would send every exploring request to the backend that has no fit yet).
  const fitted = holders.every((b) => b.predictedTtftMs !== null && b.prefillMs !== null);
  const ahead = holders.map((b) => ({
    backend: b.name,
    cost: fitted
      ? (b.predictedTtftMs as number) - (b.prefillMs as number)
      : b.inflight / Math.max(b.weight, 1e-9),
  }));
  return (byCost(ahead, random)[0] as Candidate).backend;
}

function sessionOf(req: RouteRequest, sessions: Map<string, string>): string | undefined {
  return req.sessionId === undefined ? undefined : sessions.get(req.sessionId);
}

function remember(sessions: Map<string, string>, id: string, backend: string): void {
  sessions.delete(id);
  sessions.set(id, backend);
  if (sessions.size > SESSIONS) sessions.delete(sessions.keys().next().value as string);
}

const round = (x: number): number => Math.round(x * 1e4) / 1e4;
