// The gateway's configuration schema (DESIGN section 3: these key names are the product contract).
// Invariants the schema itself protects:
// - every object is closed (additionalProperties: false), so a misspelt key is an error, never ignored;
// - every key the gateway reads after loading is present: optional input keys carry a `default`, so
//   `Config` (the Static type) describes the loaded value, not the file. The few defaults that depend
//   on other keys (tenant class, simulate model, initial concurrency) are filled by defaults.ts;
// - names that end up in Redis keys, metric labels or headers match SAFE_NAME.
// Default values and their reasoning are documented in docs/configuration.md.
import { type Static, Type } from 'typebox';

/** Tenant, backend and class names: they become Redis key parts, metric labels and header values. */
export const SAFE_NAME = '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$';
const SHA256_HEX = '^[0-9a-f]{64}$';
const HEADER_NAME = "^[a-z0-9!#$%&'*+.^_`|~-]+$";
const PROFILE_NAME = '^[a-z0-9][a-z0-9._-]*$';
/** host:port with a port ioredis connects to (1-65535; a leading zero is no port either). */
const PORT = '(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])';
const HOST_PORT = `^[A-Za-z0-9.:\\[\\]-]+:${PORT}$`;
export const ENV_NAME = '^[A-Za-z_][A-Za-z0-9_]*$';

/** What each pattern means, for error messages. */
export const PATTERN_HINTS: Readonly<Record<string, string>> = {
  [SAFE_NAME]: "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
  [SHA256_HEX]: 'must be 64 lowercase hex characters (the SHA-256 of the API key, as sha256sum prints it)',
  [HEADER_NAME]: 'must be a lowercase HTTP header name',
  [PROFILE_NAME]: "must be a profile name: lowercase letters, digits, '.', '_' or '-'",
  [HOST_PORT]: 'must be host:port, the port from 1 to 65535',
  [ENV_NAME]: "must be an environment variable's name: letters, digits and '_', not starting with a digit",
};

const closed = { additionalProperties: false } as const;
/**
 * The longest delay a Node timer takes (2^31 − 1 ms, about 24.8 days): a longer one fires after
 * 1 ms. Every duration that sets a timer is bounded by it.
 */
const MAX_TIMER_MS = 2_147_483_647;
const ms = (min: number, def: number) => Type.Integer({ minimum: min, maximum: MAX_TIMER_MS, default: def });

export const ServerSchema = Type.Object(
  {
    host: Type.String({ minLength: 1, default: '127.0.0.1' }),
    port: Type.Integer({ minimum: 0, maximum: 65535, default: 8080 }),
    body_limit_bytes: Type.Integer({ minimum: 1024, default: 4 * 1024 * 1024 }),
    keep_alive_timeout_ms: ms(1, 72_000),
    shutdown_grace_ms: ms(0, 30_000),
  },
  { ...closed, default: {} },
);

export const BackendSchema = Type.Object(
  {
    name: Type.String({ pattern: SAFE_NAME }),
    url: Type.String({ minLength: 1 }),
    weight: Type.Number({ exclusiveMinimum: 0, maximum: 1000, default: 1 }),
    // The key itself never sits in the file: the variable holding it is named here.
    api_key_env: Type.Optional(Type.String({ pattern: ENV_NAME })),
  },
  closed,
);

export const SimulateSchema = Type.Object(
  {
    replicas: Type.Integer({ minimum: 1, maximum: 64 }),
    profile: Type.String({ pattern: PROFILE_NAME, default: 'llama3-8b-h100' }),
    time_scale: Type.Number({ exclusiveMinimum: 0, maximum: 1000, default: 1 }),
    seed: Type.Integer({ minimum: 0, default: 0 }),
    /** Filled from models[0] when absent (defaults.ts). */
    model: Type.String({ minLength: 1 }),
  },
  closed,
);

export const MemoryStateSchema = Type.Object({ store: Type.Literal('memory') }, closed);

export const RedisStateSchema = Type.Object(
  {
    store: Type.Literal('redis'),
    redis_url: Type.String({ minLength: 1 }),
    key_prefix: Type.String({ pattern: SAFE_NAME, default: 'slagate' }),
    connect_timeout_ms: ms(1, 2_000),
    /** At most 2 s: the liveness TTL outlasts 2 × refresh_interval_ms + this, and must stay ≤ 4 s. */
    command_timeout_ms: Type.Integer({ minimum: 1, maximum: 2000, default: 100 }),
    /** At most 1 s: a dead instance must stop counting within 5 s (docs/state.md, liveness TTL). */
    refresh_interval_ms: Type.Integer({ minimum: 10, maximum: 1000, default: 500 }),
    /** The in-flight counts' own pace (at most refresh_interval_ms: they go with every exchange). */
    inflight_interval_ms: Type.Integer({ minimum: 10, maximum: 1000, default: 100 }),
    topology: Type.Enum(['standalone', 'sentinel', 'cluster'], { default: 'standalone' }),
    /** Sentinel: the sentinels as host:port; redis_url then gives only credentials and db. */
    sentinels: Type.Array(Type.String({ pattern: HOST_PORT }), { default: [] }),
    sentinel_name: Type.String({ minLength: 1, default: 'mymaster' }),
    /** Cluster: seed nodes as host:port (default: redis_url's host and port). */
    cluster_nodes: Type.Array(Type.String({ pattern: HOST_PORT }), { default: [] }),
  },
  closed,
);

