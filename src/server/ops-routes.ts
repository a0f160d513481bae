// The gateway's own routes: liveness, readiness, Prometheus metrics, a JSON view of its state and
// the live page over it (dashboard.ts). None of them is proxied and none writes an admission record.

import type { FastifyInstance } from 'fastify';
import { currentTelemetry } from '../state/index.ts';
import type { Backend } from '../upstream/index.ts';
import { registerDashboard } from './dashboard.ts';
import type { Runtime } from './runtime.ts';

/**
 * Copies the live per-backend numbers into the gauges; run at scrape time, so no timer is needed.
 * `backend_inflight` is this instance's own count (summing the series over instances gives the
 * fleet's); the shared view is in /admin/state.
 */
function refreshGauges(rt: Runtime): void {
  for (const b of rt.backends.list()) {
    // A stale scrape is no current figure: the gauge goes until the backend answers again.
    const fresh = currentTelemetry(rt.live.telemetry(b.name));
    const view = rt.live.backendView(b.name);
    rt.metrics.setBackendGauges(b.name, {
      inflight: view?.localInflight.requests ?? 0,
      concurrency_limit: Math.floor(rt.scheduler.limit(b.name)),
      // As documented: healthy and its breaker closed (a half-open one, its trial unused, is available).
      healthy: b.state === 'healthy',
      kv_cache_usage: fresh?.kvCacheUsage ?? null,
      waiting: fresh?.waiting ?? null,
      prefill_tokens_per_second: view?.rates.prefillTokensPerS ?? null,
    });
  }
  rt.metrics.setQueueDepths(rt.scheduler.view().byClass);
  rt.metrics.setStoreDegraded(rt.live.status().degraded);
}

/** What /admin/state says of any backend, in service or draining: its name, state and ejection. */
function backendHead(b: Backend) {
  return {
    name: b.name,
    url: b.url,
    weight: b.weight,
    state: b.state,
    // Ejected by outlier detection, whatever `state` shows first (a failing probe says 'down').
    ejected: b.outlier.ejected(),
    // Times ejected as outlier detection counts them (one less per base ejection time served; the
    // next ejection lasts base × (this + 1) unless it decays first), and what is left of the
    // current one (null: not ejected).
    ejections: b.outlier.ejections,
    ejected_for_ms: b.outlier.ejected() ? Math.ceil(b.outlier.remainingMs()) : null,
    available: b.available,
    // What its /v1/models last listed (null: not heard yet, so sent every configured model).
    models: b.models === null ? null : [...b.models],
  };
}

/**
 * Backends still draining whose attempts no backend in service counts: not one whose live entry at
 * its name and URL is still what counted its requests when it was taken out (a reload added it back
 * at that URL and the entry took their counts: Runtime.drainCountedAs). One moved to another URL
 * and back started afresh, and its old self is listed.
 */
function retiringOnly(rt: Runtime): Backend[] {
  return rt.backends.retiring().filter((b) => {
    const was = rt.drainCountedAs.get(b);
    return was === undefined || was === null || rt.live.countedAs(b.name, b.url) !== was;
  });
}

/**
 * What the prefix index holds for `name`: its blocks, the tokens they stand for (each at the
 * estimate it was sent with) and the backend's KV cache it is bounded by, in tokens.
 */
function prefixIndex(rt: Runtime, name: string) {
  const size = rt.live.prefixSize(name);
  return {
    blocks: size.blocks,
    tokens: Math.round(size.tokens),
    capacity_tokens: size.capacity,
    capacity_assumed: rt.live.prefixCapacityAssumed(name),
  };
}

