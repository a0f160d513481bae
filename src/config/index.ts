export { envValue, hostProblem } from './checks.ts';
export {
  CONFIG_INVALID,
  CONFIG_UNREADABLE,
  ConfigError,
  type ConfigErrorCode,
  type ConfigIssue,
  formatIssue,
  isConfigError,
} from './errors.ts';
export { loadConfigFile, parseConfig, readConfigText } from './load.ts';
export { changedPaths, renderPath } from './path.ts';
export {
  type BackendSpec,
  type BreakerConfig,
  type Config,
  ConfigSchema,
  DEFAULT_SLA,
  type DeepReadonly,
  type LoggingConfig,
  type LogLevel,
  type MemoryStateConfig,
  type OutlierConfig,
  type RedisStateConfig,
  ROUTER_POLICIES,
  type RouterConfig,
  type RouterPolicy,
  SAFE_NAME,
  type SchedulerConfig,
  type SchedulerPolicy,
  type ServerConfig,
  type SimulateSpec,
  type SlaClass,
  type SlaConfig,
  type StateConfig,
  type Tenant,
  type UpstreamConfig,
} from './schema.ts';
export {
  type ConfigWatcher,
  type ConfigWatchHandlers,
  type ConfigWatchOptions,
  watchConfig,
} from './watch.ts';
