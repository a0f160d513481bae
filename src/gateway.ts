// The composition root: config → telemetry → (simulated fleet, in its own process) → backends →
// live state → scheduler → admission → runtime → fastify → listen; reload on config change; drain
// on shutdown. Nothing else constructs these parts.

import { isDeepStrictEqual } from 'node:util';
import type { FastifyInstance } from 'fastify';
import type { Logger as PinoLogger } from 'pino';
import { AdmissionController } from './admission/index.ts';
import {
  type BackendSpec,
  type Config,
  type ConfigWatcher,
  changedPaths,
  envValue,
  formatIssue,
  isConfigError,
  loadConfigFile,
  renderPath,
  watchConfig,
} from './config/index.ts';
import { TokenEstimates } from './prompt/tenant-estimates.ts';
import { createRoutingPolicy } from './router/index.ts';
import { Scheduler, type SchedulerSettings } from './scheduler/index.ts';
import { Afterwork } from './server/afterwork.ts';
import { buildApp } from './server/app.ts';
import { ANONYMOUS, createAuthenticator } from './server/auth.ts';
import { ModelCatalog } from './server/model-catalog.ts';
import { Lifecycle, type Runtime } from './server/runtime.ts';
import { type FleetProcess, startFleetProcess } from './sim/fleet-process.ts';
import { createLiveState } from './state/index.ts';
import { AdmissionLog } from './telemetry/admission-log.ts';
import { createLogger, type Logger } from './telemetry/logger.ts';
import { LoopDelay } from './telemetry/loop-delay.ts';
import { createMetrics } from './telemetry/metrics.ts';
import {
  type Backend,
  type BackendConfig,
  type BackendEvent,
  BackendSet,
  type BackendSetOptions,
  DEFAULT_BACKEND_SET_OPTIONS,
  DEFAULT_RETRY_BUDGET,
  type ProxyConfig,
  Reprober,
  RetryBudget,
} from './upstream/index.ts';

export interface GatewayOptions {
  /** A config file; watched for changes (and SIGHUP) unless `watch` is false. */
  configPath?: string;
  /** A loaded config, used instead of reading `configPath` at start. */
  config?: Config;
  /** Overrides of server.host / server.port (CLI flags). */
  host?: string;
  port?: number;
  watch?: boolean;
}

export interface Gateway {
  /** http://host:port the gateway listens on. */
  url: string;
  runtime: Runtime;
  /** The simulated fleet (a child process), when the config asked for one. */
  fleet: FleetProcess | null;
  /** Applies a new configuration as a reload would (tests, SIGHUP path). */
  reload(next: Config): Promise<void>;
  /** Writes out buffered log lines. */
  flushLogs(): Promise<void>;
  /**
   * Graceful: refuse new requests, drain up to server.shutdown_grace_ms, cut the rest, flush the
   * logs (logsFlushed: false when a reader stopped taking them).
   */
  close(): Promise<{ cut: number; logsFlushed: boolean }>;
  /** After a close whose logs were not all written, for a process about to exit: see Logger.abandon. */
  abandonLogs(): void;
  /**
   * The admission log's file opened again at its path (after a rotation renamed it): resolves with
   * the path, or null when the admission log is not a file (see Logger.reopen).
   */
  reopenLogs(): Promise<string | null>;
}

function proxyConfig(c: Config): ProxyConfig {
  return {
    firstTokenTimeoutMs: c.upstream.first_token_timeout_ms,
    passthroughTimeoutMs: c.upstream.passthrough_timeout_ms,
    idleTimeoutMs: c.upstream.idle_timeout_ms,
    // A client that reads nothing for as long as the backend may stay silent is gone.
    clientStallTimeoutMs: c.upstream.idle_timeout_ms,
    retries: c.upstream.retries,
    // One event may be as large as a whole body passed through: vLLM puts a long prompt's logprobs
    // (echo with logprobs) or token ids (return_token_ids) in the first chunk, megabytes of it.
    maxEventBytes: 16 * 1024 * 1024,
    maxBodyBytes: 16 * 1024 * 1024,
  };
}

