// The gateway's own routes after real traffic: /healthz, /readyz, /metrics (names and labels of
// DESIGN section 6), /admin/state. None of them is proxied or writes an admission record.
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listenLoopback } from '../helpers/http.ts';
import {
  chat,
  get,
  METHOD_NAMED_CLASSES,
  post,
  startTestGateway,
  type TestGateway,
  waitFor,
} from './harness.ts';

let t: TestGateway;
beforeAll(async () => {
  t = await startTestGateway({ replicas: 2 });
  for (let i = 0; i < 4; i++)
    expect((await post(t.url, '/v1/chat/completions', chat({ stream: true }))).status).toBe(200);
  expect((await post(t.url, '/v1/chat/completions', chat({ model: 'nope' }))).status).toBe(404);
});
afterAll(async () => {
  await t.close();
});

/** The value of one sample line, e.g. `slagate_requests_total{class="interactive",...}`. */
function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const body = line.slice(name.length + 1, line.indexOf('}'));
    const got = Object.fromEntries([...body.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    if (Object.entries(labels).every(([k, v]) => got[k] === v))
      return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

describe('ops routes', () => {
  it('/healthz is alive and /readyz ready with the healthy backend count', async () => {
    const h = await get(t.url, '/healthz');
    expect(h.status).toBe(200);
    expect(JSON.parse(h.text)).toEqual({ status: 'alive' });
    const r = await get(t.url, '/readyz');
    expect(r.status).toBe(200);
    expect(JSON.parse(r.text)).toEqual({ status: 'ready', healthy_backends: 2, store: 'memory' });
  });

  it('/metrics exposes slagate_ series with class, backend, outcome and reason labels', async () => {
    const res = await get(t.url, '/metrics');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toMatch(/^text\/plain/);
    const m = res.text;
    const ok = (backend: string) =>
      sample(m, 'slagate_requests_total', { class: 'interactive', backend, outcome: 'ok' }) ?? 0;
    expect(ok('r0') + ok('r1')).toBe(4);
    expect(ok('r0')).toBeGreaterThan(0);
    expect(ok('r1')).toBeGreaterThan(0);
    expect(
      sample(m, 'slagate_admission_total', {
        class: 'interactive',
        decision: 'refused',
        reason: 'model_not_found',
      }),
    ).toBe(1);
    expect(
      sample(m, 'slagate_admission_total', { class: 'interactive', decision: 'admitted', reason: 'ok' }),
    ).toBe(4);
    for (const h of ['ttft_seconds', 'e2e_seconds', 'itl_seconds', 'tpot_seconds']) {
      const count = (b: string) => sample(m, `slagate_${h}_count`, { class: 'interactive', backend: b }) ?? 0;
      expect(count('r0') + count('r1'), h).toBeGreaterThan(0);
    }
    // A bucket at the class's TTFT target (interactive: 500 ms).
    expect(m).toMatch(/slagate_ttft_seconds_bucket\{[^}]*le="0\.5"/);
    expect(sample(m, 'slagate_backend_healthy', { backend: 'r0' })).toBe(1);
    expect(sample(m, 'slagate_backend_inflight', { backend: 'r1' })).toBe(0);
    expect(m).toMatch(/^slagate_overhead_seconds_count \d+/m);
    expect(m).toContain('slagate_sla_met_total');
  });

  it('/admin/state describes backends, router, models, limits', async () => {
    const res = await get(t.url, '/admin/state');
    expect(res.status).toBe(200);
    const s = JSON.parse(res.text) as Record<string, unknown>;
    expect(s).toMatchObject({
      shutting_down: false,
      in_flight: 0,
      router: { policy: 'round_robin' },
      store: { store: 'memory', degraded: false },
      models: [{ id: 'meta-llama/Llama-3.1-8B-Instruct', max_model_len: 131072 }],
      sla: { default_class: 'interactive' },
    });
    // The event-loop delay taken out of every request's budget: null until its first half-second
    // window has closed, a number from then on.
    const loopDelay = async () =>
      (JSON.parse((await get(t.url, '/admin/state')).text) as { admission: { loop_delay_ms: unknown } })
        .admission.loop_delay_ms;
    await waitFor(async () => (await loopDelay()) !== null, 3000, 'the first window of the loop delay');
    const measured = await loopDelay();
    expect(typeof measured).toBe('number');
    expect(measured as number).toBeGreaterThanOrEqual(0);
    // Four first tokens are too few for a P99 of the predictions' ratios (it takes 50).
    expect(s.admission).toMatchObject({
      plan_multiplier: null,
      prefix_judged: expect.any(Number),
      prefix_gone: expect.any(Number),
    });
    const backends = s.backends as Record<string, unknown>[];
    expect(
      backends.map(({ name, url, weight, state, available, local_inflight }) => ({
        name,
        url,
        weight,
        state,
        available,
        local_inflight,
      })),
    ).toEqual([
      { name: 'r0', url: t.fleet!.urls[0], weight: 1, state: 'healthy', available: true, local_inflight: 0 },
      { name: 'r1', url: t.fleet!.urls[1], weight: 1, state: 'healthy', available: true, local_inflight: 0 },
    ]);
    // The live view: shared in-flight counts, the window's latency over the 4 streams, telemetry.
    for (const b of backends) {
      // Its own planning P99 takes 100 of its first tokens: until then the fleet's is used.
      expect(b).toHaveProperty('plan_multiplier', null);
      expect(b.inflight).toMatchObject({ requests: 0 });
      expect(b.telemetry).toMatchObject({ saturated: expect.any(Boolean) });
    }
    const served = backends.map((b) => (b.latency as { requests: number }).requests);
    expect(served[0]! + served[1]!).toBe(4);
    const ttft = backends.map((b) => (b.latency as { ttft: { p50: number | null } }).ttft.p50);
    expect(ttft.some((v) => typeof v === 'number' && v > 0)).toBe(true);
    // Nothing secret on it.
    expect(res.text).not.toMatch(/api_key/);
  });

  it('ops routes write no admission record', async () => {
    const n = (await t.records()).length;
    await get(t.url, '/healthz');
    await get(t.url, '/metrics');
    await get(t.url, '/admin/state');
    await get(t.url, '/v1/models');
    expect((await t.records()).length).toBe(n);
  });
});

describe('a backend whose /metrics stops answering', () => {
  it('loses its scraped gauges once the last scrape is stale, rather than keep its last values', async () => {
    let up = true;
    const server = http.createServer((req, res) => {
      if (req.url === '/metrics' && up) {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.end(
          'vllm:kv_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_waiting{model_name="m"} 3\n',
        );
        return;
      }
      res.writeHead(req.url === '/metrics' ? 500 : 200, { 'content-type': 'application/json' });
      res.end(req.url === '/v1/models' ? '{"object":"list","data":[]}' : '');
    });
    const b = await listenLoopback(server);
    const g = await startTestGateway({
      backends: [{ name: 'b', url: b.url }],
      config: { upstream: { metrics_scrape_interval_ms: 50 } },
    });
    try {
      const metrics = async () => (await get(g.url, '/metrics')).text;
      await waitFor(
        async () => sample(await metrics(), 'slagate_backend_kv_cache_usage', { backend: 'b' }) === 0.5,
      );
      expect(sample(await metrics(), 'slagate_backend_waiting', { backend: 'b' })).toBe(3);
      up = false;
      // Stale after three intervals without a good scrape: no figure, rather than a frozen one.
      await waitFor(
        async () => sample(await metrics(), 'slagate_backend_kv_cache_usage', { backend: 'b' }) === undefined,
        5_000,
        'the stale gauge to go',
      );
      expect(sample(await metrics(), 'slagate_backend_waiting', { backend: 'b' })).toBeUndefined();
      const state = JSON.parse((await get(g.url, '/admin/state')).text) as {
        backends: { name: string; telemetry: { saturated: boolean } | null }[];
      };
      expect(state.backends.find((x) => x.name === 'b')?.telemetry?.saturated).toBe(true);
    } finally {
      await g.close();
      await b.close();
    }
  });
});

describe('class names that are also names of an object’s own methods', () => {
  it('a class named toString or constructor is served, scraped and shown like any other', async () => {
    const g = await startTestGateway({ replicas: 1, config: METHOD_NAMED_CLASSES });
    try {
      const served = await post(g.url, '/v1/chat/completions', chat({ stream: true }));
      expect(served.status).toBe(200);
      const m = await get(g.url, '/metrics');
      expect(m.status).toBe(200);
      // Nothing waits in either class: each depth is 0, not a function of Object.prototype.
      expect(sample(m.text, 'slagate_queue_depth', { class: 'toString' })).toBe(0);
      expect(sample(m.text, 'slagate_queue_depth', { class: 'constructor' })).toBe(0);
      expect(sample(m.text, 'slagate_requests_total', { class: 'toString', outcome: 'ok' })).toBe(1);
      const s = await get(g.url, '/admin/state');
      expect(s.status).toBe(200);
    } finally {
      await g.close();
    }
  });
});

describe('/readyz and the breaker', () => {
  it('is not ready while the only backend is open, and ready again once it half-opens, its one trial out or not', async () => {
    const backend = http.createServer((_req, res) => res.writeHead(200).end());
    const b = await listenLoopback(backend);
    const g = await startTestGateway({
      backends: [{ name: 'only', url: b.url }],
      config: { upstream: { breaker: { reset_timeout_ms: 50 } } },
    });
    try {
      await waitFor(async () => (await get(g.url, '/readyz')).status === 200, 3000, 'ready');
      const only = g.gw.runtime.backends.get('only')!;
      only.breaker.open();
      expect((await get(g.url, '/readyz')).status).toBe(503);
      await waitFor(() => only.breaker.halfOpen, 3000, 'half-open');
      // The trial request is on its way: no other request may have the backend meanwhile, but
      // the gateway is about to serve again, not out of service.
      expect(only.takeTrial()).not.toBeNull();
      expect(only.available).toBe(false);
      const r = await get(g.url, '/readyz');
      expect(r.status).toBe(200);
      expect(JSON.parse(r.text)).toMatchObject({ status: 'ready', healthy_backends: 1 });
    } finally {
      await g.close();
      await b.close();
    }
  });
});
