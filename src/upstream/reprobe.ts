// Re-probing: a backend the fleet passes over gets a few small timed completions, so that its
// TTFT fit learns what it is now.
//
// Why: the router sends a request where its first token is predicted soonest, and a backend's
// prediction is learnt only from the requests it is sent. One that was slow for a while (a GPU
// throttled, a noisy neighbour, a long warm-up) is predicted slow after it has recovered, is sent
// nothing, and so never shows that it recovered: below overload it stays idle for good, and every
// new prefix is placed on the others (docs/benchmarks.md, "Re-probing a backend the fleet passes
// over").
//
// The rule, checked every TICK_MS for each backend:
// - passed over: this instance has taught its fits nothing for `afterMs` (upstream.reprobe_after_ms)
//   while it taught another backend of its model something since, and since its last series (a
//   fleet with no traffic is not probed; one whose traffic stopped gets one series, no more);
// - idle: nothing in flight on it from any instance, and nothing waiting to prefill there (a
//   probe must not delay a request, and must time the backend alone);
// - healthy (in service, its breaker closed: a half-open breaker's one trial is a request's), with
//   a fit to correct (a backend without one is tried by the router as it is) and a model to ask
//   it for.
// A probe is one non-streamed completion of a unique prompt (nothing of it cached) with
// max_tokens 1, timed from its send to the answer's head: vLLM answers a non-streamed request
// once it is done, here after the prefill and its one token. The fit learns it as a first token
// (LiveState.recordFirstToken) with the backend's own count of the prompt (its usage). Probes come
// in a series of different sizes (a slope is not learnt at one size): one per tick, until the
// last PROBE_SIZES.length were each predicted within MAX_ERROR before they were learnt, or
// MAX_SERIES were sent, or the backend was sent work. A backend that is still slow ends its series
// at its first round: the fit predicts it right. The next series comes `afterMs` after.
//
// Invariants:
// - At most one probe is in flight per backend, and none once stop() has been called; stop()
//   clears the timer and aborts what is in flight.
// - A probe touches neither the breaker nor the outlier detector, nor the scheduler's planning:
//   its failure teaches nothing (the health probe and real traffic judge a backend's health).
// - A probe holds a lease while it runs, as a request does: a request sent to the backend
//   meanwhile is predicted behind it, and is the only one that can be (the backend was idle).
import { randomBytes } from 'node:crypto';
import type { LiveState } from '../state/index.ts';
import type { Backend } from './backend.ts';

/** How often the rule is checked (and the pace of a series' probes). */
export const TICK_MS = 1_000;
/** Prompt sizes of a series, in words (about a token each), in turn. */
export const PROBE_SIZES = [128, 512, 2048] as const;
/** A series ends once its last PROBE_SIZES.length probes were predicted within this relative error. */
export const MAX_ERROR = 0.25;
/**
 * The most probes one series sends (a minute of them). A fit keeps DECAY_FLOOR_SAMPLES (3)
 * samples' worth of its past however old (src/state/fit.ts), and the fleet's slopes as a prior:
 * after a backend ran three times slower, it takes about 30 probes to bring its predictions within
 * MAX_ERROR of what it is now (test/upstream/reprobe.test.ts).
 */
export const MAX_SERIES = 60;

export interface ReprobeTarget {
  /** The model to ask for. */
  model: string;
  /** Its context length (a probe's prompt stays within half of it). */
  maxModelLen: number;
}

export interface ReprobeResult {
  backend: string;
  /** Prompt tokens as the backend counted them. */
  promptTokens: number;
  /** Send to the answer's head, ms. */
  ttftMs: number;
  /** What the fit predicted for it before it learnt it, ms. */
  predictedMs: number;
  /** The series goes on (false: this was its last probe). */
  more: boolean;
}

export interface ReproberDeps {
  backends: () => readonly Backend[];
  live: Pick<
    LiveState,
    'lease' | 'load' | 'prefillAheadTokens' | 'unloadedTtftMs' | 'recordFirstToken' | 'samplesTaught'
  >;
  /** What to ask `backend` for; null: nothing known (it is not probed). */
  target: (backend: Backend) => ReprobeTarget | null;
  /** upstream.reprobe_after_ms, read at each tick (a reload applies at once); 0: never. */
  afterMs: () => number;
  /** The most a probe may take before it is given up, ms. */
  timeoutMs: () => number;
  /** Each probe learnt (the gateway logs and counts it). Must not throw. */
  onProbe?: (r: ReprobeResult) => void;
  now?: () => number;
}