function backendSetOptions(c: Config, onEvent: (e: BackendEvent) => void): BackendSetOptions {
  const u = c.upstream;
  return {
    pool: {
      connections: u.max_connections_per_backend,
      connectTimeoutMs: u.connect_timeout_ms,
      keepAliveTimeoutMs: DEFAULT_BACKEND_SET_OPTIONS.pool.keepAliveTimeoutMs,
    },
    outlier: {
      consecutiveFailures: u.outlier.consecutive_failures,
      baseEjectionMs: u.outlier.base_ejection_ms,
      maxEjectionMs: u.outlier.max_ejection_ms,
      maxEjectionPercent: u.outlier.max_ejection_percent,
    },
    breaker: {
      errorThresholdPercentage: u.breaker.error_threshold_percentage,
      volumeThreshold: u.breaker.volume_threshold,
      resetTimeoutMs: u.breaker.reset_timeout_ms,
      rollingWindowMs: u.breaker.rolling_window_ms,
      rollingBuckets: DEFAULT_BACKEND_SET_OPTIONS.breaker.rollingBuckets,
    },
    health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: u.health_interval_ms },
    onEvent,
  };
}

function schedulerSettings(c: Config): SchedulerSettings {
  const s = c.scheduler;
  return {
    policy: s.policy,
    maxQueue: s.max_queue,
    agingMs: s.aging_ms,
    priorities: new Map(Object.entries(c.sla.classes).map(([name, k]) => [name, k.priority])),
    seeds: s.seeds,
    concurrency: {
      min: s.concurrency.min,
      max: s.concurrency.max,
      initial: s.concurrency.initial,
      prefillTokens: s.concurrency.prefill_tokens,
      intervalMs: s.concurrency.interval_ms,
      outerPeriods: s.concurrency.outer_periods,
      ttftShare: s.concurrency.ttft_share,
      tpotShare: s.concurrency.tpot_share,
    },
    firstTokenTimeoutFactor: c.upstream.first_token_timeout_factor,
    firstTokenTimeoutMaxMs: c.upstream.first_token_timeout_ms,
  };
}

/** The admission log's own file; a path that cannot be written fails the start, naming the key. */
function admissionFileLogger(c: Config): Logger {
  try {
    return createLogger({ level: c.logging.level, destination: c.logging.admission_log });
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new Error(`logging.admission_log: cannot write ${c.logging.admission_log} (${why})`);
  }
}

function backendConfigs(c: Config, fleet: FleetProcess | null): BackendConfig[] {
  if (fleet !== null && c.backends.length === 0) {
    return fleet.urls.map((url, i) => ({ name: `sim-${i}`, url, weight: 1 }));
  }
  // The key is read from its variable here, when the backends are built (checks.ts made sure it is set).
  return c.backends.map((b: BackendSpec) => ({
    name: b.name,
    url: b.url,
    weight: b.weight,
    apiKey: b.api_key_env === undefined ? null : (envValue(b.api_key_env) ?? null),
  }));
}

function classSet(c: Config): Set<string> {
  return new Set(Object.keys(c.sla.classes));
}

/** The tenants requests are counted under: those configured, or `anonymous` on an open gateway. */
function tenantSet(c: Config): Set<string> {
  const names = (c.tenants ?? []).map((t) => t.name);
  return new Set(names.length > 0 ? names : [ANONYMOUS]);
}

/**
 * Settings a reload cannot change in a running process; a change to one is logged, not applied.
 * `flags`: serve's --host and --port, which win over the file's server.host and server.port now and
 * at every start, so a change of the file's value there is no change a restart would apply.
 */
function restartOnlyChanges(prev: Config, next: Config, flags: { host?: string; port?: number }): string[] {
  // shutdown_grace_ms is read when the shutdown starts, so it is the one server key a reload changes.
  const restartOnly = (c: Config) => ({
    server: {
      host: flags.host ?? c.server.host,
      port: flags.port ?? c.server.port,
      body_limit_bytes: c.server.body_limit_bytes,
      keep_alive_timeout_ms: c.server.keep_alive_timeout_ms,
    },
    simulate: c.simulate,
    state: c.state,
    logging: c.logging,
    // Built into the backend set and the scraper when the gateway starts.
    upstream: {
      outlier: c.upstream.outlier,
      breaker: c.upstream.breaker,
      health_interval_ms: c.upstream.health_interval_ms,
      max_connections_per_backend: c.upstream.max_connections_per_backend,
      connect_timeout_ms: c.upstream.connect_timeout_ms,
      retry_budget_ratio: c.upstream.retry_budget_ratio,
      metrics_scrape_interval_ms: c.upstream.metrics_scrape_interval_ms,
    },
    scheduler: { concurrency: { interval_ms: c.scheduler.concurrency.interval_ms } },
  });
  return changedPaths(restartOnly(prev), restartOnly(next)).map(renderPath);
}

