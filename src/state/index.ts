// Live backend state: latency windows, rate fits, in-flight leases, vLLM telemetry, optionally
// shared between gateway instances through Redis (see README.md and docs/state.md).
export type { Quantiles } from './histogram.ts';
export type { InflightCounts, Lease, LeaseTokens } from './leases.ts';
export type {
  BackendLiveView,
  FirstTokenSample,
  FitError,
  LatencySample,
  LatencyView,
  LiveState,
  LiveStateOptions,
  LiveStateView,
  RatesView,
} from './live-state.ts';
export { createLiveState } from './live-state.ts';
export type { StateLogger, StoreStatus } from './redis-sync.ts';
export { livenessTtlMs } from './redis-sync.ts';
export type { BackendTelemetry, ScraperOptions, ScrapeTarget } from './scraper.ts';
export { currentTelemetry } from './scraper.ts';
export type { TenantLease, TenantUsage } from './tenants.ts';
export type { VllmMetrics } from './vllm-metrics.ts';
