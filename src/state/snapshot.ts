// The compact state one instance publishes each refresh: its in-flight counts, its window totals
// and its fit sums per backend, and its tenants' usage. A snapshot is STATE, never a delta: writing the current one after
// an outage brings peers up to date at once, and nothing accumulated while Redis was down is
// replayed (there is nothing to replay). Version 2 added the tenants ("t") and changed the TTFT
// fit's first feature to the prefill work ahead of the request; a v1 peer's snapshot is skipped,
// so during a rolling upgrade old and new instances do not count each other.
//
// Wire form (JSON):
//   { "v": 1, "b": { <backend>: { "f": [requests, promptTokens, expectedOutputTokens, pendingPrefill],
//                                 "a": prefillAhead,
//                                 "w": { <class>: { "t": hist, "o": hist, "q": hist,
//                                                   "n": [requests, promptTokens, completionTokens] } },
//                                 "p": ttftFitSums, "d": tpotFitSums } },
//     "t": { <tenant>: [inflight, tokensInWindow] } }
//   hist = [count, sum, bin, n, bin, n, ...]   (see histogram.ts; t = TTFT, o = TPOT, q = queue)
//   prefillAhead: of the pendingPrefill, what the backend has not yet worked off at its fitted rate
//   (prefill-backlog.ts): what a request sent now waits for. A key of its own, added after v2: a
//   peer that predates it ignores it, and one that finds no "a" counts the whole pendingPrefill.

import { type BackendState, RemoteBackend } from './backend-state.ts';
import { MAX_REMOTE_TENANTS, type RemoteTenant, type TenantUsage } from './tenants.ts';
import type { LatencyMetric } from './window.ts';

const VERSION = 2;
const WIRE: Record<LatencyMetric, 't' | 'o' | 'q'> = { ttft: 't', tpot: 'o', queue: 'q' };

export function encodeSnapshot(
  backends: Iterable<BackendState>,
  tenants: Iterable<[string, TenantUsage]>,
  now: number,
  /** The rate each backend's backlog drains at, ms per token (null: none, e.g. while a peer has prefill ahead there). */
  msPerPrefillToken: (backend: string) => number | null = () => null,
): string {
  const b: Record<string, unknown> = {};
  for (const be of backends) {
    const w: Record<string, unknown> = {};
    for (const [cls, win] of be.windows) {
      win.advance(now);
      if (win.empty) continue;
      const t = win.total;
      w[cls] = {
        t: t.hist.ttft.encode(),
        o: t.hist.tpot.encode(),
        q: t.hist.queue.encode(),
        n: [t.counters.requests, t.counters.promptTokens, t.counters.completionTokens],
      };
    }
    be.ttftFit.decayTo(now);
    be.tpotFit.decayTo(now);
    const f = be.inflight;
    b[be.name] = {
      f: [f.requests, f.promptTokens, f.expectedOutputTokens, f.pendingPrefillTokens],
      a: be.prefillAhead(msPerPrefillToken(be.name)),
      w,
      p: be.ttftFit.stats.encode(),
      d: be.tpotFit.stats.encode(),
    };
  }
  const t: Record<string, [number, number]> = {};
  for (const [name, u] of tenants) t[name] = [u.inflight, u.tokens];
  return JSON.stringify({ v: VERSION, b, t });
}

/**
 * Sums peers' snapshots per backend. A snapshot that does not parse or has another version is
 * skipped whole; a malformed part of one is skipped on its own. Returns how many snapshots counted.
 */
export function mergeSnapshots(
  texts: readonly string[],
  into: Map<string, RemoteBackend>,
  tenants: Map<string, RemoteTenant>,
): number {
  let merged = 0;
  for (const text of texts) {
    let snap: unknown;
    try {
      snap = JSON.parse(text);
    } catch {
      continue;
    }
    if (!isObject(snap) || snap.v !== VERSION || !isObject(snap.b)) continue;
    merged++;
    for (const [name, raw] of Object.entries(snap.b)) {
      if (!isObject(raw)) continue;
      let remote = into.get(name);
      if (remote === undefined) {
        remote = new RemoteBackend();
        into.set(name, remote);
      }
      addInflight(remote, raw.f, raw.a);
      if (isObject(raw.w)) {
        for (const [cls, win] of Object.entries(raw.w)) {
          if (!isObject(win)) continue;
          const totals = remote.classTotals(cls);
          if (totals === undefined) continue;
          for (const [metric, key] of Object.entries(WIRE) as [LatencyMetric, string][]) {
            totals.hist[metric].addEncoded(win[key]);
          }
          const n = win.n;
          if (isCounts(n, 3)) {
            totals.counters.requests += n[0] as number;
            totals.counters.promptTokens += n[1] as number;
            totals.counters.completionTokens += n[2] as number;
          }
        }
      }
      remote.ttft.addEncoded(raw.p);
      remote.tpot.addEncoded(raw.d);
    }
    if (isObject(snap.t)) {
      for (const [name, raw] of Object.entries(snap.t)) {
        if (!isCounts(raw, 2) || (!tenants.has(name) && tenants.size >= MAX_REMOTE_TENANTS)) continue;
        const t = tenants.get(name) ?? { inflight: 0, tokens: 0 };
        t.inflight += raw[0] as number;
        t.tokens += raw[1] as number;
        tenants.set(name, t);
      }
    }
  }
  return merged;
}

function addInflight(remote: RemoteBackend, f: unknown, ahead: unknown): void {
  if (!isCounts(f, 4)) return;
  remote.inflight.requests += f[0] as number;
  remote.inflight.promptTokens += f[1] as number;
  remote.inflight.expectedOutputTokens += f[2] as number;
  remote.inflight.pendingPrefillTokens += f[3] as number;
  const a = f[3] as number;
  remote.prefillAhead +=
    typeof ahead === 'number' && Number.isFinite(ahead) && ahead >= 0 ? Math.min(ahead, a) : a;
}

function isCounts(v: unknown, n: number): v is number[] {
  return (
    Array.isArray(v) &&
    v.length === n &&
    v.every((x) => typeof x === 'number' && Number.isFinite(x) && x >= 0)
  );
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
