// Defaults for the backend set (DEFAULT_BACKEND_SET_OPTIONS) and the retry budget
// (DEFAULT_RETRY_BUDGET) when they are built without a gateway config: the upstream and scheduler
// tests. The gateway never uses them for values the YAML sets (src/gateway.ts passes the YAML's,
// whose defaults and reasons are in docs/configuration.md); it takes from here only what the YAML
// does not expose (keep-alive, breaker buckets, probe thresholds, the minimum retry budget). The
// values follow Envoy (5 consecutive failures, 30 s × n ejections capped at 300 s, 10% ejected with
// at least one host, a retry budget of 20% of active requests with at least 3), opossum advice
// (volumeThreshold ≥ 10) and undici's keep-alive.
import type { BackendSetOptions } from './backends.ts';
import type { RetryBudgetOptions } from './retry-budget.ts';

export const DEFAULT_BACKEND_SET_OPTIONS: Readonly<Omit<BackendSetOptions, 'onEvent' | 'now'>> =
  Object.freeze({
    // An idle connection is let go after 4 s: vLLM's API server (uvicorn, timeout_keep_alive 5 s)
    // closes one after 5 s and sends no Keep-Alive hint, so a pool keeping it longer writes
    // requests onto sockets the server is closing (a reset before the head, counted against a
    // healthy backend and taking the request's one free retry).
    pool: { connections: 128, connectTimeoutMs: 2_000, keepAliveTimeoutMs: 4_000 },
    outlier: {
      consecutiveFailures: 5,
      baseEjectionMs: 30_000,
      maxEjectionMs: 300_000,
      maxEjectionPercent: 10,
    },
    breaker: {
      errorThresholdPercentage: 50,
      volumeThreshold: 10,
      resetTimeoutMs: 10_000,
      rollingWindowMs: 10_000,
      rollingBuckets: 10,
    },
    health: {
      intervalMs: 5_000,
      timeoutMs: 1_000,
      path: '/health',
      unhealthyThreshold: 2,
      healthyThreshold: 1,
    },
  });

export const DEFAULT_RETRY_BUDGET: Readonly<RetryBudgetOptions> = Object.freeze({
  ratio: 0.2,
  minRetries: 3,
});
