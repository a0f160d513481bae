// Everything a request handler reads, in one object the composition root (src/gateway.ts) builds
// and a config reload swaps parts of. Handlers read `rt.x` at the moment they need it, never cache
// it across awaits, so a reload applies to the next request without touching one in flight.

import type { Logger } from 'pino';
import type { AdmissionController } from '../admission/index.ts';
import type { Config } from '../config/index.ts';
import { GatewayError } from '../errors/index.ts';
import type { TokenEstimates } from '../prompt/tenant-estimates.ts';
import type { RoutingPolicy } from '../router/index.ts';
import type { Scheduler } from '../scheduler/index.ts';
import type { LiveState } from '../state/index.ts';
import type { AdmissionLog } from '../telemetry/admission-log.ts';
import type { GatewayMetrics } from '../telemetry/metrics.ts';
import {
  type Backend,
  type BackendSet,
  Cancel,
  type ProxyConfig,
  type RetryBudget,
} from '../upstream/index.ts';
import type { Afterwork } from './afterwork.ts';
import type { Authenticator } from './auth.ts';
import type { ModelCatalog } from './model-catalog.ts';

export interface Runtime {
  config: Config;
  auth: Authenticator;
  policy: RoutingPolicy;
  models: ModelCatalog;
  backends: BackendSet;
  /** Live per-backend state: in-flight (all gateway instances), latency windows, rates, telemetry. */
  live: LiveState;
  admission: AdmissionController;
  scheduler: Scheduler;
  retryBudget: RetryBudget;
  proxy: ProxyConfig;
  admissionLog: AdmissionLog;
  metrics: GatewayMetrics;
  logger: Logger;
  /** Characters per prompt token, learnt from what the backends count. */
  tokens: TokenEstimates;
  lifecycle: Lifecycle;
  /** A finished request's bookkeeping, run after the response (afterwork.ts); settle() before reading it. */
  afterwork: Afterwork;
  /**
   * For each backend a reload took out of the set, what counted its requests in the live state
   * then (LiveState.countedAs, null: nothing at its URL): while the entry in service at its name
   * and URL still says the same, that entry counts its attempts still draining.
   */
  drainCountedAs: WeakMap<Backend, number | null>;
}

/** What a request refused or cut by the shutdown is told. */
export function shuttingDownError(): GatewayError {
  return new GatewayError('shutting_down', 'The gateway is shutting down.');
}

/**
 * In-flight inference requests (from their head on, queued ones included) and the shutdown switch. Its count is the one
 * "requests active in this gateway" the retry budget reads.
 */
export class Lifecycle {
  shuttingDown = false;
  /** Set when the grace period is over and the server closes the connections still open itself. */
  connectionsCut = false;
  readonly #active = new Set<Cancel>();
  #idle: (() => void) | null = null;

  get active(): number {
    return this.#active.size;
  }

  /**
   * Registers one inference request, from its head on (its body may still be coming); its
   * cancellation (the proxy's `signal`) is aborted with a shutting_down GatewayError when the
   * grace period runs out.
   */
  enter(): Cancel {
    const c = new Cancel();
    this.#active.add(c);
    return c;
  }

  leave(c: Cancel): void {
    this.#active.delete(c);
    if (this.#active.size === 0) this.#idle?.();
  }

  /** Resolves when no request is in flight, or after `graceMs`, when the rest are cut. */
  async drain(graceMs: number): Promise<{ cut: number }> {
    if (this.#active.size === 0) return { cut: 0 };
    const idle = new Promise<void>((resolve) => {
      this.#idle = resolve;
    });
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => {
      timer = setTimeout(() => resolve('late'), graceMs);
    });
    const won = await Promise.race([idle, late]);
    clearTimeout(timer);
    this.#idle = null;
    if (won !== 'late') return { cut: 0 };
    const cut = this.#active.size;
    // A GatewayError reason tells the proxy to answer the client (503, or an SSE error event and
    // [DONE] mid-stream) rather than treat the cut as a disconnect.
    for (const c of this.#active) c.abort(shuttingDownError());
    return { cut };
  }
}
