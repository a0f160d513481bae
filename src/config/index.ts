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
export { loadConfigFile, parseConfig } from './load.ts';
export { changedPaths, renderPath } from './path.ts';
export {
  type BackendSpec,
  type Config,
  ConfigSchema,
  type DeepReadonly,
  type LoggingConfig,
  type RedisStateConfig,
  ROUTER_POLICIES,
  type RouterConfig,
  type RouterPolicy,
  type SchedulerConfig,
  type SlaClass,
  type StateConfig,
  type UpstreamConfig,
} from './schema.ts';
export {
  type ConfigWatcher,
  type ConfigWatchHandlers,
  type ConfigWatchOptions,
  watchConfig,
} from './watch.ts';
