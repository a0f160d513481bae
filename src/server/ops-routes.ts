// The gateway's own routes: liveness, readiness, Prometheus metrics and a JSON view of its state.
// None of them is proxied and none writes an admission record.

import type { FastifyInstance } from 'fastify';
import type { Runtime } from './runtime.ts';

/** Copies the live per-backend numbers into the gauges; run at scrape time, so no timer is needed. */
function refreshBackendGauges(rt: Runtime): void {
  for (const b of rt.backends.list()) {
    rt.metrics.setBackendGauges(b.name, { inflight: b.inflight, healthy: b.available });
  }
}

export function registerOpsRoutes(app: FastifyInstance, rt: Runtime): void {
  app.get('/healthz', async () => ({ status: 'alive' }));

  app.get('/readyz', async (_request, reply) => {
    if (rt.lifecycle.shuttingDown) return reply.code(503).send({ status: 'shutting_down' });
    const healthy = rt.backends.available().length;
    if (healthy === 0) return reply.code(503).send({ status: 'not_ready', healthy_backends: 0 });
    return { status: 'ready', healthy_backends: healthy };
  });

  app.get('/metrics', async (_request, reply) => {
    refreshBackendGauges(rt);
    return reply.header('content-type', rt.metrics.contentType).send(await rt.metrics.render());
  });

  app.get('/admin/state', async () => ({
    shutting_down: rt.lifecycle.shuttingDown,
    in_flight: rt.lifecycle.active,
    router: { policy: rt.policy.name },
    state: { store: rt.config.state.store },
    models: rt.models.list().data.map((m) => ({ id: m.id, max_model_len: m.max_model_len })),
    sla: rt.config.sla,
    backends: rt.backends.list().map((b) => ({
      name: b.name,
      url: b.url,
      weight: b.weight,
      state: b.state,
      available: b.available,
      inflight: b.inflight,
    })),
  }));
}
