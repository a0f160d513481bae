// The façade: one object the gateway holds for live backend state. It is the one owner of the
// in-flight count per backend (leases) and per tenant (usage leases). Everything the request path
// calls (lease, record, backendView, predict*, inflight, load, tenant*) is synchronous and in memory; the
// shared store (Redis) and the /metrics scraper only ever run in the background and replace parts
// of the view when they succeed.
//
// View = this instance's own data (always current) + the live peers' last in-flight parts and full
// snapshots (Redis store only). While Redis is unreachable the peers' part is kept until it is older than the liveness
// TTL, then dropped: a short blip does not make counts jump. From then until the store answers, each
// peer the last exchange counted, a dead one included, is taken to run what this instance runs
// (#peersUnseen), as tenantShare divides tenant limits: the safe side of not knowing.

import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { StateConfig } from '../config/index.ts';
import {
  BackendState,
  type Inflight,
  newInflight,
  RemoteBackend,
  TPOT_FEATURES,
  TTFT_FEATURES,
} from './backend-state.ts';
import { type FitCoefficients, FitStats, PooledSpread, predict } from './fit.ts';
import { type Quantiles, quantiles } from './histogram.ts';
import {
  addCounts,
  beginLease,
  type InflightCounts,
  type Lease,
  type LeaseTokens,
  zeroCounts,
} from './leases.ts';
import { DEFAULT_KV_TOKENS, PrefixIndex, VLLM_BLOCK_TOKENS } from './prefix-index.ts';
import { decodePrefixLog, encodePrefixLog, PREFIX_HASHING, urlKey } from './prefix-log.ts';
import { RedisSync, type StateLogger, type StoreStatus } from './redis-sync.ts';
import { type BackendTelemetry, type ScrapeTarget, TelemetryScraper } from './scraper.ts';
import {
  encodeDeparted,
  encodeInflight,
  encodeSnapshot,
  type InflightPart,
  mergeInflight,
  mergeSnapshots,
} from './snapshot.ts';
import { type RemoteTenant, type TenantLease, type TenantUsage, TenantUsageTable } from './tenants.ts';
import type { WindowTotals } from './window.ts';

export interface LiveStateOptions {
  /** Unique per gateway process; default `<hostname>-<pid>-<random>`. */
  instanceId?: string;
  backends: readonly ScrapeTarget[];
  /** Scrape each backend's /metrics (upstream.metrics_scrape_interval_ms); false = no telemetry. */
  scrape: false | { intervalMs: number; timeoutMs?: number };
  /** A backend's engine restarted (a later process start time, or a counter that fell): told after the index forgot it. */
  onBackendRestart?: (backend: string) => void;
  /** Sliding-window shape; default 60 buckets of 1 s. */
  window?: { bucketMs: number; buckets: number };
  logger?: StateLogger;
  /** Clock in ms for windows, fits and ages; default Date.now. */
  now?: () => number;
  /**
   * Tokens one prefix-index block of text stands for at the fleet's characters per token: what a
   * block weighs when its request told no estimate (a peer's); default one KV block (16 tokens).
   */
  indexBlockTokens?: () => number;
  /**
   * `router.block_size_tokens`: the block size this instance hashes prompts at. Shared blocks carry
   * it, and a peer's blocks hashed at another size (a rolling change of the setting) are skipped:
   * they could never match and would only take the index's room. Default: untagged, read only
   * from untagged peers.
   */
  blockSizeTokens?: () => number;
  /**
   * How long a stopped instance's tenant tokens still count for the others (Redis store); default
   * the token window, 60 s. Tests shorten it.
   */
  departedTokensMs?: number;
}

/** One latency metric or counter set over the sliding window. */
export interface LatencyView {
  ttft: Quantiles;
  tpot: Quantiles;
  queue: Quantiles;
  requests: number;
  promptTokens: number;
  completionTokens: number;
}

export interface FitError {
  /** Mean |predicted − actual| / actual over recent samples (decayed like the fit). */
  mape: number | null;
  /** Mean (predicted − actual) / actual: > 0 means predictions run high. */
  bias: number | null;
}

export interface RatesView {
  /** Prefill tokens per second (1000 / ttft.msPerPrefillToken). */
  prefillTokensPerS: number | null;
  /**
   * Dispatch-to-first-token ≈ baseMs + msPerPrefillToken · (own uncached tokens + prefill tokens
   * pending ahead on the backend) + msPerLoad · load.
   */
  ttft: { baseMs: number; msPerPrefillToken: number; msPerLoad: number; samples: number } | null;
  /** TPOT ≈ baseMs + msPerLoad · load. */
  tpot: { baseMs: number; msPerLoad: number; samples: number } | null;
  /** TPOT predicted at the backend's current load. */
  tpotNowMs: number | null;
  ttftError: FitError;
  tpotError: FitError;
}

export interface BackendLiveView {
  name: string;
  url: string;
  /** All live instances (this one + peers). */
  inflight: InflightCounts;
  /** This instance only. */
  localInflight: InflightCounts;
  /** Every class together. */
  latency: LatencyView;
  byClass: Record<string, LatencyView>;
  rates: RatesView;
  /** Null when scraping is off. */
  telemetry: BackendTelemetry | null;
}

export interface LiveStateView {
  instanceId: string;
  /** Clock time of the view. */
  at: number;
  windowMs: number;
  store: StoreStatus;
  backends: BackendLiveView[];
}

/**
 * A first token as it comes: what the TTFT fit learns. Taken at the first token, not when the
 * request ends: a fit fed at the end learns each first token a whole generation late (seconds),
 * and a backend that has just turned slow is predicted fast for that long.
 */
export interface FirstTokenSample {
  backend: string;
  /** From the grant of the attempt's slot (its dispatch) to its first token relayed, ms. */
  backendTtftMs: number;
  /** Prompt tokens not in the backend's prefix cache (estimated). */
  uncachedPromptTokens: number;
  /** Uncached prefill tokens of other requests pending on the backend at dispatch (all instances). */
  prefillAheadTokens: number;
  /** The load passed to predict*: the backend's in-flight requests (all instances) at dispatch. */
  loadAtDispatch: number;
}

/** What the gateway measured for one finished request: the windows and the TPOT fit. */
export interface LatencySample {
  backend: string;
  class: string;
  /** Time in the gateway's queue before dispatch (every attempt); null if unknown. */
  queueMs: number | null;
  /** Gateway-measured TTFT, arrival to first token (includes the queue); null when no token came. */
  ttftMs: number | null;
  tpotMs: number | null;
  promptTokens: number;
  completionTokens: number;
  /** The load passed to predict*: the backend's in-flight requests (all instances) at dispatch. */
  loadAtDispatch: number;
}