/** Discriminated by `store`; load.ts validates the branch `store` names (see STATE_BRANCHES). */
export const StateSchema = Type.Union([MemoryStateSchema, RedisStateSchema], {
  default: { store: 'memory' },
});
export const STATE_BRANCHES = { memory: MemoryStateSchema, redis: RedisStateSchema } as const;

export const SlaClassSchema = Type.Object(
  {
    ttft_p99_ms: Type.Number({ exclusiveMinimum: 0, maximum: MAX_TIMER_MS }),
    tpot_p99_ms: Type.Number({ exclusiveMinimum: 0, maximum: MAX_TIMER_MS }),
    priority: Type.Integer({ minimum: 0, maximum: 100 }),
    sheddable: Type.Boolean({ default: false }),
  },
  closed,
);

export const DEFAULT_SLA = {
  default_class: 'interactive',
  classes: {
    interactive: { ttft_p99_ms: 500, tpot_p99_ms: 50, priority: 0 },
    completion: { ttft_p99_ms: 200, tpot_p99_ms: 30, priority: 0 },
    batch: { ttft_p99_ms: 30_000, tpot_p99_ms: 200, priority: 2, sheddable: true },
  },
};

export const SlaSchema = Type.Object(
  {
    default_class: Type.String({ pattern: SAFE_NAME }),
    classes: Type.Record(Type.String({ pattern: SAFE_NAME }), SlaClassSchema, {
      ...closed,
      minProperties: 1,
    }),
  },
  { ...closed, default: DEFAULT_SLA },
);

export const TenantSchema = Type.Object(
  {
    name: Type.String({ pattern: SAFE_NAME }),
    api_key_sha256: Type.String({ pattern: SHA256_HEX }),
    /** Filled from sla.default_class when absent (defaults.ts). */
    class: Type.String({ minLength: 1 }),
    /** Filled with [class] when absent (defaults.ts). */
    allowed_classes: Type.Array(Type.String({ minLength: 1 }), { minItems: 1 }),
    max_concurrency: Type.Optional(Type.Integer({ minimum: 1 })),
    tokens_per_minute: Type.Optional(Type.Integer({ minimum: 1 })),
    /** The tenant's prompts share no prefix-cache block with another tenant's (a cache_salt of its own). */
    isolate_prefix_cache: Type.Boolean({ default: false }),
  },
  closed,
);

export const SchedulerSchema = Type.Object(
  {
    policy: Type.Enum(['slagate', 'fcfs'], { default: 'slagate' }),
    max_queue: Type.Integer({ minimum: 0, default: 1024 }),
    aging_ms: ms(1, 5_000),
    /** Seeds (src/scheduler/README.md): a late request sent on purpose to a backend the fleet leaves unused. */
    seeds: Type.Boolean({ default: true }),
    concurrency: Type.Object(
      {
        min: Type.Integer({ minimum: 1, default: 4 }),
        max: Type.Integer({ minimum: 1, default: 256 }),
        /** Filled with clamp(16, min, max) when absent (defaults.ts). */
        initial: Type.Integer({ minimum: 1 }),
        /** The inner control loop's period (src/scheduler/controller.ts). */
        interval_ms: Type.Integer({ minimum: 50, maximum: 60_000, default: 250 }),
        /** Inner periods per step of the outer loop (tpot_share servo). */
        outer_periods: Type.Integer({ minimum: 1, maximum: 1000, default: 20 }),
        /** Share of the class TTFT target the p90 waiting inside a backend may use. */
        ttft_share: Type.Number({ exclusiveMinimum: 0, maximum: 1, default: 0.25 }),
        /** Starting share of the TPOT target the median token gap may use (the outer loop moves it). */
        tpot_share: Type.Number({ minimum: 0.6, maximum: 1, default: 0.8 }),
        /** Prefill tokens that may wait on a backend at once (dispatched, no first token yet); 0 = no cap. */
        prefill_tokens: Type.Integer({ minimum: 0, default: 2048 }),
      },
      { ...closed, default: {} },
    ),
  },
  { ...closed, default: {} },
);

