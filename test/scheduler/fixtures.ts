// One scheduler over a real memory live state and a real backend set (no probes, nothing sent on
// the wire), for the scheduler's and the admission controller's unit tests.

import type { GatewayError } from '../../src/errors/index.ts';
import type { RoutingPolicy } from '../../src/router/index.ts';
import { leastLoaded } from '../../src/router/policies/least-loaded.ts';
import { Scheduler, type SchedulerSettings } from '../../src/scheduler/scheduler.ts';
import { createLiveState, type LiveState } from '../../src/state/index.ts';
import { BackendSet } from '../../src/upstream/backends.ts';
import { DEFAULT_BACKEND_SET_OPTIONS } from '../../src/upstream/options.ts';
import { latencySample, observe } from '../state/fixtures/sample.ts';

export function schedulerSettings(over: Partial<SchedulerSettings> = {}): SchedulerSettings {
  return {
    policy: 'slagate',
    maxQueue: 100,
    agingMs: 1000,
    // Empty: each request's own priority (a test's request names it).
    priorities: new Map(),
    seeds: true,
    concurrency: {
      min: 1,
      max: 64,
      initial: 2,
      prefillTokens: 0,
      intervalMs: 60_000,
      outerPeriods: 10,
      ttftShare: 0.25,
      tpotShare: 0.8,
    },
    firstTokenTimeoutFactor: 4,
    firstTokenTimeoutMaxMs: 60_000,
    ...over,
  };
}

export interface SchedulerFixture {
  backends: BackendSet;
  live: LiveState;
  scheduler: Scheduler;
  /** `req_id:code` of each refusal the scheduler reported. */
  refused: string[];
  /** Replaces the settings the scheduler reads (as a reload would). */
  set(next: SchedulerSettings): void;
  /** Moves the live state's clock (windows, fits, tenant usage). */
  tick(ms: number): void;
  /** That clock's reading. */
  now(): number;
  /**
   * Teaches every backend's fit (or only `only`'s): dispatch→first token = 20 ms + 0.1 ms per
   * uncached prefill token, 20 samples of five sizes each.
   */
  teach(only?: readonly string[]): void;
  close(): Promise<void>;
}

/** `sharedClock`: the scheduler reads the same clock as the live state (moved only by `tick`). */
export function schedulerFixture(
  names: string[],
  settings = schedulerSettings(),
  router: RoutingPolicy = leastLoaded(() => 0.5),
  opts: { sharedClock?: boolean; blockSizeTokens?: () => number; breakerResetMs?: number } = {},
): SchedulerFixture {
  let clock = 1_000_000;
  const backends = new BackendSet(
    {
      ...DEFAULT_BACKEND_SET_OPTIONS,
      health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: 0 },
      breaker: {
        ...DEFAULT_BACKEND_SET_OPTIONS.breaker,
        resetTimeoutMs: opts.breakerResetMs ?? DEFAULT_BACKEND_SET_OPTIONS.breaker.resetTimeoutMs,
      },
    },
    names.map((name, i) => ({ name, url: `http://127.0.0.1:${9 + i}` })),
  );
  const live = createLiveState(
    { store: 'memory' },
    {
      backends: names.map((name) => ({ name, url: 'http://127.0.0.1:9' })),
      scrape: false,
      now: () => clock,
      ...(opts.blockSizeTokens ? { blockSizeTokens: opts.blockSizeTokens } : {}),
    },
  );
  const refused: string[] = [];
  let current = settings;
  const scheduler = new Scheduler({
    backends: () => backends.list(),
    live,
    router: () => router,
    settings: () => current,
    onRefused: (req, err: GatewayError) => refused.push(`${req.reqId}:${err.code}`),
    ...(opts.sharedClock ? { now: () => clock } : {}),
  });
  return {
    backends,
    live,
    scheduler,
    refused,
    set: (next) => {
      current = next;
    },
    tick: (ms) => {
      clock += ms;
    },
    now: () => clock,
    teach: (only = names) => {
      for (const backend of only) {
        for (let i = 0; i < 20; i++) {
          clock += 10;
          const tokens = 100 + 200 * (i % 5);
          observe(
            live,
            latencySample({
              backend,
              uncachedPromptTokens: tokens,
              queueMs: 0,
              ttftMs: 20 + 0.1 * tokens,
              loadAtDispatch: 0,
            }),
          );
        }
      }
    },
    async close() {
      scheduler.close();
      await live.close();
      await backends.close();
    },
  };
}
