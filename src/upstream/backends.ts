// The set of backends. Reload (`update`) adds new backends and retires removed ones without
// dropping their in-flight requests; a backend whose URL changed is replaced under the same name.
// The set owns what is shared across backends: the ejection cap and the breakers' bucket clock.
// Invariant: an ejection never takes the last backend in service for a model out of service, then
// or later. A replica that fails some requests serves better than none (Envoy reaches the same end
// with its panic threshold); the breaker, whose reset is short, still guards a sole backend that
// fails them all. So an ejection is allowed only while every model the backend lists is served by
// another backend in service (while its list is unknown, it is taken to serve every model: each
// model any other backend lists, #othersServe), and when that stops holding afterwards (the
// others' probes fail, a reload removes them, their lists drop the model) the ejections still
// running on the backends that serve a model left without one end at once (`unejected`). Per model, not per fleet: in a fleet
// of two models, the one replica of the first left its model unserved (503 for each of its
// requests, for up to the ejection's length) while the second's replicas were in service.
// Invariant: every ejection's end is told (`unejected`), the early ones and those that run out,
// each once, and the queue is pumped on it (a timer per ejection, cleared when it ends early).
// Invariant: after close() resolves, the set owns no timer, socket or listener.
import { EventEmitter } from 'node:events';
import { authorizationOf, Backend, type BackendConfig, type PoolOptions } from './backend.ts';
import { type BreakerOptions, createBreaker } from './breaker.ts';
import { type HealthOptions, HealthProbe } from './health.ts';
import { maxEjected, OutlierDetector, type OutlierOptions } from './outlier.ts';

export type BackendEvent =
  | { type: 'ejected'; backend: string; durationMs: number }
  | { type: 'unejected'; backend: string }
  | { type: 'breaker_open' | 'breaker_half_open' | 'breaker_close'; backend: string }
  | { type: 'probe_down' | 'probe_up'; backend: string }
  /** Its engine restarted (the live state saw a new process: a later start time, or counters that fell): a cold cache. */
  | { type: 'engine_restarted'; backend: string }
  /** Its first probe passed: a backend that was not up when the gateway asked its /v1/models is now. */
  | { type: 'probe_confirmed'; backend: string }
  /** What its /v1/models lists changed (Backend.learned): the queue may go to it now, or not. */
  | { type: 'models'; backend: string; models: readonly string[] }
  /**
   * In the set or out of it: the backends it starts with, a reload's changes, every backend as it
   * closes; `drained` when a removed one's last attempt has ended (its server may be stopped).
   */
  | { type: 'added' | 'removed' | 'drained'; backend: string; why: 'start' | 'reload' | 'shutdown' };

export interface BackendSetOptions {
  pool: PoolOptions;
  outlier: OutlierOptions;
  breaker: BreakerOptions;
  health: HealthOptions;
  /** Hook for metrics and logs (the upstream layer logs nothing itself). Must not throw. */
  onEvent?: (event: BackendEvent) => void;
  /** Clock for outlier ejection (ms); defaults to performance.now. */
  now?: () => number;
}

export class BackendSet {
  readonly #opts: BackendSetOptions;
  readonly #now: () => number;
  readonly #backends = new Map<string, Backend>();
  /** Backends out of the set whose attempts have not all ended, and the end of their drain. */
  readonly #retiring = new Map<Backend, Promise<void>>();
  readonly #rotate = new EventEmitter();
  readonly #rotateTimer: NodeJS.Timeout;
  /** Each running ejection's end, told when it comes (#unejected clears it when it ends early). */
  readonly #ejectionEnds = new Map<Backend, NodeJS.Timeout>();

  constructor(opts: BackendSetOptions, configs: readonly BackendConfig[] = []) {
    this.#opts = opts;
    this.#now = opts.now ?? (() => performance.now());
    this.#rotate.setMaxListeners(0);
    const bucketMs = opts.breaker.rollingWindowMs / opts.breaker.rollingBuckets;
    this.#rotateTimer = setInterval(() => this.#rotate.emit('rotate'), bucketMs);
    this.#rotateTimer.unref();
    void this.#update(configs, 'start');
  }