/** After the grace period, time for the last answers (e.g. 503s just written) to leave. */
const MIN_CLOSE_WAIT_MS = 100;

/**
 * Stops listening and waits for open connections to end, at most `waitMs`: after that, whatever
 * is still open (a client mid-upload, a request not yet routed) is cut, so no client can hold the
 * process past the grace period.
 */
async function closeServer(app: FastifyInstance, lifecycle: Lifecycle, waitMs: number): Promise<void> {
  const closed = app.close();
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((resolve) => {
    timer = setTimeout(() => resolve('late'), waitMs);
  });
  const won = await Promise.race([closed.then(() => 'closed' as const), late]);
  clearTimeout(timer);
  if (won === 'late') {
    lifecycle.connectionsCut = true;
    app.server.closeAllConnections();
  }
  await closed;
}

export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  let config: Config;
  if (opts.config !== undefined) config = opts.config;
  else if (opts.configPath !== undefined) config = loadConfigFile(opts.configPath);
  else throw new Error('startGateway needs a config or a configPath');
  // The router's ties follow the scheduler's measure of the predictor's error (it exists later).
  let schedulerRef: Scheduler | null = null;
  const policyFor = (c: Config) =>
    createRoutingPolicy(c.router.policy, {
      exploreRatio: c.router.explore_ratio,
      tolerance: () => schedulerRef?.predictionSpread() ?? null,
    });
  const initialPolicy = policyFor(config);

  const log: Logger = createLogger({ level: config.logging.level, destination: 'stdout' });
  let admissionLogger: Logger;
  try {
    admissionLogger = config.logging.admission_log === 'stdout' ? log : admissionFileLogger(config);
  } catch (err) {
    await log.close();
    throw err;
  }
  const logger: PinoLogger = log.logger;

  // Invariant: a start that fails stops everything it had started (LIFO), so a caller that
  // catches the error is left with no server, timer, watcher or fleet running.
  const undo: (() => unknown)[] = [];
  try {
    const fleet = config.simulate
      ? await startFleetProcess({
          replicas: config.simulate.replicas,
          profile: config.simulate.profile,
          model: config.simulate.model,
          timeScale: config.simulate.time_scale,
          seed: config.simulate.seed,
          admin: true,
          // Its replicas' probes will say they are down; this says why.
          onUnexpectedExit: (code, signal, stderr) =>
            logger.error({ code, signal, stderr }, 'the simulated fleet exited'),
        })
      : null;
    if (fleet !== null) undo.push(() => fleet.close());

    const metrics = createMetrics(config.sla.classes);
    const both = (count: (l: Logger) => number) => () =>
      count(log) + (admissionLogger === log ? 0 : count(admissionLogger));
    metrics.countLogs({ dropped: both((l) => l.dropped()), writeErrors: both((l) => l.writeErrors()) });
    // Set once the scheduler exists: a backend coming back may let queued requests go.
    let onAvailabilityChange = (): void => {};
    const onBackendEvent = (e: BackendEvent): void => {
      logger.info(
        {
          event: e.type,
          backend: e.backend,
          ...('durationMs' in e ? { ms: e.durationMs } : {}),
          ...('why' in e ? { why: e.why } : {}),
        },
        'backend',
      );
      // Invariant: the queue is pumped onto a new backend only once the live state knows it. A
      // backend is added in the middle of a reload's update, before live.setBackends: a pump then
      // granted on it leases the live state did not count, and one new backend took the whole
      // queue. The reload pumps itself once both know the new list.
      if (e.type === 'added' || e.type === 'removed' || e.type === 'drained') return;
      if (e.type === 'ejected') metrics.backendEvent('ejection', e.backend);
      else if (e.type === 'engine_restarted') metrics.backendEvent('engine_restart', e.backend);
      // A backend that was not up when the catalog asked it is asked now: until it lists its
      // models it is sent every configured one (Backend.serves). A restarted one may serve others.
      if (e.type === 'probe_up' || e.type === 'probe_confirmed' || e.type === 'engine_restarted')
        refreshModels();
      onAvailabilityChange();
    };
    // Set once the first catalog exists (the start refreshes itself); then the catalog in force.
    let refreshModels = (): void => {};
    const backends = new BackendSet(backendSetOptions(config, onBackendEvent), backendConfigs(config, fleet));
    undo.push(() => backends.close());
    metrics.setBackends(backends.list().map((b) => b.name));
    // Each backend learns what its /v1/models lists (Backend.learned).
    const catalogTargets = () => backends.list();
    const scrapeTargets = () => backends.list().map((b) => ({ name: b.name, url: b.url }));
    // The live state and the scheduler read the swappable parts through rt (once it exists), so a
    // reload reaches them.
    let rtRef: Runtime | null = null;
    // Learnt from what the backends count, per tenant over the fleet's; a block a peer told of
    // weighs the fleet's in the prefix index.
    const tokens = new TokenEstimates();
    tokens.retain(tenantSet(config));
    // Live state: local first; with `state.store: redis`, shared in the background. ready() is
    // bounded by the connect timeout and resolves degraded when Redis is down (never throws).
    const live = createLiveState(config.state, {
      backends: scrapeTargets(),
      scrape: { intervalMs: config.upstream.metrics_scrape_interval_ms },
      // Told to the backends, whose event (logged, and asking the models again) it becomes.
      onBackendRestart: (name) => backends.engineRestarted(name),
      logger,
      indexBlockTokens: () =>
        tokens.fleet.textBlockTokens((rtRef?.config ?? config).router.block_size_tokens),
      blockSizeTokens: () => (rtRef?.config ?? config).router.block_size_tokens,
    });
    undo.push(() => live.close());
    live.retainClasses(classSet(config));
    await live.ready();
    const initialModels = new ModelCatalog(config.models);
    // A backend that comes up during a refresh asks for one more after it. The catalog in force
    // (a reload may swap it), the first until the runtime exists.
    refreshModels = () =>
      void (rtRef?.models ?? initialModels).refresh(catalogTargets(), undefined, { again: catalogTargets });
    await initialModels.refresh(catalogTargets());

    const lifecycle = new Lifecycle();
    let settingsOf = { config, settings: schedulerSettings(config) };
    const scheduler = new Scheduler({
      backends: () => backends.list(),
      live,
      router: () => rtRef?.policy ?? initialPolicy,
      settings: () => {
        // Built once per config (a reload swaps the frozen config object), not on every read.
        const c = rtRef?.config ?? config;
        if (settingsOf.config !== c) settingsOf = { config: c, settings: schedulerSettings(c) };
        return settingsOf.settings;
      },
      onRefused: (req, err) => admission.noteRefused(req, err.code),
    });
    undo.push(() => scheduler.close());
    schedulerRef = scheduler;
    // Time requests wait for this process's busy loop before it sees them: out of their budgets.
    const loopDelay = new LoopDelay();
    undo.push(() => loopDelay.close());
    const admission = new AdmissionController({
      backends: () => backends.list(),
      live,
      scheduler,
      loopDelayMs: () => loopDelay.ms(),
    });
    onAvailabilityChange = () => scheduler.pump();

    const rt: Runtime = {
      config,
      auth: createAuthenticator(config.tenants, config.sla.default_class, classSet(config)),
      policy: initialPolicy,
      models: initialModels,
      backends,
      live,
      admission,
      scheduler,
      retryBudget: new RetryBudget(
        { ratio: config.upstream.retry_budget_ratio, minRetries: DEFAULT_RETRY_BUDGET.minRetries },
        () => lifecycle.active,
      ),
      proxy: proxyConfig(config),
      admissionLog: new AdmissionLog(admissionLogger.logger),
      metrics,
      logger,
      tokens,
      lifecycle,
      afterwork: new Afterwork((err) => logger.error({ err }, 'bookkeeping after a response failed')),
      drainCountedAs: new WeakMap(),
    };
    rtRef = rt;

    // Backends that joined later (reload) or were down at start report their context length later.
    const modelRefresh = setInterval(() => void rt.models.refresh(catalogTargets()), 30_000);
    modelRefresh.unref();
    undo.push(() => clearInterval(modelRefresh));
    // A backend the fleet passes over is timed now and then, so its fit can show it recovered.
    const reprober = new Reprober({
      backends: () => backends.list(),
      live,
      target: (b) => {
        const model = rt.config.models.find((m) => b.serves(m));
        return model === undefined ? null : { model, maxModelLen: rt.models.maxModelLen(model) };
      },
      afterMs: () => rt.config.upstream.reprobe_after_ms,
      timeoutMs: () => rt.config.upstream.first_token_timeout_ms,
      onProbe: (r) => {
        metrics.backendEvent('reprobe', r.backend);
        logger.info(
          {
            event: 'reprobe',
            backend: r.backend,
            prompt_tokens: r.promptTokens,
            ttft_ms: Math.round(r.ttftMs * 10) / 10,
            predicted_ms: Math.round(r.predictedMs * 10) / 10,
            more: r.more,
          },
          'backend',
        );
      },
    });
    undo.push(() => reprober.stop());

    async function reload(next: Config): Promise<void> {
      // Invariant: a reload never turns API keys off; that takes a restart. A file written in place
      // by a writer that pauses (a template rendered into it, scp, rsync --inplace) is read as it
      // stands after the debounce; cut before its `tenants`, it is valid YAML with none, and
      // applied it would open the gateway to every caller, with any class, until the rest arrived
      // (or for good, if the writer died: a later SIGHUP, such as log rotation's, re-reads the
      // same cut file, so no signal can tell an operator's intent from it).
      if (rt.config.tenants.length > 0 && next.tenants.length === 0) {
        throw new Error(
          'tenants: the file lists no tenants, which would turn API keys off; a reload does not do that (the file may be half-written): restart the gateway to run without tenants; reload refused',
        );
      }
      // `simulate` applies only at start: a file that moves to it from real backends would, applied,
      // leave no backend at all. Refused before anything changes (the watcher keeps the running one).
      if (fleet === null && next.backends.length === 0) {
        throw new Error(
          'backends: the file names no backends, and simulate applies only after a restart; reload refused',
        );
      }
      // The simulated fleet keeps the model it started with (simulate applies only at start): a file
      // whose models no longer list it, applied, would leave every backend serving a model no
      // request may name (404), and every model a request may name served by none (503).
      const fleetModel = config.simulate?.model;
      if (
        fleet !== null &&
        next.backends.length === 0 &&
        fleetModel !== undefined &&
        !next.models.includes(fleetModel)
      ) {
        throw new Error(
          `models: the simulated fleet serves ${JSON.stringify(fleetModel)} (simulate applies only after a restart), which the file's models do not list; reload refused`,
        );
      }
      // The pools keep the size they started with (a restart-only setting): a concurrency cap above
      // it would queue requests inside the HTTP client, out of the scheduler's sight.
      const pool = config.upstream.max_connections_per_backend;
      if (next.scheduler.concurrency.max > pool) {
        throw new Error(
          `scheduler.concurrency.max: ${next.scheduler.concurrency.max} is over the ${pool} connections per backend the running pools have (upstream.max_connections_per_backend applies only after a restart); reload refused`,
        );
      }
      const prev = rt.config;
      // A policy keeps its memory (round robin's position, sessions) unless its settings change.
      const same =
        next.router.policy === prev.router.policy && next.router.explore_ratio === prev.router.explore_ratio;
      const policy = same ? rt.policy : policyFor(next);
      // Restart-only settings are compared with the ones the process started with (still in
      // force), not with the last reload's: changing the port and changing it back is no change.
      const frozen = restartOnlyChanges(config, next, opts);
      if (frozen.length > 0)
        logger.warn({ keys: frozen }, 'config reload: these settings apply only after a restart');
      rt.policy = policy;
      rt.auth = createAuthenticator(next.tenants, next.sla.default_class, classSet(next));
      rt.tokens.retain(tenantSet(next));
      rt.proxy = proxyConfig(next);
      rt.config = next;
      metrics.setClasses(next.sla.classes);
      live.retainClasses(classSet(next));
      const before = backends.list().map((b) => b.name);
      const serving = new Map(backends.list().map((b) => [b.name, b]));
      const drained = backends.update(backendConfigs(next, fleet));
      // A backend at a new URL under a name it had starts from the models the old server listed
      // (most likely the same; a wrong guess is vLLM's 404, settled elsewhere). In a fleet of
      // several models, one under a new name is granted nothing until the refresh below has its
      // answer or has given up (Backend.holdModels); its models' requests wait for it meanwhile
      // (Backend.mayServe). With one model configured every backend serves it from the start.
      const fresh: Backend[] = [];
      for (const b of backends.list()) {
        const was = serving.get(b.name);
        if (was === b) continue;
        if (was !== undefined) b.models = was.models;
        else if (next.models.length > 1) fresh.push(b);
      }
      for (const b of fresh) b.holdModels();
      const kept = new Set(backends.list().map((b) => b.name));
      metrics.setBackends(kept);
      const removed = before
        .filter((name) => !kept.has(name))
        .map((name) => ({ name, token: metrics.backendRemoved(name) }));
      // What counted each backend just taken out, before the live state moves on: /admin/state
      // lists a draining backend only while nothing in service counts its attempts.
      for (const b of backends.retiring())
        if (!rt.drainCountedAs.has(b)) rt.drainCountedAs.set(b, live.countedAs(b.name, b.url));
      live.setBackends(scrapeTargets());
      // Against the list in force, not the last reload's: that one may still be waiting for its
      // catalog, and would throw it away once it saw this newer reload. A new backend learns its
      // models here (it is told on, and the queue pumped, as it does: the 'models' event).
      try {
        if (isDeepStrictEqual(rt.models.names(), next.models)) {
          await rt.models.refresh(catalogTargets());
        } else {
          // A new served list gets a new catalog, swapped in once it knows the context lengths.
          const models = new ModelCatalog(next.models);
          await models.refresh(catalogTargets());
          // A newer reload may have swapped in its own list meanwhile: this one's is stale then.
          if (rt.config === next) rt.models = models;
        }
      } finally {
        for (const b of fresh) b.releaseModels();
      }
      // New backends or larger queues may let waiting requests go now; after the refresh, so that
      // a new backend is offered only the models it lists.
      scheduler.pump();
      logger.info({ backends: backends.list().map((b) => b.name), router: policy.name }, 'config reloaded');
      await drained;
      // Only now: a request still draining on a removed backend would recreate its series, and so
      // would the bookkeeping it left queued (settled here first).
      rt.afterwork.settle();
      for (const { name, token } of removed) metrics.backendDrained(name, token);
    }

    const app = buildApp(rt);
    undo.push(() => app.close());
    const address = await app.listen({
      host: opts.host ?? config.server.host,
      port: opts.port ?? config.server.port,
    });

    let watcher: ConfigWatcher | null = null;
    if (opts.configPath !== undefined && opts.watch !== false) {
      watcher = watchConfig(
        opts.configPath,
        {
          // A reload that fails rejects: the watcher then keeps
          // the running configuration as its current one, and onError logs why.
          onChange: (next) => reload(next),
          onUnchanged: () =>
            logger.info({ path: opts.configPath }, 'config reload: file read, nothing changed'),
          onError: (err) => {
            const issues = isConfigError(err)
              ? err.issues.map((i) => formatIssue(i, err.source))
              : [String(err)];
            logger.error({ issues }, 'config reload refused; the running configuration is kept');
          },
          onWatchLost: (err) =>
            logger.warn(
              { path: opts.configPath, err: String(err) },
              'config file not watched: edits are not seen; SIGHUP reloads it',
            ),
        },
        { initial: config },
      );
    }

    let closing: Promise<{ cut: number; logsFlushed: boolean }> | null = null;
    const flushLogs = async (): Promise<void> => {
      rt.afterwork.settle();
      await log.flush();
      if (admissionLogger !== log) await admissionLogger.flush();
    };

    return {
      url: address,
      runtime: rt,
      fleet,
      reload,
      flushLogs,
      abandonLogs() {
        log.abandon();
        admissionLogger.abandon();
      },
      reopenLogs: () => admissionLogger.reopen(),
      close() {
        closing ??= (async () => {
          rt.lifecycle.shuttingDown = true;
          watcher?.close();
          clearInterval(modelRefresh);
          reprober.stop();
          const graceMs = rt.config.server.shutdown_grace_ms;
          const deadline = performance.now() + graceMs;
          const { cut } = await rt.lifecycle.drain(graceMs);
          if (cut > 0) logger.warn({ cut }, 'shutdown: grace period over, in-flight requests cut');
          await closeServer(app, rt.lifecycle, Math.max(deadline - performance.now(), MIN_CLOSE_WAIT_MS));
          await backends.close();
          scheduler.close();
          loopDelay.close();
          await live.close();
          await fleet?.close();
          // Nothing can log any more: flush, then release the file (never stdout itself). The two
          // closes run together, each bounded: a reader that stopped reading loses its last lines.
          rt.afterwork.settle();
          const [opsFlushed, admissionFlushed] = await Promise.all([
            log.close(),
            admissionLogger === log ? true : admissionLogger.close(),
          ]);
          return { cut, logsFlushed: opsFlushed && admissionFlushed };
        })();
        return closing;
      },
    };
  } catch (err) {
    for (const stop of undo.reverse()) await stop();
    // The loggers last: what the start logged is written, and the admission log's file closed.
    await Promise.all([log.close(), admissionLogger === log ? true : admissionLogger.close()]);
    throw err;
  }
}
