// The upstream layer's public surface (see README.md for the attempt lifecycle).

export type { AssembleKind } from './assemble.ts';
export { assemblable } from './assemble.ts';
export type { BackendConfig, BackendState, PoolOptions } from './backend.ts';
export { Backend } from './backend.ts';
export type { BackendEvent, BackendSetOptions } from './backends.ts';
export { BackendSet } from './backends.ts';
export type { BreakerOptions } from './breaker.ts';
export { Cancel } from './cancel.ts';
export { endedByClient, type FailureReason } from './failure.ts';
export type { HealthOptions } from './health.ts';
export { DecodeMeter, gapStats } from './measure.ts';
export { DEFAULT_BACKEND_SET_OPTIONS, DEFAULT_RETRY_BUDGET } from './options.ts';
export type { OutlierOptions } from './outlier.ts';
export type { PayloadSpec } from './payload.ts';
export { upstreamPayload } from './payload.ts';
export type {
  AttemptRecord,
  ProxyConfig,
  ProxyRequest,
  ProxyResult,
  ResultReason,
  UpstreamPath,
} from './proxy.ts';
export { proxyRequest } from './proxy.ts';
export type { ClientMode } from './relay.ts';
export type { ReprobeResult, ReprobeTarget } from './reprobe.ts';
export { Reprober } from './reprobe.ts';
export type { RetryBudgetOptions } from './retry-budget.ts';
export { RetryBudget } from './retry-budget.ts';
export type { AcquireSlot, Slot, SlotRequest } from './slot.ts';