export interface LiveState {
  readonly instanceId: string;
  /** Counts a request as in flight on `backend` until lease.end(); not counted if the backend is unknown. */
  lease(backend: string, tokens: LeaseTokens): Lease;
  /** Adds a first token to the backend's TTFT fit. O(1); unknown backends are ignored. */
  recordFirstToken(sample: FirstTokenSample): void;
  /** Adds a finished request to the windows and the TPOT fit. O(1); unknown backends are ignored. */
  record(sample: LatencySample): void;
  /**
   * In-flight work on `backend`, all live instances. While an outage of the store keeps the n peers
   * its last exchange counted out of the view, each is counted as running what this instance runs
   * there (n + 1 times this instance's own), as tenantShare divides a tenant's limits.
   */
  inflight(backend: string): InflightCounts;
  /** In-flight requests on `backend`, all live instances: the `load` of the fits. */
  load(backend: string): number;
  /**
   * Predicted dispatch-to-first-token time of a request with `uncachedTokens` to prefill, sent now:
   * the fit at the prefill still ahead on the backend (prefillAheadTokens) and its load. Null until
   * the fit has samples.
   */
  predictTtftMs(backend: string, uncachedTokens: number): number | null;
  /**
   * Uncached prompt tokens the backend still has to prefill ahead of a request sent now: this
   * instance's as they drain at the backend's prefill rate since they were sent (prefill-backlog.ts),
   * at most its exact pending count, and not while a peer has prefill ahead there (drainMsPerToken);
   * each peer's as its last in-flight part had it (not drained between exchanges). Through an outage
   * of the store, n + 1 times this instance's, as inflight() counts (#drainAt). What predictTtftMs
   * counts ahead, what the TTFT fit learns a first token against, and what the scheduler's prefill
   * room counts.
   */
  prefillAheadTokens(backend: string): number;
  /**
   * Samples this instance has taught `backend`'s fits (TTFT and TPOT), ever: it moves while the
   * backend is sent work from here. 0 for an unknown backend.
   */
  samplesTaught(backend: string): number;
  /** The prefill-work part alone (ms per prefill token × tokens); null without a fit. */
  prefillMs(backend: string, tokens: number): number | null;
  /**
   * The TTFT fit of `backend` tells its own prefill rate apart from its intercept: its own prompts'
   * sizes (with the prefill ahead of them; this instance's and the peers' samples, not the fleet's
   * prior) spread at least MIN_PREFILL_SPREAD of their mean. Prompts all of about one size,
   * nothing prefilling ahead of them, say nothing of the rate: the fit has the fleet's, or 0 (or
   * what noise makes of it) with their prefill in the intercept. False without a fit.
   */
  prefillRateTold(backend: string): boolean;
  /**
   * This instance's concurrency limit for `backend`, told to the peers with its in-flight counts;
   * null tells none.
   */
  shareLimit(backend: string, limit: number | null): void;
  /**
   * The lowest concurrency limit a live peer told for `backend` in its last in-flight part (each set
   * on that peer's own evidence); null when none did (no peers, a store outage, peers of an earlier
   * version).
   */
  peersLimit(backend: string): number | null;
  /**
   * Dispatch to first token on the backend with nothing else on it (no prefill waiting, no load):
   * the least this prompt's first token can take there. Null without a fit.
   */
  unloadedTtftMs(backend: string, uncachedTokens: number): number | null;
  predictTpotMs(backend: string, load?: number): number | null;
  /** Counts one admitted request of `tenant` (and its tokens) until the lease ends. */
  tenantLease(tenant: string, tokens: number): TenantLease;
  /** `tenant`'s usage over all live instances. */
  tenantUsage(tenant: string): TenantUsage;
  /**
   * The share of each tenant's limits this instance enforces on its own: 1 while the peers' tenants
   * are in the view (or it has none), 1 / (n + 1) once they are not, so that n + 1 instances each
   * counting alone admit about a limit's worth together, not n + 1 times it: an outage of the store
   * dropped the n peers its last exchange counted, or full exchanges keep failing while only the
   * n peers' counts travel (their tenants travel in full).
   */
  tenantShare(): number;
  /** Milliseconds until `needed` of this instance's tokens for `tenant` leave the minute window. */
  tenantTokensFreedInMs(tenant: string, needed: number): number;
  /** Called after every exchange with the store that changed the peers' part (e.g. to re-check room). */
  onPeersChanged(listener: () => void): void;
  /** Leading blocks of `hashes` that `backend` is believed to hold in its prefix cache. */
  prefixMatch(backend: string, hashes: readonly number[]): number;
  /**
   * The request with these blocks was just sent to `backend` (shared with peers at the next tick).
   * `hashedAt`: the block size they were hashed at; blocks of another size than prompts are
   * hashed at now (a request taken in before a reload changed it) are dropped. `tokensPerBlock`:
   * the tokens one of them stands for (the request's estimate; the fleet's when not given).
   */
  prefixInsert(backend: string, hashes: readonly number[], hashedAt?: number, tokensPerBlock?: number): void;
  /**
   * Blocks the prefix index holds for `backend`, the tokens they stand for (each block at the
   * estimate it was sent with), and its capacity in tokens (the backend's KV cache).
   */
  prefixSize(backend: string): { blocks: number; tokens: number; capacity: number };
  /**
   * Whether prefixSize's capacity rests on an assumed KV cache: vLLM's num_gpu_blocks or its
   * block_size not scraped yet. For /admin/state only.
   */
  prefixCapacityAssumed(backend: string): boolean;
  /**
   * What counts the requests of `backend` at `url` (null: no entry for it there). The same while an
   * entry, and one a reload added back at its URL that took its counts (its requests still
   * running), live on; another for an entry that started afresh (new, or at another URL). Compared
   * before and after a reload, it says whether requests sent before are still counted.
   */
  countedAs(backend: string, url: string): number | null;
  telemetry(backend: string): BackendTelemetry | null;
  backendView(name: string): BackendLiveView | undefined;
  view(): LiveStateView;
  status(): StoreStatus;
  /** Config reload: new backends start empty, removed ones are forgotten (their leases no longer count). */
  setBackends(list: readonly ScrapeTarget[]): void;
  /**
   * The classes configured (at start and at every reload): the latency windows of others are
   * dropped, and a request of a class a reload removed, still running, makes none when it ends,
   * so the classes a backend tracks (MAX_CLASSES) are those configured, however many reloads
   * renamed them.
   */
  retainClasses(classes: ReadonlySet<string>): void;
  /** Resolves when the first exchange with the store has finished (at once for memory). */
  ready(): Promise<void>;
  close(): Promise<void>;
}