export function registerOpsRoutes(app: FastifyInstance, rt: Runtime): void {
  registerDashboard(app);
  app.get('/healthz', async () => ({ status: 'alive' }));

  app.get('/readyz', async (_request, reply) => {
    if (rt.lifecycle.shuttingDown) return reply.code(503).send({ status: 'shutting_down' });
    // Healthy: in service (up by its probe, not ejected) with a closed or half-open breaker, and its
    // probe has passed at least once (a backend is routable while its first probe is pending, but
    // a gateway whose replicas never answered is not ready). Not `available`: a half-open breaker's
    // one trial makes its backend unavailable to the next request for as long as that request
    // runs, and readiness would flip to 503 at the moment of recovery.
    const healthy = rt.backends
      .list()
      .filter((b) => b.inService && b.healthConfirmed && !b.breaker.opened).length;
    if (healthy === 0) return reply.code(503).send({ status: 'not_ready', healthy_backends: 0 });
    // A store outage degrades sharing, not service: still ready (200), but it says so.
    const store = rt.live.status();
    return { status: store.degraded ? 'degraded' : 'ready', healthy_backends: healthy, store: store.store };
  });

  app.get('/metrics', async (_request, reply) => {
    rt.afterwork.settle();
    refreshGauges(rt);
    return reply.header('content-type', rt.metrics.contentType).send(await rt.metrics.render());
  });

  app.get('/admin/state', async () => {
    rt.afterwork.settle();
    const live = rt.live.view();
    const liveByName = new Map(live.backends.map((b) => [b.name, b]));
    const schedule = rt.scheduler.view();
    const limits = new Map(schedule.backends.map((b) => [b.name, b]));
    const planning = rt.scheduler.planning();
    const requests = await rt.metrics.decisionCounts();
    return {
      instance: live.instanceId,
      // When the counts above were read, on this process's monotonic clock: two polls' counts make
      // a rate over the time between their readings, not between their arrivals at a client.
      uptime_ms: Math.round(performance.now() * 1000) / 1000,
      shutting_down: rt.lifecycle.shuttingDown,
      in_flight: rt.lifecycle.active,
      router: {
        policy: rt.policy.name,
        chars_per_token: rt.tokens.fleet.charsPerToken,
        chars_per_token_samples: rt.tokens.fleet.samples,
        media_part_tokens: rt.tokens.fleet.mediaTokens,
        media_part_tokens_samples: rt.tokens.fleet.mediaSamples,
        output_tokens_per_sequence: rt.tokens.fleet.outputTokens,
        output_tokens_per_sequence_samples: rt.tokens.fleet.outputSamples,
        tie_tolerance: rt.scheduler.predictionSpread(),
      },
      scheduler: {
        policy: schedule.policy,
        queued: schedule.queued,
        retries: schedule.retries,
        queue_by_class: schedule.byClass,
        releases_per_s: schedule.releasesPerS,
      },
      admission: {
        prediction_error: rt.admission.predictionError(),
        plan_multiplier: planning.multiplier,
        prefix_judged: planning.prefixJudged,
        prefix_gone: planning.prefixGone,
        loop_delay_ms: rt.admission.loopDelayMs(),
        requests,
        prefix_hit_ratio: rt.metrics.prefixHit(),
      },
      store: live.store,
      window_ms: live.windowMs,
      models: rt.models.list().data.map((m) => ({ id: m.id, max_model_len: m.max_model_len })),
      sla: rt.config.sla,
      backends: [
        ...rt.backends.list().map((b) => {
          const v = liveByName.get(b.name);
          return {
            ...backendHead(b),
            // This instance's attempts in flight, and the shared counts over every instance.
            local_inflight: v?.localInflight.requests ?? 0,
            inflight: v?.inflight ?? null,
            // What a request sent there now would wait for: the prefill the backend has not yet
            // worked off (docs/state.md, "Prefill still ahead").
            prefill_ahead_tokens: rt.live.prefillAheadTokens(b.name),
            concurrency_limit: limits.get(b.name)?.limit ?? null,
            control_error: limits.get(b.name)?.error ?? null,
            tpot_share: limits.get(b.name)?.tpotShare ?? null,
            // Its own P99 of actual ÷ predicted first tokens (null: too few yet, planned on the fleet's).
            plan_multiplier: limits.get(b.name)?.planMultiplier ?? null,
            prefix_index: prefixIndex(rt, b.name),
            latency: v?.latency ?? null,
            by_class: v?.byClass ?? null,
            rates: v?.rates ?? null,
            telemetry: v?.telemetry ?? null,
          };
        }),
        // Backends a reload removed that still drain, after those in service: where an operator
        // taking a replica out watches its last streams end. Only what is known of them: the live
        // state, the scheduler and the index forgot them at the reload (their name may already be a
        // new server's), so every figure of theirs but this instance's attempts is null. Not one
        // added back since at the same URL: that entry in service is the same server, and its
        // counts took these attempts in (live-state.ts), so listing both would count them twice.
        ...retiringOnly(rt).map((b) => ({
          ...backendHead(b),
          local_inflight: b.running,
          inflight: null,
          prefill_ahead_tokens: null,
          concurrency_limit: null,
          control_error: null,
          tpot_share: null,
          plan_multiplier: null,
          prefix_index: null,
          latency: null,
          by_class: null,
          rates: null,
          telemetry: null,
        })),
      ],
    };
  });
}