export const ROUTER_POLICIES = [
  'slagate',
  'round_robin',
  'least_loaded',
  'prefix_only',
  'cache_aware',
  /** Benchmarks on the simulator only: asks each replica what it has cached. */
  'oracle',
] as const;

export const RouterSchema = Type.Object(
  {
    policy: Type.Enum([...ROUTER_POLICIES], { default: 'slagate' }),
    block_size_tokens: Type.Integer({ minimum: 1, maximum: 1024, default: 64 }),
    explore_ratio: Type.Number({ minimum: 0, maximum: 1, default: 0.01 }),
    session_header: Type.String({ pattern: HEADER_NAME, default: 'x-session-id' }),
  },
  { ...closed, default: {} },
);

export const OutlierSchema = Type.Object(
  {
    consecutive_failures: Type.Integer({ minimum: 1, default: 5 }),
    base_ejection_ms: ms(1, 30_000),
    max_ejection_ms: ms(1, 300_000),
    max_ejection_percent: Type.Number({ minimum: 0, maximum: 100, default: 50 }),
  },
  { ...closed, default: {} },
);

export const BreakerSchema = Type.Object(
  {
    error_threshold_percentage: Type.Number({ exclusiveMinimum: 0, maximum: 100, default: 50 }),
    volume_threshold: Type.Integer({ minimum: 1, default: 10 }),
    reset_timeout_ms: ms(1, 30_000),
    rolling_window_ms: ms(100, 10_000),
  },
  { ...closed, default: {} },
);

export const UpstreamSchema = Type.Object(
  {
    connect_timeout_ms: ms(1, 3_000),
    first_token_timeout_ms: ms(1, 60_000),
    /** The whole budget of a non-streamed request passed through unassembled (its body comes at the end). */
    passthrough_timeout_ms: ms(1, 600_000),
    /** An attempt's first-token timeout: this × its predicted time to first token, ≥ the class target. */
    first_token_timeout_factor: Type.Number({ minimum: 1, maximum: 100, default: 4 }),
    /** Send the class priority as vLLM's `priority` field (replicas run with --scheduling-policy priority). */
    forward_priority: Type.Boolean({ default: false }),
    idle_timeout_ms: ms(1, 30_000),
    retries: Type.Integer({ minimum: 0, maximum: 10, default: 2 }),
    retry_budget_ratio: Type.Number({ minimum: 0, maximum: 1, default: 0.2 }),
    health_interval_ms: ms(100, 2_000),
    /** A backend passed over this long, idle, is re-probed (src/upstream/reprobe.ts); 0: never. */
    reprobe_after_ms: ms(0, 10_000),
    metrics_scrape_interval_ms: ms(50, 500),
    max_connections_per_backend: Type.Integer({ minimum: 1, default: 512 }),
    outlier: OutlierSchema,
    breaker: BreakerSchema,
  },
  { ...closed, default: {} },
);

export const LoggingSchema = Type.Object(
  {
    level: Type.Enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'], { default: 'info' }),
    /** `stdout`, or a file path (relative paths resolve against the working directory). */
    admission_log: Type.String({ minLength: 1, default: 'stdout' }),
  },
  { ...closed, default: {} },
);

export const ConfigSchema = Type.Object(
  {
    server: ServerSchema,
    models: Type.Array(Type.String({ minLength: 1 }), { minItems: 1 }),
    backends: Type.Array(BackendSchema, { default: [] }),
    simulate: Type.Optional(SimulateSchema),
    state: StateSchema,
    sla: SlaSchema,
    tenants: Type.Array(TenantSchema, { default: [] }),
    scheduler: SchedulerSchema,
    router: RouterSchema,
    upstream: UpstreamSchema,
    logging: LoggingSchema,
  },
  closed,
);

/** Loaded values are deep-frozen; the types say so, so a mutation fails at compile time too. */
export type DeepReadonly<T> = T extends (infer U)[]
  ? readonly DeepReadonly<U>[]
  : T extends object
    ? { readonly [K in keyof T]: DeepReadonly<T[K]> }
    : T;

export type Config = DeepReadonly<Static<typeof ConfigSchema>>;
export type BackendSpec = DeepReadonly<Static<typeof BackendSchema>>;
export type StateConfig = Config['state'];
export type RedisStateConfig = DeepReadonly<Static<typeof RedisStateSchema>>;
export type SlaClass = DeepReadonly<Static<typeof SlaClassSchema>>;
export type SchedulerConfig = Config['scheduler'];
export type RouterConfig = Config['router'];
export type RouterPolicy = RouterConfig['policy'];
export type UpstreamConfig = Config['upstream'];
export type LoggingConfig = Config['logging'];