interface FitCache {
  ttft: FitCoefficients | null;
  tpot: FitCoefficients | null;
  /** The spread of the TTFT fit's prompt sizes in the backend's own samples (the prior's left out). */
  ttftPrefillSpread: number;
  ttftError: FitError;
  tpotError: FitError;
}

const MIN_RELATIVE_ERROR_BASE_MS = 1;
/** Half-life of the rate fits' sample weights. */
const FIT_HALF_LIFE_MS = 60_000;
/** Samples a fit needs before it predicts. */
const MIN_FIT_SAMPLES = 3;
/**
 * The most one sample may teach a fit, as a multiple of what the fit predicted for it (or of the
 * fit's mean, when that is more): see #learn. A backend that turned this much slower for good is
 * followed still, the bound rising with the fit.
 */
const SAMPLE_BOUND = 2;
/** Least time between two solves of one backend's fits (see #fits). */
const REFIT_MS = 20;
/**
 * The least spread of a TTFT fit's prompt sizes (standard deviation over mean) at which its rate is
 * taken as told apart from its intercept (prefillRateTold). Chat prompts spread about 1; prompts of
 * one length ± 10% about 0.06; one length with a rare other, under 0.02.
 */
const MIN_PREFILL_SPREAD = 0.04;
/**
 * How many samples the fleet's spread counts for in a new backend's fits (see #fleetPool). A
 * backend's own first samples cannot tell its prefill rate apart (a handful of prompts of about one
 * size fit a flat line as well as any), and a slope of zero made its prefill look free to the
 * router, which then sent it every cold prompt until its first tokens came back: seconds of
 * herding. The prior sits at the backend's own means (its level stays its own) and lends only the
 * fleet's slopes (how TTFT moves with tokens and load within each backend). It is worth
 * PRIOR_SAMPLES samples while the backend has no more than that of its own, and then fades with
 * the square of its samples (weight PRIOR_SAMPLES² ÷ n, against its own n). Not with n alone: a
 * backend's prompts can spread far less than the fleet's (the warm, short ones against another's
 * cold, long ones), and each pseudo-sample carries the fleet's spread, so at 400 samples and a
 * sixteenth of the spread a 1/n prior put its rate 14% off; this one 0.5%. A backend
 * whose own prompts never spread (one size only) keeps the fleet's slope for tens of thousands of
 * samples (past about 10⁵, samples ever, the prior's share falls under solve's rounding cutoff).
 * The weight scales with its own decayed weight, so the aging of its samples alone never moves
 * its fit.
 */
const PRIOR_SAMPLES = 10;

interface FleetPool {
  fleetVersion: number;
  remoteVersion: number;
  at: number;
  ttft: PooledSpread;
  tpot: PooledSpread;
}

export function createLiveState(config: StateConfig, opts: LiveStateOptions): LiveState {
  return new LiveStateImpl(config, opts);
}

class LiveStateImpl implements LiveState {
  readonly instanceId: string;
  readonly #now: () => number;
  /**
   * The prefill backlogs' clock: the injected one, else a steady one. A wall clock stepped forward
   * (NTP, a resumed VM) would drain every backlog at once and open every prefill room.
   */
  readonly #steady: () => number;
  readonly #shape: { bucketMs: number; buckets: number };
  /** startS: the latest engine start known for it (#sameEngine); null until one is. */
  /** `server`: urlKey(url), what a log part names the server by (encodePrefixLog). */
  readonly #backends = new Map<
    string,
    {
      state: BackendState;
      url: string;
      server: string;
      startS: number | null;
      /**
       * Names what counts this entry's requests: new for an entry that starts afresh, the removed
       * entry's for one added back at its URL that took its counts (its requests still running).
       */
      lineage: number;
    }
  >();
  /** Removed backends with requests still running on them: their counts, kept until those end. */
  readonly #draining = new Map<string, { url: string; inflight: Inflight; lineage: number }>();
  #nextLineage = 1;
  readonly #scraper: TelemetryScraper | null;
  readonly #sync: RedisSync | null;
  #remote = new Map<string, RemoteBackend>();
  #remoteAt: number | null = null;
  /** When the peers' full snapshots (their fit sums among them) were taken into the view. */
  #remoteFullAt: number | null = null;
  /** Bumped when the peers' part of the view changes; with BackendState.version, keys the caches. */
  #remoteVersion = 0;
  /** Peers counted at the last exchange; and those of the view an outage dropped (0 once one succeeds). */
  #peersCounted = 0;
  #peersLost = 0;
  /** The classes configured (retainClasses); null until told: any class. */
  #classes: ReadonlySet<string> | null = null;
  readonly #latencyCache = new Map<
    string,
    { key: string; value: Pick<BackendLiveView, 'latency' | 'byClass'> }
  >();
  readonly #fitCache = new Map<
    string,
    { version: number; remoteVersion: number; pool: FleetPool; at: number; value: FitCache }
  >();
  /** Bumped by every sample on any backend: with #remoteVersion, keys the fleet pool. */
  #fleetVersion = 0;
  /** The pending solve of the fits off the request path (#oweRefresh), if any. */
  #refreshing: NodeJS.Timeout | null = null;
  #pool: FleetPool | null = null;
  readonly #tenants = new TenantUsageTable();
  #remoteTenants = new Map<string, RemoteTenant>();
  readonly #peerListeners: (() => void)[] = [];
  readonly #prefix: PrefixIndex;
  readonly #indexBlockTokens: (() => number) | null;
  readonly #blockSizeTokens: (() => number) | null;
  /** The block size the index's blocks were hashed at (see #sameBlockSize). */
  #indexedAt: number | undefined;
  #closed: Promise<void> | null = null;

