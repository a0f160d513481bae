// One backend (a vLLM replica): a bounded keep-alive undici Pool, its breaker, its outlier state
// and its active health probe. Whether it may take traffic is decided here, in one place
// (`available`), from those three signals. It does not count its in-flight requests: the live
// state's leases do, for every gateway instance (src/state), and the scheduler reads them there.
import { Pool } from 'undici';
import { type AttemptBreaker, breakerAdmits, trialCall } from './breaker.ts';
import type { AttemptFailure } from './failure.ts';
import type { HealthProbe } from './health.ts';
import type { OutlierDetector } from './outlier.ts';
import type { Attempt, AttemptEnd } from './relay.ts';

export interface BackendConfig {
  name: string;
  /** Origin, e.g. http://10.0.0.10:8000 (a path is ignored). */
  url: string;
  weight?: number;
  /** The backend's API key (vLLM's --api-key), sent as a bearer token on inference and model requests; null or absent: none. */
  apiKey?: string | null;
}

export interface PoolOptions {
  /** Connections per backend; requests beyond wait inside the pool. */
  connections: number;
  connectTimeoutMs: number;
  keepAliveTimeoutMs: number;
}

export type BackendState = 'healthy' | 'down' | 'ejected' | 'open' | 'half_open' | 'removed';

export interface BackendParts {
  breaker: AttemptBreaker;
  outlier: OutlierDetector;
  probe: HealthProbe | null;
  /** Asks the set whether one more backend may be ejected now. */
  mayEject: () => boolean;
  /** Called with the ejection duration when a failure ejects this backend. */
  onEjected: (ms: number) => void;
  /** Called when what its /v1/models lists changes (learned). */
  onModels?: (models: ReadonlySet<string>) => void;
}

export class Backend {
  readonly name: string;
  readonly url: string;
  /** Router hint from the config; updated in place on reload. */
  weight: number;
  /**
   * `Bearer <key>` for a backend that wants one, else null; updated in place on reload. Held here
   * only, never logged: the config names the variable, not the key.
   */
  authorization: string | null;
  /**
   * The model names (served names and adapters) its last readable /v1/models answer listed; null
   * until it has given one. Set by the model catalog's refresh (learned, from
   * src/server/model-catalog.ts).
   */
  models: ReadonlySet<string> | null = null;
  readonly pool: Pool;
  readonly breaker: AttemptBreaker;
  readonly outlier: OutlierDetector;
  readonly probe: HealthProbe | null;
  readonly #mayEject: () => boolean;
  readonly #onEjected: (ms: number) => void;
  readonly #onModels: ((models: ReadonlySet<string>) => void) | null;
  #removed = false;
  #modelsHeld = false;
  /**
   * The half-open breaker's one trial, given to a slot (takeTrial) whose attempt has not ended.
   * Invariant: a half-open backend is granted one slot, not as many as its limit allows before the
   * first of them reaches the breaker (opossum would refuse the rest, and their requests would
   * come back as new ones). Set only while half-open, and cleared when the breaker changes state
   * (every change emits) or the slot is returned, so it is never set outside half-open.
   */
  #trial: object | null = null;
  /** performance.now() when it last began an answer (a first token, a whole body); null: never. */
  answeredAt: number | null = null;
  #running = 0;

  constructor(config: BackendConfig, pool: PoolOptions, parts: BackendParts) {
    this.name = config.name;
    this.url = new URL(config.url).origin;
    this.weight = config.weight ?? 1;
    this.authorization = authorizationOf(config);
    this.pool = new Pool(this.url, {
      connections: pool.connections,
      pipelining: 1,
      connectTimeout: pool.connectTimeoutMs,
      keepAliveTimeout: pool.keepAliveTimeoutMs,
    });
    this.breaker = parts.breaker;
    this.outlier = parts.outlier;
    this.probe = parts.probe;
    this.#mayEject = parts.mayEject;
    this.#onEjected = parts.onEjected;
    this.#onModels = parts.onModels ?? null;
    const clearTrial = () => {
      this.#trial = null;
    };
    this.breaker.on('open', clearTrial);
    this.breaker.on('halfOpen', clearTrial);
    this.breaker.on('close', clearTrial);
  }