  get(name: string): Backend | undefined {
    return this.#backends.get(name);
  }

  list(): Backend[] {
    return [...this.#backends.values()];
  }

  /**
   * Backends a reload (or the shutdown) took out of the set that are still draining: no new
   * request goes to them; their attempts under way finish. Each leaves this list when told
   * `drained`. A backend whose URL changed is here under its name while its replacement is in list().
   */
  retiring(): Backend[] {
    return [...this.#retiring.keys()];
  }

  /**
   * `name`'s engine restarted (the live state saw a new process): told as an event, and a
   * new process, which a first ejection's failures say nothing about, ends it (outlier.ts). A no-op
   * for a name the set does not hold.
   */
  engineRestarted(name: string): void {
    const b = this.#backends.get(name);
    if (b === undefined) return;
    this.#emit({ type: 'engine_restarted', backend: name });
    if (b.outlier.engineRestarted()) this.#unejected(b);
  }

  /** Applies a new backend list (a reload); returns when the retired backends have drained. */
  update(configs: readonly BackendConfig[]): Promise<void> {
    return this.#update(configs, 'reload');
  }

  #update(configs: readonly BackendConfig[], why: 'start' | 'reload'): Promise<void> {
    const wanted = new Map(configs.map((c) => [c.name, c]));
    const drains: Promise<void>[] = [];
    for (const [name, b] of this.#backends) {
      const c = wanted.get(name);
      if (c === undefined || new URL(c.url).origin !== b.url) {
        this.#backends.delete(name);
        drains.push(this.#retire(b, why));
      } else {
        b.weight = c.weight ?? 1;
        b.authorization = authorizationOf(c);
      }
    }
    for (const c of configs) {
      if (!this.#backends.has(c.name)) this.#backends.set(c.name, this.#build(c, why));
    }
    if (drains.length > 0) this.#rescue();
    return Promise.all(drains).then(() => undefined);
  }

  /** Retires every backend (in-flight requests finish first) and stops the shared clock. */
  async close(): Promise<void> {
    clearInterval(this.#rotateTimer);
    for (const b of [...this.#ejectionEnds.keys()]) this.#clearEjectionEnd(b);
    const all = [...this.#backends.values()];
    this.#backends.clear();
    await Promise.all([...all.map((b) => this.#retire(b, 'shutdown')), ...this.#retiring.values()]);
  }

  #retire(b: Backend, why: 'start' | 'reload' | 'shutdown'): Promise<void> {
    this.#clearEjectionEnd(b);
    const p = b.retire().finally(() => {
      this.#retiring.delete(b);
      this.#emit({ type: 'drained', backend: b.name, why });
    });
    this.#retiring.set(b, p);
    this.#emit({ type: 'removed', backend: b.name, why });
    return p;
  }

  /** The ejection cap leaves room, and each model `name` serves stays served if it goes. */
  #mayEject(name: string): boolean {
    const now = this.#now();
    let ejected = 0;
    for (const b of this.#backends.values()) if (b.outlier.ejected(now)) ejected++;
    const b = this.#backends.get(name);
    return (
      b !== undefined &&
      this.#othersServe(b) &&
      ejected < maxEjected(this.#backends.size, this.#opts.outlier.maxEjectionPercent)
    );
  }

  /**
   * Another backend serving, in service with its breaker closed, serves each model `b` lists.
   * With its list unknown it is taken to serve every model: then another serving backend whose list
   * is unknown too, or, for each model any other backend lists, one serving that serves it (at
   * least one serving in all). A breaker open or half-open (one trial at a time) counts as not
   * serving here: counted, a backend was ejected beside the one other whose breaker was open (or
   * that breaker opened beside it), and the model had no backend at all until the breaker's reset;
   * half-open counted, it was ejected again at each of the other's trials and rescued when the
   * trial failed.
   */
  #othersServe(b: Backend): boolean {
    const others: Backend[] = [];
    for (const o of this.#backends.values()) if (o !== b && o.inService && o.breaker.closed) others.push(o);
    if (others.length === 0) return false;
    const served = (model: string) => others.some((o) => o.mayServe(model));
    if (b.models !== null) {
      for (const model of b.models) if (!served(model)) return false;
      return true;
    }
    if (others.some((o) => o.models === null)) return true;
    for (const o of this.#backends.values()) {
      if (o === b || o.models === null) continue;
      for (const model of o.models) if (!served(model)) return false;
    }
    return true;
  }

  /** `b`'s ejection ended (ran out, or ended early): told once, its timer cleared. */
  #unejected(b: Backend): void {
    this.#clearEjectionEnd(b);
    this.#emit({ type: 'unejected', backend: b.name });
  }

  #clearEjectionEnd(b: Backend): void {
    const end = this.#ejectionEnds.get(b);
    if (end !== undefined) clearTimeout(end);
    this.#ejectionEnds.delete(b);
  }

  /** `b` was ejected for `ms`: its end is told when it comes, unless it ends early. */
  #ejected(b: Backend, ms: number): void {
    this.#emit({ type: 'ejected', backend: b.name, durationMs: ms });
    this.#clearEjectionEnd(b);
    const end = setTimeout(() => {
      this.#ejectionEnds.delete(b);
      if (!b.outlier.ejected()) this.#emit({ type: 'unejected', backend: b.name });
    }, ms + 1);
    end.unref();
    this.#ejectionEnds.set(b, end);
  }

  /**
   * A model may have lost its last backend in service (the others' probes failed, a reload
   * removed them, their lists dropped it): the ejections still running end now on every backend
   * whose probe is up and that serves a model no backend in service serves (see the header). Each
   * is judged against the service as it stands before any of them ends, so a model's ejected
   * backends all come back together, as the fleet's did when nothing was left.
   */
  #rescue(): void {
    const stranded: Backend[] = [];
    for (const b of this.#backends.values()) {
      if (b.outlier.ejected() && (b.probe === null || b.probe.up) && !this.#othersServe(b)) stranded.push(b);
    }
    for (const b of stranded) if (b.outlier.release()) this.#unejected(b);
  }

  #build(c: BackendConfig, why: 'start' | 'reload'): Backend {
    const { name } = c;
    const breaker = createBreaker(name, this.#opts.breaker, this.#rotate);
    const outlier = new OutlierDetector(this.#opts.outlier, this.#now);
    let confirmed = false;
    // The backend is made below; the probe's callbacks run only once it exists.
    let backend: Backend;
    const probe: HealthProbe | null =
      this.#opts.health.intervalMs > 0
        ? new HealthProbe(
            new URL(c.url).origin,
            this.#opts.health,
            (up) => {
              this.#emit({ type: up ? 'probe_up' : 'probe_down', backend: name });
              // Down: the last in service may have gone. Up: an ejected backend whose probe was
              // down when the rest of the fleet left may be the one left to serve.
              this.#rescue();
            },
            (ok) => {
              if (ok && !confirmed) {
                confirmed = true;
                this.#emit({ type: 'probe_confirmed', backend: name });
              }
              if (ok && outlier.probePassed()) this.#unejected(backend);
            },
            () => backend.answeredAt,
          )
        : null;
    backend = new Backend(c, this.#opts.pool, {
      breaker,
      outlier,
      probe,
      mayEject: () => this.#mayEject(name),
      onEjected: (ms) => this.#ejected(backend, ms),
      onModels: (models) => {
        this.#emit({ type: 'models', backend: name, models: [...models] });
        // Its list may have dropped a model an ejected backend is the last to serve.
        this.#rescue();
      },
    });
    // Invariant: a breaker's events reach the listeners (the scheduler pumps on them) after the
    // backend's own state has followed: registered before it, a close was told while the half-open
    // trial was still held, and that pump found the recovered backend unavailable.
    breaker.on('open', () => {
      this.#emit({ type: 'breaker_open', backend: name });
      // It may have been the last backend serving a model whose other backends are ejected.
      this.#rescue();
    });
    breaker.on('halfOpen', () => this.#emit({ type: 'breaker_half_open', backend: name }));
    breaker.on('close', () => this.#emit({ type: 'breaker_close', backend: name }));
    probe?.start();
    this.#emit({ type: 'added', backend: name, why });
    return backend;
  }

  #emit(event: BackendEvent): void {
    this.#opts.onEvent?.(event);
  }
}
