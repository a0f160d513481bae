// What one instance publishes for its peers, in two parts that travel at two paces (redis-sync.ts):
//
// - the in-flight part, at the pace of `state.inflight_interval_ms`: per backend, the requests this
//   instance has running there and the prefill they still wait for. It is small (five numbers a
//   backend) and it goes stale fast: a cold prompt a peer sent is about half a second of prefill on
//   its backend. Instances that saw each other's dispatches up to half a second late planned on
//   backends a peer had just filled, and each had to allow for that surprise in the P99 of how its
//   predictions turned out (docs/benchmarks.md, "In-flight counts at their own pace");
// - the full snapshot, at the pace of `state.refresh_interval_ms`: window totals and fit sums per
//   backend, and the tenants' usage. Large (tens of KB) and slow to change: a few samples more move
//   none of it by much.
//
// Each part is STATE, never a delta: writing the current one after an outage brings peers up to
// date at once, and nothing accumulated while Redis was down is replayed (there is nothing to
// replay). Version 2 added the tenants ("t") and changed the TTFT fit's first feature to the
// prefill work ahead of the request; version 3 moved the in-flight counts out of the full
// snapshot into their own part. A peer of another version is skipped, so during a rolling upgrade
// old and new instances do not count each other.
//
// Wire form (JSON):
//   in-flight: { "v": 3, "b": { <backend>: [requests, promptTokens, expectedOutputTokens,
//                                           pendingPrefill, prefillAhead] } }
//   full:      { "v": 3, "b": { <backend>: { "w": { <class>: { "t": hist, "o": hist, "q": hist,
//                                                              "n": [requests, promptTokens,
//                                                                    completionTokens] } },
//                                            "p": ttftFitSums, "d": tpotFitSums } },
//                "t": { <tenant>: [inflight, tokensInWindow] } }
//   hist = [count, sum, bin, n, bin, n, ...]   (see histogram.ts; t = TTFT, o = TPOT, q = queue)
//   prefillAhead: of the pendingPrefill, what the backend has not yet worked off at its fitted rate
//   (prefill-backlog.ts): what a request sent now waits for; at most pendingPrefill.

import { type BackendState, RemoteBackend } from './backend-state.ts';
import type { InflightCounts } from './leases.ts';
import { MAX_REMOTE_TENANTS, type RemoteTenant, type TenantUsage } from './tenants.ts';
import type { LatencyMetric } from './window.ts';

const VERSION = 3;
const WIRE: Record<LatencyMetric, 't' | 'o' | 'q'> = { ttft: 't', tpot: 'o', queue: 'q' };

/** What the in-flight part tells of one backend: a BackendState, or a removed backend's draining leases. */
export interface InflightPart {
  readonly name: string;
  readonly inflight: InflightCounts;
  prefillAhead(msPerToken: number | null): number;
  readonly limit: number | null;
}

/** The in-flight part: each backend's counts, and the prefill still ahead there. */
export function encodeInflight(
  backends: Iterable<InflightPart>,
  /** The rate each backend's backlog drains at, ms per token (null: none, e.g. while a peer has prefill ahead there). */
  msPerPrefillToken: (backend: string) => number | null = () => null,
): string {
  const b: Record<string, number[]> = {};
  // The concurrency limits ride beside the counts, not in them: a peer of the previous version
  // takes a part whose counts have five fields only, and ignores a key it does not know.
  let l: Record<string, number> | null = null;
  for (const be of backends) {
    const f = be.inflight;
    b[be.name] = [
      f.requests,
      f.promptTokens,
      f.expectedOutputTokens,
      f.pendingPrefillTokens,
      be.prefillAhead(msPerPrefillToken(be.name)),
    ];
    if (be.limit !== null) {
      l ??= {};
      l[be.name] = be.limit;
    }
  }
  return JSON.stringify(l === null ? { v: VERSION, b } : { v: VERSION, b, l });
}

/**
 * What an instance leaves behind when it stops: a full snapshot of its tenants' tokens in the
 * window alone, none in flight (its requests ended with it); '' when it has none.
 */
export function encodeDeparted(tenants: Iterable<[string, TenantUsage]>): string {
  const t: Record<string, number[]> = {};
  let any = false;
  for (const [name, u] of tenants) {
    if (u.tokens <= 0) continue;
    t[name] = [0, u.tokens];
    any = true;
  }
  return any ? JSON.stringify({ v: VERSION, b: {}, t }) : '';
}

/** The full snapshot: window totals and fit sums per backend, and the tenants' usage. */
export function encodeSnapshot(
  backends: Iterable<BackendState>,
  tenants: Iterable<[string, TenantUsage]>,
  now: number,
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
    b[be.name] = {
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
 * Adds peers' in-flight parts into `into`, per backend (an entry is made for a backend only they
 * name). A part that does not parse or has another version is skipped whole; a malformed backend
 * of one on its own. Returns how many parts counted.
 */
export function mergeInflight(texts: readonly string[], into: Map<string, RemoteBackend>): number {
  let merged = 0;
  for (const part of ofThisVersion(texts)) {
    merged++;
    for (const [name, f] of Object.entries(part.b)) {
      if (!isCounts(f, 5)) continue;
      const remote = remoteOf(into, name);
      remote.inflight.requests += f[0] as number;
      remote.inflight.promptTokens += f[1] as number;
      remote.inflight.expectedOutputTokens += f[2] as number;
      remote.inflight.pendingPrefillTokens += f[3] as number;
      remote.prefillAhead += Math.min(f[4] as number, f[3] as number);
    }
    if (isObject(part.l)) {
      for (const [name, limit] of Object.entries(part.l)) {
        if (typeof limit !== 'number' || !Number.isFinite(limit) || limit <= 0) continue;
        const remote = remoteOf(into, name);
        remote.peerLimit = Math.min(remote.peerLimit ?? Number.POSITIVE_INFINITY, limit);
      }
    }
  }
  return merged;
}

/**
 * Sums peers' full snapshots per backend. A snapshot that does not parse or has another version is
 * skipped whole; a malformed part of one is skipped on its own. Returns how many snapshots counted.
 */
export function mergeSnapshots(
  texts: readonly string[],
  into: Map<string, RemoteBackend>,
  tenants: Map<string, RemoteTenant>,
): number {
  let merged = 0;
  for (const snap of ofThisVersion(texts)) {
    merged++;
    for (const [name, raw] of Object.entries(snap.b)) {
      if (!isObject(raw)) continue;
      const remote = remoteOf(into, name);
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

/** The texts that parse as an object of this version with a backend map; the others are skipped. */
function* ofThisVersion(
  texts: readonly string[],
): Generator<Record<string, unknown> & { b: Record<string, unknown> }> {
  for (const text of texts) {
    let part: unknown;
    try {
      part = JSON.parse(text);
    } catch {
      continue;
    }
    if (isObject(part) && part.v === VERSION && isObject(part.b))
      yield part as Record<string, unknown> & { b: Record<string, unknown> };
  }
}

function remoteOf(into: Map<string, RemoteBackend>, name: string): RemoteBackend {
  let remote = into.get(name);
  if (remote === undefined) {
    remote = new RemoteBackend();
    into.set(name, remote);
  }
  return remote;
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