interface Track {
  /** The backend it tracks: a reload that moves a name to another server starts a new track. */
  backend: Backend;
  /** samplesTaught when last seen (a probe's own sample aside). */
  taught: number;
  /** When `taught` last moved: the backend was sent work. Null: not since the track began. */
  taughtAt: number | null;
  /** When the track began (a start, or a reload that added the backend). */
  startedAt: number;
  /** When its last series ended; null: none has. */
  endedAt: number | null;
  /** Probes learnt in the running series (0: none running). */
  sent: number;
  /** Relative errors of the running series' probes, latest last. */
  errors: number[];
  inflight: AbortController | null;
}

export class Reprober {
  readonly #deps: ReproberDeps;
  readonly #now: () => number;
  readonly #tracks = new Map<string, Track>();
  #timer: NodeJS.Timeout | null = null;
  #stopped = false;

  constructor(deps: ReproberDeps) {
    this.#deps = deps;
    this.#now = deps.now ?? (() => performance.now());
    this.#schedule();
  }

  /**
   * The next tick, TICK_MS apart on average, each ±25% at random: gateway instances started
   * together do not check in step (two probes of one backend at once would each time the other's
   * prefill too; a probe that finds a peer's lease when it ends teaches nothing, not one that
   * ended after the peer's).
   */
  #schedule(): void {
    this.#timer = setTimeout(
      () => {
        this.tick();
        if (!this.#stopped) this.#schedule();
      },
      TICK_MS * (0.75 + Math.random() * 0.5),
    );
    this.#timer.unref();
  }

  /** One check of the rule over every backend (the timer's; public for tests that drive it). */
  tick(): void {
    if (this.#stopped) return;
    const now = this.#now();
    const backends = this.#deps.backends();
    const seen = new Set<string>();
    for (const b of backends) {
      seen.add(b.name);
      const taught = this.#deps.live.samplesTaught(b.name);
      const t = this.#tracks.get(b.name);
      if (t === undefined || t.backend !== b) {
        t?.inflight?.abort();
        this.#tracks.set(b.name, {
          backend: b,
          taught,
          taughtAt: null,
          startedAt: now,
          endedAt: null,
          sent: 0,
          errors: [],
          inflight: null,
        });
      } else if (taught !== t.taught) {
        t.taught = taught;
        t.taughtAt = now;
        // Sent work (it learns from that now): a running series is over.
        if (t.sent > 0) this.#endSeries(t, now);
      }
    }
    for (const [name, t] of this.#tracks) {
      if (seen.has(name)) continue;
      t.inflight?.abort();
      this.#tracks.delete(name);
    }
    // Read at each tick: a reload applies at once. At 0 nothing runs, nor is learnt.
    const afterMs = this.#deps.afterMs();
    if (afterMs <= 0) {
      for (const t of this.#tracks.values()) {
        t.inflight?.abort();
        if (t.sent > 0) this.#endSeries(t, now);
      }
      return;
    }
    for (const b of backends) {
      const t = this.#tracks.get(b.name)!;
      if (t.inflight !== null) continue;
      if (t.sent === 0 && t.endedAt !== null && now - t.endedAt < afterMs) continue;
      const target = this.#deps.target(b);
      if (target === null || !this.#eligible(b, t, target, backends, now, afterMs)) {
        // A series stops when the backend stops being idle (it learns from its requests now).
        if (t.sent > 0) this.#endSeries(t, now);
        continue;
      }
      void this.#probe(b, t, target);
    }
  }

  #eligible(
    b: Backend,
    t: Track,
    target: ReprobeTarget,
    backends: readonly Backend[],
    now: number,
    afterMs: number,
  ): boolean {
    const { live } = this.#deps;
    // Healthy: in service with its breaker closed (a half-open breaker's one trial is a request's).
    if (b.state !== 'healthy' || live.load(b.name) > 0 || live.prefillAheadTokens(b.name) > 0) return false;
    // A fit to correct (what a probe is judged against).
    if (live.unloadedTtftMs(b.name, PROBE_SIZES[0]) === null) return false;
    // A running series goes on while the backend stays idle.
    if (t.sent > 0) return true;
    const last = t.taughtAt ?? t.startedAt;
    if (now - last < afterMs) return false;
    // Passed over: another backend of its model was sent work since this one was, and since its
    // last series (a fleet whose traffic stopped gets one series, not one every afterMs).
    const after = Math.max(last, t.endedAt ?? Number.NEGATIVE_INFINITY);
    return backends.some((o) => {
      if (o === b || !o.serves(target.model)) return false;
      const at = this.#tracks.get(o.name)?.taughtAt ?? null;
      return at !== null && at > after;
    });
  }

  async #probe(b: Backend, t: Track, target: ReprobeTarget): Promise<void> {
    const { live } = this.#deps;
    const words = Math.min(PROBE_SIZES[t.sent % PROBE_SIZES.length]!, Math.floor(target.maxModelLen / 2));
    const ac = new AbortController();
    t.inflight = ac;
    const timer = setTimeout(() => ac.abort(), this.#deps.timeoutMs());
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (b.authorization !== null) headers.authorization = b.authorization;
    const body = JSON.stringify({
      model: target.model,
      prompt: uniquePrompt(words),
      max_tokens: 1,
      temperature: 0,
      stream: false,
    });
    let ttftMs: number | null = null;
    let promptTokens: number | null = null;
    // Counted in flight as a request is: one routed there meanwhile is predicted behind it, and
    // the peers see the backend busy.
    const lease = live.lease(b.name, { promptTokens: words, expectedOutputTokens: 1 });
    const taughtAtSend = live.samplesTaught(b.name);
    try {
      // Timed on the steady clock whatever `now` is (a test's clock drives the rule only).
      const sentAt = performance.now();
      const res = await b.pool.request({
        path: '/v1/completions',
        method: 'POST',
        headers,
        body,
        signal: ac.signal,
      });
      ttftMs = performance.now() - sentAt;
      const answer = (await res.body.json()) as { usage?: { prompt_tokens?: unknown } } | null;
      const counted = answer?.usage?.prompt_tokens;
      if (res.statusCode === 200 && typeof counted === 'number' && counted > 0) promptTokens = counted;
    } catch {
      // Refused, reset, timed out, aborted or not JSON: nothing is learnt, and the series ends.
    } finally {
      clearTimeout(timer);
      lease.end();
      t.inflight = null;
    }
    const now = this.#now();
    // Invariant: a probe teaches only its own time on the backend alone. Not when a request was
    // sent there meanwhile (in flight now, or already taught: it shared the engine with the probe,
    // and the backend is in use again), nor once the name belongs to another server or none.
    const alone =
      live.load(b.name) === 0 &&
      live.samplesTaught(b.name) === taughtAtSend &&
      this.#tracks.get(b.name) === t &&
      b.state !== 'removed';
    // Predicted as the backend stood at the send: idle, nothing ahead.
    const predictedMs = promptTokens === null ? null : live.unloadedTtftMs(b.name, promptTokens);
    if (this.#stopped || ttftMs === null || promptTokens === null || !alone || predictedMs === null) {
      this.#endSeries(t, now);
      return;
    }
    live.recordFirstToken({
      backend: b.name,
      backendTtftMs: ttftMs,
      uncachedPromptTokens: promptTokens,
      prefillAheadTokens: 0,
      loadAtDispatch: 0,
    });
    const taught = live.samplesTaught(b.name);
    // The fit learns nothing while the peers' part of the load is missing (a store outage): then
    // neither is a probe reported, and the series ends.
    if (taught === taughtAtSend) {
      this.#endSeries(t, now);
      return;
    }
    // What it taught is not the fleet's traffic: the backend stays passed over. (Nothing else was
    // taught it since the send: `alone`.)
    t.taught = taught;
    t.sent++;
    t.errors.push(Math.abs(predictedMs - ttftMs) / Math.max(ttftMs, 1));
    const round = t.errors.slice(-PROBE_SIZES.length);
    const settled = round.length === PROBE_SIZES.length && round.every((e) => e <= MAX_ERROR);
    const more = !settled && t.sent < MAX_SERIES;
    this.#deps.onProbe?.({ backend: b.name, promptTokens, ttftMs, predictedMs, more });
    if (!more) this.#endSeries(t, now);
  }

  #endSeries(t: Track, now: number): void {
    t.sent = 0;
    t.errors = [];
    t.endedAt = now;
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
    for (const t of this.#tracks.values()) t.inflight?.abort();
  }
}

/**
 * `words` short words after a random 96-bit stamp: no two probes share a leading block, so the
 * backend has none of it cached.
 */
function uniquePrompt(words: number): string {
  const stamp = randomBytes(12).toString('hex');
  const parts: string[] = [stamp];
  const pick = randomBytes(words);
  for (let i = 0; i < words; i++) parts.push(WORDS[pick[i]! % WORDS.length]!);
  return parts.join(' ');
}

const WORDS = (
  'time year people way day man thing woman life child world school state family student group ' +
  'country problem hand part place case week company system program question work government number ' +
  'night point'
).split(' ');