  get state(): BackendState {
    if (this.#removed) return 'removed';
    if (this.probe !== null && !this.probe.up) return 'down';
    if (this.outlier.ejected()) return 'ejected';
    if (this.breaker.opened) return 'open';
    if (this.breaker.halfOpen) return 'half_open';
    return 'healthy';
  }

  /**
   * Neither retired, nor down by its probe, nor ejected: an open breaker is not out of service
   * (it half-opens after its short reset on its own).
   */
  get inService(): boolean {
    return !this.#removed && (this.probe === null || this.probe.up) && !this.outlier.ejected();
  }

  /** Its health probe has passed at least once (always, without a probe): what readiness waits for. */
  get healthConfirmed(): boolean {
    return this.probe === null || this.probe.confirmed;
  }

  /**
   * May be sent a request for `model`. Invariant: a backend that has listed its models is sent
   * only those; one that has not (it never answered /v1/models, or not yet) is taken to serve every
   * configured model, as a fleet of one model is, and a wrong guess comes back as vLLM's 404, which
   * the attempt loop settles on another backend (failure.ts, upstream_not_found).
   */
  serves(model: string): boolean {
    return !this.#modelsHeld && this.mayServe(model);
  }

  /**
   * Serves `model`, or will once a hold on its models is over (holdModels): what a request asks
   * to know whether to wait for this backend or give up on it. A held backend is granted nothing,
   * but its model's requests wait for it rather than get a 503.
   */
  mayServe(model: string): boolean {
    return this.models === null || this.models.has(model);
  }

  /**
   * Serves nothing until its /v1/models answer is in (learned) or releaseModels says the question
   * is over: a backend a reload adds, which the queue would otherwise offer every configured model
   * while its answer is on the way (a replica of one model sent another's requests, each a 404 and
   * a failure counted against it, enough to eject it).
   */
  holdModels(): void {
    this.#modelsHeld = true;
  }

  /** The question holdModels waited for is over, answered or not: it serves as serves() says. */
  releaseModels(): void {
    this.#modelsHeld = false;
  }

  /** What its /v1/models answer listed now (a CatalogTarget's `learned`); told on when it changed. */
  learned(models: ReadonlySet<string>): void {
    this.#modelsHeld = false;
    const was = this.models;
    if (was !== null && was.size === models.size && [...models].every((m) => was.has(m))) return;
    this.models = models;
    if (!this.#removed) this.#onModels?.(models);
  }

  /** May take a new request now. A half-open backend is available only until its one trial starts. */
  get available(): boolean {
    return this.inService && breakerAdmits(this.breaker) && this.#trial === null;
  }

  /**
   * Available, or will be without another recovery: in service with its breaker closed or
   * half-open (whose trial, once out, ends by closing it or opening it again). A request may wait
   * for such a backend; only with none is there nowhere to send it. Invariant: a fleet coming back
   * from an outage (every breaker half-open, each trial out) queues what arrives meanwhile instead
   * of answering it 503: the trials close the breakers tens of milliseconds later, and each change
   * of the breaker pumps the queue.
   */
  get usable(): boolean {
    return this.inService && !this.breaker.opened;
  }

  /**
   * A slot on this backend was granted: while its breaker is half-open that is the one trial, and
   * the backend is not available to another until the token is returned or the breaker moves on.
   * Returns the token, or null when the breaker is not half-open.
   */
  takeTrial(): object | null {
    if (!this.breaker.halfOpen) return null;
    const token = {};
    this.#trial = token;
    return token;
  }

  /** The slot holding the trial ended (its attempt ran or never started). */
  returnTrial(token: object): void {
    if (this.#trial === token) this.#trial = null;
  }

  /**
   * Runs one attempt through the breaker and records its end for outlier detection. Returns null
   * when the breaker refused the call (the attempt never started: not an attempt at all).
   */
  async run(attempt: Attempt): Promise<AttemptEnd | null> {
    this.#running++;
    try {
      return await this.#run(attempt);
    } finally {
      this.#running--;
    }
  }

  /**
   * Attempts on this server that have not ended (run() has not returned): what a backend a reload
   * removed still drains, where the live state counts by name only.
   */
  get running(): number {
    return this.#running;
  }

  async #run(attempt: Attempt): Promise<AttemptEnd | null> {
    try {
      const how = await this.breaker.fire(trialCall(this.breaker, () => attempt.start(this.pool)));
      // Invariant: outlier detection counts a request the backend answered as a success when the
      // answer begins, as the breaker does (and Envoy at a good response head), not when a stream
      // that may last minutes ends: a replica serving half its requests well was otherwise ejected
      // once five failures ended in a row while its good streams were still running.
      if (how === 'first_token' || how === 'body') {
        this.answeredAt = performance.now();
        this.outlier.success();
      }
    } catch {
      // A pre-commit failure already reached the breaker; `done` carries it below.
      if (!attempt.started) return null;
    }
    const end = await attempt.done;
    if (end.kind === 'ok') this.outlier.completed();
    else if (end.failure?.backendFault) this.blame(end.failure, end.committed);
    return end;
  }

  /**
   * Counts a failure against this backend for outlier detection. `run` calls it for the failures
   * that are the backend's when they end; the attempt loop calls it later for one that another
   * backend showed to be this one's (an in-band rejection, failure.ts).
   */
  blame(failure: AttemptFailure, afterAnswer = false): void {
    // A retired backend's name may already belong to its replacement (a reload that changed its URL).
    if (this.#removed) return;
    const ms = this.outlier.failure(this.#mayEject, !failure.reachedEngine, afterAnswer);
    if (ms !== null) this.#onEjected(ms);
  }

  /**
   * Takes the backend out of service: no new requests; requests already in the pool finish
   * (Pool.close waits for them). The breaker and the probe stop now, so no timer outlives this.
   */
  async retire(): Promise<void> {
    this.#removed = true;
    this.breaker.shutdown();
    await Promise.all([this.probe?.stop(), this.pool.close()]);
  }
}

/** The Authorization header value for a backend's key, or null without one. */
export function authorizationOf(config: BackendConfig): string | null {
  const key = config.apiKey?.trim();
  return key ? `Bearer ${key}` : null;
}