  constructor(config: StateConfig, opts: LiveStateOptions) {
    this.instanceId = opts.instanceId ?? defaultInstanceId();
    this.#now = opts.now ?? Date.now;
    this.#steady = opts.now ?? (() => performance.now());
    this.#shape = opts.window ?? { bucketMs: 1_000, buckets: 60 };
    for (const b of opts.backends) this.#add(b);
    this.#scraper =
      opts.scrape === false
        ? null
        : new TelemetryScraper(
            // A restarted engine's cache is empty: the index forgets what it held there, rather
            // than count hits on it until each prefix has been sent there again.
            {
              ...opts.scrape,
              now: this.#now,
              onRestart: (b, { before, after }) => {
                // Unless a peer's log part told of this later start first: the index was emptied
                // then and holds the new engine's blocks alone. A restart seen by counters that
                // fell under the same start time (or none) empties it.
                const toldFirst =
                  before !== null &&
                  after !== null &&
                  after > before &&
                  this.#backends.get(b)?.startS === after;
                if (!toldFirst) this.#prefix.drop(b);
                opts.onBackendRestart?.(b);
              },
              onStart: (b, s) => {
                this.#sameEngine(b, s);
              },
            },
            opts.backends,
          );
    this.#indexBlockTokens = opts.indexBlockTokens ?? null;
    this.#blockSizeTokens = opts.blockSizeTokens ?? null;
    this.#prefix = new PrefixIndex((b) => this.#indexCapacity(b), this.#now);
    // Shared through the store's log: keep what this instance sends until the next tick.
    this.#prefix.record(config.store === 'redis');
    this.#sync =
      config.store === 'redis'
        ? new RedisSync(config, {
            instanceId: this.instanceId,
            now: this.#now,
            logger: opts.logger,
            departedMs: opts.departedTokensMs,
            host: {
              snapshot: (now) => encodeSnapshot(this.#states(), this.#tenants.entries(now), now),
              departing: (now) => encodeDeparted(this.#tenants.entries(now)),
              inflight: () => encodeInflight(this.#inflightParts(), (name) => this.#drainMsPerToken(name)),
              applyPeers: (snaps, inflight, now) => this.#applyPeers(snaps, inflight, now),
              logEntry: () => {
                const tag = this.#blockTag();
                return encodePrefixLog(this.#prefix.drainRecent(), tag, (b) => this.#backends.get(b));
              },
              applyLog: (entries) => {
                const tag = this.#blockTag();
                for (const e of entries) {
                  decodePrefixLog(e, tag, (b, server, h, startS) => {
                    // Another server under this name (a reload that moved it, which reached the
                    // peer first or not yet): its blocks, and its start time, are not this one's.
                    const entry = this.#backends.get(b);
                    if (entry === undefined || (server !== null && server !== entry.server)) return;
                    if (startS === null || this.#sameEngine(b, startS))
                      this.#prefix.insertPeer(b, h, this.#fleetBlockTokens());
                  });
                }
              },
            },
          })
        : null;
  }

  lease(backend: string, tokens: LeaseTokens): Lease {
    const be = this.#backends.get(backend)?.state;
    return be === undefined
      ? beginLease(backend, zeroCounts(), tokens)
      : beginLease(backend, be.inflight, tokens, be.prefill);
  }

  record(s: LatencySample): void {
    const be = this.#backends.get(s.backend)?.state;
    if (be === undefined) return;
    const now = this.#now();
    if (this.#classes === null || this.#classes.has(s.class))
      be.window(s.class)?.record(now, {
        ttftMs: s.ttftMs,
        tpotMs: s.tpotMs,
        queueMs: s.queueMs,
        promptTokens: nonNegative(s.promptTokens),
        completionTokens: nonNegative(s.completionTokens),
      });
    if (s.tpotMs !== null && Number.isFinite(s.tpotMs) && s.tpotMs >= 0) {
      this.#learn(be, 'tpot', [nonNegative(s.loadAtDispatch)], s.tpotMs, now);
    }
    be.version++;
  }

  recordFirstToken(s: FirstTokenSample): void {
    const be = this.#backends.get(s.backend)?.state;
    const y = s.backendTtftMs;
    if (be === undefined || !Number.isFinite(y) || y < 0) return;
    const x = [
      nonNegative(s.uncachedPromptTokens) + nonNegative(s.prefillAheadTokens),
      nonNegative(s.loadAtDispatch),
    ];
    this.#learn(be, 'ttft', x, y, this.#now());
  }

  /**
   * One sample into one of `be`'s fits: the error of what the fit predicted for it, then the sample.
   * Invariants: a sample moves a fit no further than one SAMPLE_BOUND times its prediction (or the
   * fit's mean, when that is more) would: a stall's 30 s first token on a backend predicted at
   * 840 ms took the slope 15 times up and kept it off for minutes, where the windows' P99 is what
   * should show it (they keep the raw figure). And nothing is learnt while the peers' part of the
   * load is missing (Redis out past the liveness TTL): x would count this instance's load alone
   * against samples that ran beside the peers' requests, and the fit would hold their load twice
   * once they count again.
   */
  #learn(be: BackendState, which: 'ttft' | 'tpot', x: number[], y: number, now: number): void {
    if (this.#peersMissing()) return;
    const fit = which === 'ttft' ? be.ttftFit : be.tpotFit;
    const coefficients = this.#fits(be.name, be)[which];
    fit.decayTo(now);
    let taught = y;
    if (coefficients !== null) {
      const predicted = predict(coefficients, x);
      fit.stats.addError(relativeError(predicted, y));
      const scale = Math.max(predicted, fit.stats.meanY() ?? 0);
      if (scale > 0) taught = Math.min(y, SAMPLE_BOUND * scale);
    }
    fit.stats.addSample(x, taught);
    be.fitVersion++;
    this.#fleetVersion++;
    this.#oweRefresh();
  }

  inflight(backend: string): InflightCounts {
    const be = this.#backends.get(backend)?.state;
    const total = zeroCounts();
    if (be === undefined) return total;
    addCounts(total, be.inflight);
    const remote = this.#remoteFor(backend);
    if (remote !== undefined) addCounts(total, remote.inflight);
    else for (let k = this.#peersUnseen(); k > 0; k--) addCounts(total, be.inflight);
    return total;
  }

  /**
   * Peers whose in-flight requests the view has lost: those an outage of the store dropped (as for
   * tenantShare). Each is taken to run on every backend what this instance runs there. Invariant:
   * n + 1 instances each counting alone fill about one concurrency limit of a backend together,
   * not n + 1 of them: counting only its own requests against a limit meant for the whole backend,
   * each sent it a whole limit's worth once the peers' part was dropped. Reads the view as it
   * stands: callers check its freshness first (#remoteFor), except #catchUpPrefill, which runs
   * inside that check.
   */
  #peersUnseen(): number {
    return this.#sync !== null && this.#remoteAt === null ? this.#peersLost : 0;
  }

  samplesTaught(backend: string): number {
    return this.#backends.get(backend)?.state.fitVersion ?? 0;
  }

  load(backend: string): number {
    return this.inflight(backend).requests;
  }

  predictTtftMs(backend: string, uncachedTokens: number): number | null {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return null;
    const fit = this.#fits(backend, be).ttft;
    if (fit === null) return null;
    const remote = this.#remoteFor(backend);
    // The peers an outage dropped from the view run what this instance does (#peersUnseen).
    const times = remote === undefined ? 1 + this.#peersUnseen() : 1;
    const ahead =
      be.prefillAhead(this.#drainAt(fit.slopes[0] as number, remote)) * times + (remote?.prefillAhead ?? 0);
    return predict(fit, [
      nonNegative(uncachedTokens) + ahead,
      be.inflight.requests * times + (remote?.inflight.requests ?? 0),
    ]);
  }

  prefillAheadTokens(backend: string): number {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return 0;
    const remote = this.#remoteFor(backend);
    const times = remote === undefined ? 1 + this.#peersUnseen() : 1;
    return be.prefillAhead(this.#drainMsPerToken(backend)) * times + (remote?.prefillAhead ?? 0);
  }

  /** The ms per prefill token at which this instance's backlog on `backend` drains (drainMsPerToken). */
  #drainMsPerToken(backend: string): number | null {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return null;
    const fit = this.#fits(backend, be).ttft;
    return fit === null ? null : this.#drainAt(fit.slopes[0] as number, this.#remoteFor(backend));
  }

  /**
   * drainMsPerToken, and while an outage keeps n peers out of the view (#peersUnseen), n + 1 times
   * it: those peers are taken to have as much prefill ahead there as this instance, which the
   * backend works beside this one's, so this one's part drains at 1 / (n + 1) of the rate (at the
   * whole rate, the n + 1 times counted ahead went in the time this part alone takes). Whoever
   * changes the view catches every backlog up first, at the rate before.
   */
  #drainAt(slope: number | null, remote: RemoteBackend | undefined): number | null {
    const ms = drainMsPerToken(slope, remote);
    return ms === null || remote !== undefined ? ms : ms * (1 + this.#peersUnseen());
  }

  /**
   * Brings every backlog up to now at the rate that held until now, before the peers' view changes
   * (or is dropped as stale): a rate applies from when it changed, not to the time before it. Reads
   * the view and the fits as they stand, without the freshness check (which calls this).
   */
  #catchUpPrefill(): void {
    for (const [name, { state: be }] of this.#backends) {
      const slope = (this.#fitCache.get(name)?.value.ttft?.slopes[0] as number | undefined) ?? null;
      be.catchUpPrefill(this.#drainAt(slope, this.#remote.get(name)));
    }
  }

  unloadedTtftMs(backend: string, uncachedTokens: number): number | null {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return null;
    const fit = this.#fits(backend, be).ttft;
    return fit === null ? null : predict(fit, [nonNegative(uncachedTokens), 0]);
  }

  shareLimit(backend: string, limit: number | null): void {
    const be = this.#backends.get(backend)?.state;
    if (be !== undefined) be.limit = limit;
  }

  peersLimit(backend: string): number | null {
    return this.#remoteFor(backend)?.peerLimit ?? null;
  }

  prefillMs(backend: string, tokens: number): number | null {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return null;
    const fit = this.#fits(backend, be).ttft;
    return fit === null ? null : (fit.slopes[0] as number) * nonNegative(tokens);
  }

  prefillRateTold(backend: string): boolean {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return false;
    const fits = this.#fits(backend, be);
    return fits.ttft !== null && fits.ttftPrefillSpread >= MIN_PREFILL_SPREAD;
  }

  tenantLease(tenant: string, tokens: number): TenantLease {
    return this.#tenants.lease(tenant, tokens, this.#now(), this.#now);
  }

  tenantUsage(tenant: string): TenantUsage {
    const local = this.#tenants.local(tenant, this.#now());
    const remote = this.#sync !== null && this.#remoteFresh() ? this.#remoteTenants.get(tenant) : undefined;
    return {
      inflight: local.inflight + (remote?.inflight ?? 0),
      tokens: local.tokens + (remote?.tokens ?? 0),
    };
  }

  tenantShare(): number {
    return 1 / (this.#tenantsUnknown() + 1);
  }

  /** Peers an outage of the store dropped from the view are still out of it (none without peers). */
  #peersMissing(): boolean {
    return !this.#remoteFresh() && this.#peersLost > 0;
  }

  /**
   * Peers whose tenants' usage is unknown: those an outage dropped from the view, or, while a full
   * exchange keeps failing and only their counts travel, every peer (their tenants travel in full).
   */
  #tenantsUnknown(): number {
    if (!this.#remoteFresh()) return this.#peersLost;
    return this.#remoteFullAt === null ? this.#peersCounted : 0;
  }

  tenantTokensFreedInMs(tenant: string, needed: number): number {
    return this.#tenants.msUntilFreed(tenant, this.#now(), needed);
  }

  onPeersChanged(listener: () => void): void {
    this.#peerListeners.push(listener);
  }

  prefixMatch(backend: string, hashes: readonly number[]): number {
    return this.#prefix.match(backend, hashes);
  }

  prefixInsert(backend: string, hashes: readonly number[], hashedAt?: number, tokensPerBlock?: number): void {
    this.#sameBlockSize();
    if (hashedAt !== undefined && this.#indexedAt !== undefined && hashedAt !== this.#indexedAt) return;
    this.#prefix.insert(backend, hashes, tokensPerBlock ?? this.#fleetBlockTokens());
  }

  /**
   * The tokens a block of text stands for at the fleet's characters per token: what a block weighs
   * when nothing better is known (a peer tells no estimate with its blocks); without a ratio, one
   * vLLM KV block.
   */
  #fleetBlockTokens(): number {
    const perBlock = this.#indexBlockTokens?.();
    return perBlock !== undefined && perBlock > 0 ? perBlock : VLLM_BLOCK_TOKENS;
  }

  /**
   * Invariant: the index holds blocks of one block size, the one prompts are hashed at now. A
   * reload that changes `router.block_size_tokens` empties it before the first block of the new
   * size goes in: the old blocks can never match again, and would only take room and make the
   * caches look fuller than the index knows them to be.
   */
  #sameBlockSize(): void {
    const size = this.#blockSizeTokens?.();
    if (size === this.#indexedAt) return;
    if (this.#indexedAt !== undefined) this.#prefix.clear();
    this.#indexedAt = size;
  }

  /**
   * What shared blocks are tagged with: `@`, the block size and the hashing's version
   * (PREFIX_HASHING), or '' without a size. The index is made to hold blocks of that size first,
   * so what is told and read next is of it.
   */
  #blockTag(): string {
    this.#sameBlockSize();
    return this.#indexedAt === undefined ? '' : `@${this.#indexedAt}.${PREFIX_HASHING}`;
  }

  prefixSize(backend: string): { blocks: number; tokens: number; capacity: number } {
    return {
      blocks: this.#prefix.size(backend),
      tokens: this.#prefix.held(backend),
      capacity: this.#indexCapacity(backend),
    };
  }

  countedAs(backend: string, url: string): number | null {
    const entry = this.#backends.get(backend);
    return entry === undefined || entry.url !== url ? null : entry.lineage;
  }

  prefixCapacityAssumed(backend: string): boolean {
    const m = this.#scraper?.get(backend);
    return m === undefined || m.numGpuBlocks === null || m.blockSize === null;
  }

  /**
   * The prefix index's capacity for `backend`, in tokens: its KV cache (vLLM's num_gpu_blocks ×
   * block_size; DEFAULT_KV_TOKENS until scraped). Each block weighs the tokens it stands for at the
   * estimate of the request that sent it (its tenant's characters per token; a prompt of token ids
   * exactly block_size_tokens). Invariant: the index forgets a prefix about when the backend's LRU
   * would, whatever the text's characters per token: sized in blocks at the fleet's ratio, it held
   * about three times the tokens the cache does of a tenant writing in a script of one or two
   * characters per token beside English at four, and counted on prefixes long evicted.
   */
  #indexCapacity(backend: string): number {
    const m = this.#scraper?.get(backend);
    return m === undefined || m.numGpuBlocks === null
      ? DEFAULT_KV_TOKENS
      : m.numGpuBlocks * (m.blockSize ?? VLLM_BLOCK_TOKENS);
  }

  predictTpotMs(backend: string, load?: number): number | null {
    const be = this.#backends.get(backend)?.state;
    if (be === undefined) return null;
    const fit = this.#fits(backend, be).tpot;
    return fit === null ? null : predict(fit, [nonNegative(load ?? this.load(backend))]);
  }

  telemetry(backend: string): BackendTelemetry | null {
    return this.#scraper?.get(backend) ?? null;
  }

  backendView(name: string): BackendLiveView | undefined {
    const entry = this.#backends.get(name);
    if (entry === undefined) return undefined;
    const be = entry.state;
    const fits = this.#fits(name, be);
    const load = this.load(name);
    return {
      name,
      url: entry.url,
      inflight: this.inflight(name),
      localInflight: { ...be.inflight },
      ...this.#latency(name, be),
      rates: {
        prefillTokensPerS:
          fits.ttft !== null && (fits.ttft.slopes[0] as number) > 0
            ? 1000 / (fits.ttft.slopes[0] as number)
            : null,
        ttft:
          fits.ttft === null
            ? null
            : {
                baseMs: fits.ttft.intercept,
                msPerPrefillToken: fits.ttft.slopes[0] as number,
                msPerLoad: fits.ttft.slopes[1] as number,
                samples: fits.ttft.samples,
              },
        tpot:
          fits.tpot === null
            ? null
            : {
                baseMs: fits.tpot.intercept,
                msPerLoad: fits.tpot.slopes[0] as number,
                samples: fits.tpot.samples,
              },
        tpotNowMs: fits.tpot === null ? null : predict(fits.tpot, [load]),
        ttftError: fits.ttftError,
        tpotError: fits.tpotError,
      },
      telemetry: this.telemetry(name),
    };
  }

  view(): LiveStateView {
    return {
      instanceId: this.instanceId,
      at: this.#now(),
      windowMs: this.#shape.bucketMs * this.#shape.buckets,
      store: this.status(),
      backends: [...this.#backends.keys()].map((name) => this.backendView(name) as BackendLiveView),
    };
  }

  status(): StoreStatus {
    if (this.#sync !== null) {
      const s = this.#sync.status();
      // The peers whose snapshots the view still holds: through an outage, until the TTL.
      if (!this.#remoteFresh()) s.peers = 0;
      return s;
    }
    return {
      store: 'memory',
      degraded: false,
      lastError: null,
      lastSyncAgeMs: null,
      lastSyncDurationMs: null,
      peers: 0,
      logError: null,
    };
  }

  retainClasses(classes: ReadonlySet<string>): void {
    this.#classes = classes;
    for (const { state } of this.#backends.values()) {
      let dropped = false;
      for (const cls of state.windows.keys()) {
        if (classes.has(cls)) continue;
        state.windows.delete(cls);
        dropped = true;
      }
      if (dropped) state.version++;
    }
  }

  /**
   * Invariants: a backend whose URL changed is another server under the same name, and starts
   * afresh (nothing learnt of the old one, no blocks in its cache, no requests in flight on it);
   * a backend removed while requests ran on it and added back at the same URL adopts their counts,
   * which their leases still decrement, so it does not look idle while they finish.
   */
  setBackends(list: readonly ScrapeTarget[]): void {
    const wanted = new Map(list.map((b) => [b.name, b.url]));
    for (const [name, d] of this.#draining) if (d.inflight.counts.requests <= 0) this.#draining.delete(name);
    for (const [name, entry] of this.#backends) {
      const url = wanted.get(name);
      if (url === entry.url) continue;
      this.#backends.delete(name);
      this.#prefix.drop(name);
      this.#latencyCache.delete(name);
      this.#fitCache.delete(name);
      this.#pool = null;
      if (url === undefined && entry.state.inflight.requests > 0) {
        this.#draining.set(name, { url: entry.url, inflight: entry.state.carry(), lineage: entry.lineage });
      }
    }
    for (const b of list) if (!this.#backends.has(b.name)) this.#add(b);
    this.#scraper?.setTargets(list);
  }

  ready(): Promise<void> {
    return this.#sync?.ready() ?? Promise.resolve();
  }

  close(): Promise<void> {
    if (this.#refreshing !== null) clearTimeout(this.#refreshing);
    this.#refreshing = null;
    this.#closed ??= Promise.all([this.#sync?.close(), this.#scraper?.close()]).then(() => {});
    return this.#closed;
  }

  #add(b: ScrapeTarget): void {
    const d = this.#draining.get(b.name);
    this.#draining.delete(b.name);
    const adopt = d !== undefined && d.url === b.url;
    const carried = adopt ? d.inflight : newInflight(this.#steady, () => this.#drainMsPerToken(b.name));
    this.#backends.set(b.name, {
      state: new BackendState(b.name, this.#shape, FIT_HALF_LIFE_MS, carried),
      url: b.url,
      server: urlKey(b.url),
      startS: null,
      lineage: adopt ? d.lineage : this.#nextLineage++,
    });
  }

  /**
   * Whether what is told of `backend`'s cache under the engine started at `startS` (its
   * process_start_time_seconds, from this instance's scrape or a peer's log part) is of its
   * current engine. Invariant: the index holds one engine's blocks per backend, the latest start
   * known. A later start than known means the engine restarted since the blocks learnt: they are
   * dropped (as a scrape that sees the restart does), and the new start is known from then; an
   * earlier one is the old engine's, and what is told under it is skipped. Without it an instance
   * started after a replica's restart learnt the old engine's blocks from the log's history (it
   * had no earlier scrape to compare with), and routed cold prefixes there as cached.
   */
  #sameEngine(backend: string, startS: number): boolean {
    const entry = this.#backends.get(backend);
    if (entry === undefined) return false;
    if (entry.startS !== null && startS < entry.startS) return false;
    if (entry.startS !== null && startS > entry.startS) this.#prefix.drop(backend);
    entry.startS = startS;
    return true;
  }

  *#states(): Iterable<BackendState> {
    for (const { state } of this.#backends.values()) yield state;
  }

  /**
   * What the in-flight part tells the peers this instance runs. Invariant: requests still running
   * on a backend a reload removed are told until they end, under its name: a peer that has not
   * reloaded yet (a rolling ConfigMap update takes up to a minute) still lists it, and took it for
   * idle, sending it a whole concurrency limit on top of the draining work.
   */
  *#inflightParts(): Iterable<InflightPart> {
    yield* this.#states();
    for (const [name, d] of this.#draining) {
      if (d.inflight.counts.requests <= 0 || this.#backends.has(name)) continue;
      yield { name, inflight: d.inflight.counts, prefillAhead: (ms) => d.inflight.ahead(ms), limit: null };
    }
  }

  /**
   * The peers' in-flight parts replace their counts at every exchange; their full snapshots (null:
   * not exchanged this tick) replace the windows, fits and tenants. Only the latter changes what the
   * caches keyed by #remoteVersion hold: the counts are read as they are, never cached.
   */
  #applyPeers(snapshots: string[] | null, inflight: string[], now: number): number {
    // The drain rate depends on the peers' prefill ahead (drainMsPerToken): up to now at the old one.
    this.#catchUpPrefill();
    if (snapshots !== null) {
      const remote = new Map<string, RemoteBackend>();
      const tenants = new Map<string, RemoteTenant>();
      mergeSnapshots(snapshots, remote, tenants);
      this.#remote = remote;
      this.#remoteTenants = tenants;
      this.#remoteFullAt = now;
      this.#remoteVersion++;
    } else {
      for (const r of this.#remote.values()) r.clearInflight();
    }
    const counted = mergeInflight(inflight, this.#remote);
    this.#peersCounted = counted;
    this.#peersLost = 0;
    this.#remoteAt = now;
    if (snapshots !== null) this.#oweRefresh();
    for (const listener of this.#peerListeners) listener();
    return counted;
  }

  /** Whether the peers' part of the view is still current (else it is dropped). */
  #remoteFresh(): boolean {
    if (this.#sync === null || this.#remoteAt === null) return false;
    const now = this.#now();
    // The wall clock stepped back: the peers' view ages from now, not from a time still to come.
    if (now < this.#remoteAt) this.#remoteAt = now;
    if (this.#remoteFullAt !== null && now < this.#remoteFullAt) this.#remoteFullAt = now;
    if (now - this.#remoteAt > this.#sync.ttlMs) {
      this.#peersLost = this.#peersCounted;
      this.#catchUpPrefill();
      this.#remote = new Map();
      this.#remoteTenants = new Map();
      this.#remoteAt = null;
      this.#remoteFullAt = null;
      this.#remoteVersion++;
      return false;
    }
    // Invariant: what travels only in the full snapshots (windows, fits, tenants) ages on its own.
    // The in-flight parts may go on while every full exchange fails; the peers' counts stay, and
    // the rest goes at the TTL as it would with the counts: frozen, an ended request of a peer
    // still counted against its tenant's limits, and its tokens for as long as it lasted.
    if (this.#remoteFullAt !== null && now - this.#remoteFullAt > this.#sync.ttlMs) {
      const counts = new Map<string, RemoteBackend>();
      for (const [name, r] of this.#remote) {
        const kept = new RemoteBackend();
        Object.assign(kept.inflight, r.inflight);
        kept.prefillAhead = r.prefillAhead;
        counts.set(name, kept);
      }
      this.#remote = counts;
      this.#remoteTenants = new Map();
      this.#remoteFullAt = null;
      this.#remoteVersion++;
    }
    return true;
  }

  /** Peers' data for `backend`, unless the last exchange is older than the liveness TTL. */
  #remoteFor(backend: string): RemoteBackend | undefined {
    return this.#remoteFresh() ? this.#remote.get(backend) : undefined;
  }

  #latency(name: string, be: BackendState): Pick<BackendLiveView, 'latency' | 'byClass'> {
    const now = this.#now();
    const remote = this.#remoteFor(name);
    const key = `${be.version}:${this.#remoteVersion}:${Math.floor(now / this.#shape.bucketMs)}`;
    const cached = this.#latencyCache.get(name);
    if (cached !== undefined && cached.key === key) return cached.value;
    const classes = new Map<string, WindowTotals[]>();
    for (const [cls, w] of be.windows) {
      w.advance(now);
      if (!w.empty) classes.set(cls, [w.total]);
    }
    for (const [cls, t] of remote?.classes ?? []) {
      const list = classes.get(cls);
      if (list === undefined) classes.set(cls, [t]);
      else list.push(t);
    }
    const byClass: Record<string, LatencyView> = {};
    const all: WindowTotals[] = [];
    for (const [cls, parts] of classes) {
      byClass[cls] = latencyView(parts);
      all.push(...parts);
    }
    const value = { latency: latencyView(all), byClass };
    this.#latencyCache.set(name, { key, value });
    return value;
  }

  /**
   * A sample was learnt (or the peers' fits arrived): the fits are solved again off the request
   * path, at the loop's next timers (#refreshFits), instead of by the next prediction.
   */
  #oweRefresh(): void {
    if (this.#refreshing !== null || this.#closed !== null) return;
    this.#refreshing = setTimeout(this.#refreshOwed, 0);
    this.#refreshing.unref();
  }

  readonly #refreshOwed = (): void => this.#refreshFits(true);
  readonly #refreshHeld = (): void => this.#refreshFits(false);

  /**
   * Solves the fits whose own samples or the peers' part changed since their last solve, each at
   * most once per REFIT_MS as a read would; one held back by that is solved when its REFIT_MS is up
   * (`again`: once; the next sample owes the next refresh). A fit stale only by the fleet's prior
   * (another backend's sample) is left to the read that wants it, as before: a backend no request
   * asks about (another model's replica) is not solved on every sample of the fleet. Reads still
   * solve what they find stale past REFIT_MS, and may get a solution up to REFIT_MS older than the
   * last sample, as before; this moves the solve of the usual case out of a request's admission,
   * where it was about a quarter of the admission's time at one stream.
   */
  #refreshFits(again: boolean): void {
    this.#refreshing = null;
    const now = this.#now();
    let waitMs = Number.POSITIVE_INFINITY;
    for (const [name, { state }] of this.#backends) {
      const before = this.#fitCache.get(name);
      if (
        before !== undefined &&
        before.version === state.fitVersion &&
        before.remoteVersion === this.#remoteVersion
      )
        continue;
      this.#fits(name, state);
      const c = this.#fitCache.get(name);
      if (c !== undefined && (c.version !== state.fitVersion || c.remoteVersion !== this.#remoteVersion))
        waitMs = Math.min(waitMs, REFIT_MS - (now - c.at));
    }
    if (!again || waitMs === Number.POSITIVE_INFINITY || this.#closed !== null) return;
    // A clock stepped back: never sooner than a millisecond, never later than REFIT_MS.
    this.#refreshing = setTimeout(this.#refreshHeld, Math.min(REFIT_MS, Math.max(1, waitMs)));
    this.#refreshing.unref();
  }

  /**
   * This instance's and the peers' fit sums together with the fleet's as a prior (#fleetPool),
   * solved; cached until any of them changes, and re-solved at most once per REFIT_MS: one sample
   * among the hundreds a fit weighs moves it by well under a percent, and at a few hundred requests
   * a second a solve per request was a measurable share of the gateway's CPU.
   */
  #fits(name: string, be: BackendState): FitCache {
    const now = this.#now();
    const cached = this.#fitCache.get(name);
    const pool = this.#fleetPool(now);
    // A clock stepped back (the wall clock may be) counts as time passed, not as a fresh solve.
    if (cached !== undefined) {
      const same =
        cached.version === be.fitVersion &&
        cached.remoteVersion === this.#remoteVersion &&
        cached.pool === pool;
      if (same || (now >= cached.at && now - cached.at < REFIT_MS)) return cached.value;
    }
    const { ttft, tpot } = this.#combined(name, be, now);
    // Measured before the prior is added: the fleet's spread, lent to a backend that has too few
    // samples of its own, says nothing of whether this backend's prompts vary.
    const ttftPrefillSpread = ttft.spread(0);
    ttft.addPrior(pool.ttft, priorWeight(ttft));
    tpot.addPrior(pool.tpot, priorWeight(tpot));
    const value: FitCache = {
      ttft: ttft.solve(MIN_FIT_SAMPLES),
      tpot: tpot.solve(MIN_FIT_SAMPLES),
      ttftPrefillSpread,
      ttftError: errorOf(ttft),
      tpotError: errorOf(tpot),
    };
    this.#fitCache.set(name, {
      version: be.fitVersion,
      remoteVersion: this.#remoteVersion,
      pool,
      at: now,
      value,
    });
    return value;
  }

  /** This instance's and the peers' fit sums for one backend, decayed to `now`. */
  #combined(name: string, be: BackendState, now: number): { ttft: FitStats; tpot: FitStats } {
    const remote = this.#remoteFor(name);
    const combine = (local: BackendState['ttftFit'], peers: FitStats | undefined, k: number) => {
      local.decayTo(now);
      const sum = new FitStats(k);
      sum.addStats(local.stats);
      // Peers' sums were decayed to their exchange time; bring them to `now` like the local ones.
      if (peers !== undefined && this.#remoteFullAt !== null)
        sum.addStats(peers, local.decayFactor(now - this.#remoteFullAt));
      return sum;
    };
    return {
      ttft: combine(be.ttftFit, remote?.ttft, TTFT_FEATURES),
      tpot: combine(be.tpotFit, remote?.tpot, TPOT_FEATURES),
    };
  }

  /**
   * Every backend's spread around its own means, pooled: the fleet's slopes, which each backend's
   * solve takes as a prior (PRIOR_SAMPLES). Rebuilt at most once per REFIT_MS, and only when a
   * sample, the peers' view or the backend list has changed; the same object until then (the fit
   * cache compares it by identity).
   */
  #fleetPool(now: number): FleetPool {
    const p = this.#pool;
    if (p !== null) {
      const same = p.fleetVersion === this.#fleetVersion && p.remoteVersion === this.#remoteVersion;
      if (same || (now >= p.at && now - p.at < REFIT_MS)) return p;
    }
    const ttft = new PooledSpread(TTFT_FEATURES);
    const tpot = new PooledSpread(TPOT_FEATURES);
    for (const [name, { state }] of this.#backends) {
      const c = this.#combined(name, state, now);
      ttft.add(c.ttft);
      tpot.add(c.tpot);
    }
    // Read after the loop: reading the peers' part may drop it as stale (a new remoteVersion).
    const pool = {
      fleetVersion: this.#fleetVersion,
      remoteVersion: this.#remoteVersion,
      at: now,
      ttft,
      tpot,
    };
    this.#pool = pool;
    return pool;
  }
}

/** Quantiles straight over the parts' bins: nothing is summed into a new histogram. */
function latencyView(parts: readonly WindowTotals[]): LatencyView {
  const counters = { requests: 0, promptTokens: 0, completionTokens: 0 };
  for (const p of parts) {
    counters.requests += p.counters.requests;
    counters.promptTokens += p.counters.promptTokens;
    counters.completionTokens += p.counters.completionTokens;
  }
  return {
    ttft: quantiles(parts.map((p) => p.hist.ttft)),
    tpot: quantiles(parts.map((p) => p.hist.tpot)),
    queue: quantiles(parts.map((p) => p.hist.queue)),
    ...counters,
  };
}

/**
 * The prior's weight for a backend's sums: PRIOR_SAMPLES × (decayed weight ÷ samples ever), and
 * past PRIOR_SAMPLES samples × (PRIOR_SAMPLES ÷ samples ever) again. The decayed weight is at most
 * the samples ever (each sample weighs 1 when new), so the first factor is at most PRIOR_SAMPLES.
 */
function priorWeight(own: FitStats): number {
  const n = own.samples;
  if (!(n > 0)) return 0;
  return PRIOR_SAMPLES * ((own.v[0] as number) / n) * Math.min(1, PRIOR_SAMPLES / n);
}

function errorOf(stats: FitStats): FitError {
  const e = stats.error();
  return { mape: e.mape, bias: e.bias };
}

function relativeError(predicted: number, actual: number): number {
  return (predicted - actual) / Math.max(actual, MIN_RELATIVE_ERROR_BASE_MS);
}

function nonNegative(v: number): number {
  return Number.isFinite(v) && v > 0 ? v : 0;
}

function defaultInstanceId(): string {
  return `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
}

/**
 * The rate this instance's backlog on a backend drains at, in ms per token: the fit's while no peer
 * has prefill ahead there; none while one has. The backend works every instance's prefill, and which
 * it works first no instance can tell: each draining its own part at the whole rate counted the work
 * done once per instance, and any share of the rate drained the parts faster than the backend
 * together. So with a peer's prefill ahead on the same backend the counts are whole, as the peers'
 * exact counts were before there was a backlog; each part drains again once the peers' is done.
 */
function drainMsPerToken(slope: number | null, remote: RemoteBackend | undefined): number | null {
  return (remote?.prefillAhead ?? 0) > 0 ? null : slope;
}
