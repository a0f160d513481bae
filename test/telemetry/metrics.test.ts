import { Histogram } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { AdmissionRecord } from '../../src/telemetry/admission-log.ts';
import {
  bucketsWithTargets,
  createMetrics,
  E2E_BUCKETS_S,
  OVERHEAD_BUCKETS_S,
  QUEUE_WAIT_BUCKETS_S,
  TPOT_BUCKETS_S,
  TTFT_BUCKETS_S,
} from '../../src/telemetry/metrics.ts';

// The classes of DESIGN section 3.
const CLASSES = {
  interactive: { ttft_p99_ms: 500, tpot_p99_ms: 50 },
  completion: { ttft_p99_ms: 200, tpot_p99_ms: 30 },
  batch: { ttft_p99_ms: 30000, tpot_p99_ms: 200 },
};

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

function parseSamples(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`unparsable exposition line: ${line}`);
    const labels: Record<string, string> = {};
    for (const kv of (m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)) labels[kv[1]!] = kv[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

function value(samples: Sample[], name: string, labels: Record<string, string>): number | undefined {
  const hit = samples.find(
    (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
  );
  return hit?.value;
}

function record(over: Partial<AdmissionRecord>): AdmissionRecord {
  return {
    req_id: 'r',
    tenant: 'team-a',
    class: 'interactive',
    model: 'm',
    stream: true,
    prompt_tokens_est: 100,
    prompt_tokens: 100,
    completion_tokens: 10,
    max_tokens: 10,
    prefix_blocks: 6,
    prefix_hit_est: 0.5,
    decision: 'admitted',
    reason: 'ok',
    outcome: 'ok',
    backend: 'gpu-0',
    attempts: 1,
    predicted_ttft_ms: 90,
    runner_up: null,
    runner_up_predicted_ttft_ms: null,
    failed_attempts: [],
    queue_ms: 20,
    ttft_ms: 100,
    tpot_ms: 20,
    e2e_ms: 280,
    ttft_target_ms: 500,
    tpot_target_ms: 50,
    sla_met: true,
    error: null,
    ...over,
  };
}

const bucketsOf = (samples: Sample[], name: string, labels: Record<string, string>) =>
  samples
    .filter((s) => s.name === `${name}_bucket` && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .map((s) => s.labels.le);

describe('bucketsWithTargets', () => {
  it('adds targets in seconds to the base list, sorted and without duplicates', () => {
    expect(bucketsWithTargets([0.1, 0.5, 1], [200, 500, 100, 30000])).toEqual([0.1, 0.2, 0.5, 1, 30]);
    expect(bucketsWithTargets([0.05], [30, 50, 200])).toEqual([0.03, 0.05, 0.2]);
  });
});

describe('GatewayMetrics', () => {
  it('classes set on reload: a new one starts at zero, a removed one keeps its queue depth until none of its requests waits', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.setQueueDepths({ batch: 3 });
    m.setClasses({
      interactive: CLASSES.interactive,
      completion: CLASSES.completion,
      bulk: { ttft_p99_ms: 30_000, tpot_p99_ms: 200 },
    });
    let s = parseSamples(await m.render());
    expect(value(s, 'slagate_sla_met_total', { class: 'bulk' })).toBe(0);
    expect(value(s, 'slagate_sla_judged_total', { class: 'bulk' })).toBe(0);
    expect(value(s, 'slagate_queue_depth', { class: 'bulk' })).toBe(0);
    expect(value(s, 'slagate_queue_depth', { class: 'interactive' })).toBe(0);
    // batch is gone from the config, but two of its requests still wait: they are shown.
    m.setQueueDepths({ batch: 2, interactive: 1 });
    s = parseSamples(await m.render());
    expect(value(s, 'slagate_queue_depth', { class: 'batch' })).toBe(2);
    expect(value(s, 'slagate_queue_depth', { class: 'interactive' })).toBe(1);
    // None of them waits any more: its series goes; a configured class's stays at 0.
    m.setQueueDepths({});
    s = parseSamples(await m.render());
    expect(s.some((x) => x.name === 'slagate_queue_depth' && x.labels.class === 'batch')).toBe(false);
    expect(value(s, 'slagate_queue_depth', { class: 'interactive' })).toBe(0);
  });

  it('exposes every DESIGN metric with its labels', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.observeRequest(record({}), [15, 25]);
    m.setBackendGauges('gpu-0', {
      inflight: 3,
      concurrency_limit: 8,
      healthy: true,
      kv_cache_usage: 0.4,
      waiting: 2,
      prefill_tokens_per_second: 20000,
    });
    m.setQueueDepths({ batch: 7 });
    m.setStoreDegraded(true);
    m.observeOverheadMs(0.8);
    const text = await m.render();
    const s = parseSamples(text);
    const cb = { class: 'interactive', backend: 'gpu-0' };
    for (const h of ['ttft', 'tpot', 'itl', 'e2e', 'queue_wait']) {
      expect(text).toContain(`# TYPE slagate_${h}_seconds histogram`);
      expect(value(s, `slagate_${h}_seconds_count`, cb), h).toBe(h === 'itl' ? 2 : 1);
    }
    expect(value(s, 'slagate_ttft_seconds_sum', cb)).toBeCloseTo(0.1);
    expect(value(s, 'slagate_requests_total', { ...cb, outcome: 'ok' })).toBe(1);
    expect(
      value(s, 'slagate_admission_total', { class: 'interactive', decision: 'admitted', reason: 'ok' }),
    ).toBe(1);
    expect(value(s, 'slagate_sla_met_total', { class: 'interactive' })).toBe(1);
    const b = { backend: 'gpu-0' };
    expect(value(s, 'slagate_backend_inflight', b)).toBe(3);
    expect(value(s, 'slagate_backend_concurrency_limit', b)).toBe(8);
    expect(value(s, 'slagate_backend_healthy', b)).toBe(1);
    expect(value(s, 'slagate_backend_kv_cache_usage', b)).toBe(0.4);
    expect(value(s, 'slagate_backend_waiting', b)).toBe(2);
    expect(value(s, 'slagate_backend_prefill_tokens_per_second', b)).toBe(20000);
    expect(value(s, 'slagate_queue_depth', { class: 'batch' })).toBe(7);
    expect(value(s, 'slagate_queue_depth', { class: 'interactive' })).toBe(0);
    expect(value(s, 'slagate_prefix_hit_ratio', {})).toBe(0.5);
    expect(value(s, 'slagate_state_store_degraded', {})).toBe(1);
    expect(value(s, 'slagate_overhead_seconds_count', {})).toBe(1);
    expect(m.contentType).toContain('text/plain');
    // Only our own registry: no process metrics when they are turned off.
    expect(s.every((x) => x.name.startsWith('slagate_'))).toBe(true);
  });

  it('includes every class target in the TTFT, queue, TPOT and ITL buckets', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.observeRequest(record({}), [10]);
    const s = parseSamples(await m.render());
    const cb = { class: 'interactive', backend: 'gpu-0' };
    for (const name of ['slagate_ttft_seconds', 'slagate_queue_wait_seconds']) {
      const le = bucketsOf(s, name, cb);
      expect(le).toEqual(expect.arrayContaining(['0.2', '0.5', '30']));
      expect(le.length).toBe(new Set(le).size);
    }
    for (const name of ['slagate_tpot_seconds', 'slagate_itl_seconds']) {
      expect(bucketsOf(s, name, cb)).toEqual(expect.arrayContaining(['0.03', '0.05', '0.2']));
    }
    // 0.2 and 30 are not in the base list; they came from the classes.
    expect(TTFT_BUCKETS_S).not.toContain(0.2);
    expect(TTFT_BUCKETS_S).not.toContain(30);
    // A TTFT exactly at the target counts as under it (le is inclusive).
    m.observeRequest(record({ ttft_ms: 200, class: 'completion' }));
    const after = parseSamples(await m.render());
    expect(value(after, 'slagate_ttft_seconds_bucket', { class: 'completion', le: '0.2' })).toBe(1);
  });

  it('a target a reload moves away stops being a bucket, its counts at the one above: the list stays as long as the config makes it', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    const cb = { class: 'interactive', backend: 'gpu-0' };
    const at = (ttftMs: number) => ({ ...CLASSES, interactive: { ttft_p99_ms: ttftMs, tpot_p99_ms: 50 } });
    m.setClasses(at(310));
    m.observeRequest(record({ ttft_ms: 305 }));
    m.observeRequest(record({ ttft_ms: 320 }));
    const first = parseSamples(await m.render());
    expect(bucketsOf(first, 'slagate_ttft_seconds', cb)).toContain('0.31');
    // Many reloads, each with another target: only the last one is a bucket.
    for (let ms = 311; ms < 411; ms++) m.setClasses(at(ms));
    const s = parseSamples(await m.render());
    const les = bucketsOf(s, 'slagate_ttft_seconds', cb);
    expect(les).not.toContain('0.31');
    expect(les).toContain('0.41');
    expect(les).toHaveLength(bucketsOf(first, 'slagate_ttft_seconds', cb).length);
    // Nothing lost: the 305 ms request, counted under 0.31, is under each boundary that took 0.31's
    // place; the 320 ms one, above 0.31 then, is still counted only under 0.5.
    const ttft = (le: string) => value(s, 'slagate_ttft_seconds_bucket', { ...cb, le });
    expect(ttft('0.25')).toBe(0);
    expect(ttft('0.41')).toBe(1);
    expect(ttft('0.5')).toBe(2);
    expect(value(s, 'slagate_ttft_seconds_count', cb)).toBe(2);
    // Cumulative all the way up.
    const counts = les.map((le) => ttft(le as string)!);
    for (let i = 1; i < counts.length; i++) expect(counts[i]).toBeGreaterThanOrEqual(counts[i - 1]!);
  });

  it('a target moved away and back comes back at its true count: no exported bucket ever goes down', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    const cb = { class: 'interactive', backend: 'gpu-0' };
    const at = (ttftMs: number) => ({ ...CLASSES, interactive: { ttft_p99_ms: ttftMs, tpot_p99_ms: 50 } });
    const ttft = async (le: string) =>
      value(parseSamples(await m.render()), 'slagate_ttft_seconds_bucket', { ...cb, le });
    m.setClasses(at(220));
    // 90 ms and 210 ms: under 0.1, and under 0.22 (a target of no other class, not in the base list).
    m.observeRequest(record({ ttft_ms: 90 }));
    m.observeRequest(record({ ttft_ms: 210 }));
    expect(await ttft('0.22')).toBe(2);
    m.setClasses(at(300));
    expect(await ttft('0.22')).toBeUndefined();
    m.observeRequest(record({ ttft_ms: 215 }));
    m.setClasses(at(220));
    // Both of its own and the 215 ms one counted while it was not exported: 3, never below the 2
    // it last showed (folded into the boundary above, it came back at 0.2's count: 1).
    expect(await ttft('0.22')).toBe(3);
    expect(await ttft('0.1')).toBe(1);
    expect(await ttft('0.25')).toBe(3);
  });

  it('a reload adds its new targets as buckets: every series goes on, the new bucket counts from then on', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    const cb = { class: 'interactive', backend: 'gpu-0' };
    // 150 ms and 400 ms: both under 0.5, neither under 0.3 (not a bucket yet).
    m.observeRequest(record({ ttft_ms: 150, tpot_ms: 20 }));
    m.observeRequest(record({ ttft_ms: 400, tpot_ms: 35 }));
    const before = parseSamples(await m.render());
    expect(bucketsOf(before, 'slagate_ttft_seconds', cb)).not.toContain('0.3');
    m.setClasses({ ...CLASSES, interactive: { ttft_p99_ms: 300, tpot_p99_ms: 40 } });
    m.observeRequest(record({ ttft_ms: 250, tpot_ms: 38 }), [38]);
    m.observeRequest(record({ ttft_ms: 350, tpot_ms: 45 }));
    const s = parseSamples(await m.render());
    for (const name of ['slagate_ttft_seconds', 'slagate_queue_wait_seconds']) {
      expect(bucketsOf(s, name, cb)).toEqual(expect.arrayContaining(['0.3', '0.5']));
    }
    for (const name of ['slagate_tpot_seconds', 'slagate_itl_seconds']) {
      expect(bucketsOf(s, name, cb)).toEqual(expect.arrayContaining(['0.04', '0.05']));
    }
    const ttft = (le: string) => value(s, 'slagate_ttft_seconds_bucket', { ...cb, le });
    // The old boundary kept every count; the new one counts the 250 ms request, and before the
    // reload holds what the boundary below it (0.25) held: the 150 ms one.
    expect(ttft('0.5')).toBe(4);
    expect(ttft('0.25')).toBe(2);
    expect(ttft('0.3')).toBe(2);
    expect(ttft('+Inf')).toBe(value(s, 'slagate_ttft_seconds_count', cb));
    // TPOT 20 and 35 ms before, 38 and 45 after: 0.04 holds the 20 (under 0.03, the boundary below
    // it then) and the 38; the 35, counted before 0.04 was a boundary, stays above it.
    expect(value(s, 'slagate_tpot_seconds_bucket', { ...cb, le: '0.04' })).toBe(2);
    expect(value(s, 'slagate_tpot_seconds_bucket', { ...cb, le: '0.05' })).toBe(4);
    // Cumulative all the way up.
    const les = bucketsOf(s, 'slagate_ttft_seconds', cb);
    const counts = les.map((le) => ttft(le as string) as number);
    expect(counts).toEqual([...counts].sort((a, b) => a - b));
  });

  it("counts a request's gaps into the ITL histogram as prom-client would, one by one", async () => {
    const gaps = [1, 5, 5.0001, 30, 49.9, 50, 3000];
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.observeRequest(record({}), gaps);
    m.observeRequest(record({ backend: 'gpu-1' }), [7]);
    const ref = new Histogram({
      name: 'ref_itl',
      help: 'reference',
      buckets: bucketsWithTargets(TPOT_BUCKETS_S, [50, 30, 200]),
      registers: [],
    });
    for (const g of gaps) ref.observe(g / 1000);
    const want = (await ref.get()).values;
    const s = parseSamples(await m.render());
    const cb = { class: 'interactive', backend: 'gpu-0' };
    for (const v of want) {
      const name = v.metricName!.replace('ref_itl', 'slagate_itl_seconds');
      const labels = v.labels.le === undefined ? cb : { ...cb, le: String(v.labels.le) };
      expect(value(s, name, labels), `${name} ${JSON.stringify(labels)}`).toBeCloseTo(v.value, 9);
    }
    expect(value(s, 'slagate_itl_seconds_count', { class: 'interactive', backend: 'gpu-1' })).toBe(1);
    // A removed backend's series go with it.
    m.removeBackend('gpu-0');
    expect(value(parseSamples(await m.render()), 'slagate_itl_seconds_count', cb)).toBeUndefined();
    // A record that ends later naming it (a retry queued past the drain) counts under none and
    // brings none of its series back.
    m.observeRequest(record({ backend: 'gpu-0', outcome: 'failed_before_commit' }), [3]);
    const late = parseSamples(await m.render());
    expect(late.filter((x) => x.labels.backend === 'gpu-0')).toEqual([]);
    expect(
      value(late, 'slagate_requests_total', {
        class: 'interactive',
        backend: 'none',
        outcome: 'failed_before_commit',
      }),
    ).toBe(1);
    // A reload that brings the name back: its requests are its own again.
    m.setBackends(['gpu-0', 'gpu-1']);
    m.observeRequest(record({}), [4]);
    expect(value(parseSamples(await m.render()), 'slagate_itl_seconds_count', cb)).toBe(1);
  });

  it('counts TTFT, TPOT, E2E, queue wait and overhead as prom-client would', async () => {
    // Values on and either side of bucket bounds (0.1 s and 0.5 s are TTFT bounds, 0.05 a TPOT one).
    const recs = [
      record({ ttft_ms: 100, tpot_ms: 50, e2e_ms: 280, queue_ms: 0 }),
      record({ ttft_ms: 100.0001, tpot_ms: 49.999, e2e_ms: 9000, queue_ms: 500 }),
      record({ ttft_ms: 500, tpot_ms: 20, e2e_ms: 1e6, queue_ms: 12.5 }),
      record({ ttft_ms: 30, tpot_ms: 20, e2e_ms: 300, queue_ms: 0.2 }),
    ];
    const overheadMs = [0.05, 0.1, 0.25, 40];
    const m = createMetrics(CLASSES, { processMetrics: false });
    // A histogram without labels is exported, at zero, before its first observation.
    expect(value(parseSamples(await m.render()), 'slagate_overhead_seconds_count', {})).toBe(0);
    for (const r of recs) m.observeRequest(r);
    for (const ms of overheadMs) m.observeOverheadMs(ms);
    const s = parseSamples(await m.render());
    const cb = { class: 'interactive', backend: 'gpu-0' };
    const series: [string, keyof AdmissionRecord, readonly number[]][] = [
      ['slagate_ttft_seconds', 'ttft_ms', bucketsWithTargets(TTFT_BUCKETS_S, [500, 200, 30000])],
      ['slagate_tpot_seconds', 'tpot_ms', bucketsWithTargets(TPOT_BUCKETS_S, [50, 30, 200])],
      ['slagate_e2e_seconds', 'e2e_ms', E2E_BUCKETS_S],
      ['slagate_queue_wait_seconds', 'queue_ms', bucketsWithTargets(QUEUE_WAIT_BUCKETS_S, [500, 200, 30000])],
    ];
    const check = async (
      name: string,
      buckets: readonly number[],
      ms: number[],
      labels: Record<string, string>,
    ) => {
      const ref = new Histogram({ name: 'ref', help: 'reference', buckets: [...buckets], registers: [] });
      for (const v of ms) ref.observe(v / 1000);
      const want = (await ref.get()).values;
      expect(want.length).toBe(buckets.length + 3);
      for (const v of want) {
        const n = v.metricName!.replace('ref', name);
        const l = v.labels.le === undefined ? labels : { ...labels, le: String(v.labels.le) };
        expect(value(s, n, l), `${n} ${JSON.stringify(l)}`).toBeCloseTo(v.value, 9);
      }
    };
    for (const [name, field, buckets] of series) {
      await check(
        name,
        buckets,
        recs.map((r) => r[field] as number),
        cb,
      );
    }
    await check('slagate_overhead_seconds', OVERHEAD_BUCKETS_S, overheadMs, {});
  });

  it('exports an ITL series from its first gap on, and again after a reset', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.observeRequest(
      record({ decision: 'refused', outcome: 'refused', reason: 'queue_full', backend: null }),
    );
    m.observeRequest(
      record({ backend: 'gpu-1', outcome: 'failed_after_commit', reason: 'upstream_error' }),
      [5],
    );
    const itl = (text: string) => parseSamples(text).filter((x) => x.name.startsWith('slagate_itl_seconds'));
    // Neither request completed: no gap was observed, so no series (prom-client's behaviour).
    expect(itl(await m.render())).toEqual([]);
    m.observeRequest(record({}), [5, Number.NaN]);
    m.registry.resetMetrics();
    expect(itl(await m.render())).toEqual([]);
    m.observeRequest(record({}), [7]);
    const cb = { class: 'interactive', backend: 'gpu-0' };
    expect(value(parseSamples(await m.render()), 'slagate_itl_seconds_count', cb)).toBe(1);
    expect(value(parseSamples(await m.render()), 'slagate_itl_seconds_sum', cb)).toBeCloseTo(0.007, 9);
  });

  it('counts SLA met only for records that met it, and refusals without latency samples', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.observeRequest(record({ sla_met: true }));
    m.observeRequest(record({ sla_met: false, ttft_ms: 900, outcome: 'ok' }));
    m.observeRequest(record({ sla_met: false, outcome: 'failed_after_commit', reason: 'upstream_error' }));
    m.observeRequest(
      record({
        decision: 'refused',
        outcome: 'refused',
        reason: 'sla_unattainable',
        backend: null,
        ttft_ms: null,
        tpot_ms: null,
        queue_ms: null,
        e2e_ms: 1,
        sla_met: null,
      }),
    );
    // A client that left once its first token was late: judged, a miss. One that left sooner: not.
    const cancelled = { outcome: 'client_cancelled' as const, reason: 'client_cancelled', tpot_ms: null };
    m.observeRequest(record({ ...cancelled, ttft_ms: null, e2e_ms: 900, sla_met: false }));
    m.observeRequest(record({ ...cancelled, ttft_ms: 100, e2e_ms: 150, sla_met: null }));
    const s = parseSamples(await m.render());
    expect(value(s, 'slagate_sla_met_total', { class: 'interactive' })).toBe(1);
    expect(value(s, 'slagate_sla_met_total', { class: 'batch' })).toBe(0);
    // Judged: the one met, the two misses served and the cancel that missed; not the refusal, not
    // the cancel that told nothing.
    expect(value(s, 'slagate_sla_judged_total', { class: 'interactive' })).toBe(4);
    expect(value(s, 'slagate_sla_judged_total', { class: 'batch' })).toBe(0);
    expect(
      value(s, 'slagate_requests_total', { class: 'interactive', backend: 'gpu-0', outcome: 'ok' }),
    ).toBe(2);
    expect(
      value(s, 'slagate_requests_total', {
        class: 'interactive',
        backend: 'gpu-0',
        outcome: 'failed_after_commit',
      }),
    ).toBe(1);
    expect(
      value(s, 'slagate_requests_total', { class: 'interactive', backend: 'none', outcome: 'refused' }),
    ).toBe(1);
    expect(
      value(s, 'slagate_admission_total', {
        class: 'interactive',
        decision: 'refused',
        reason: 'sla_unattainable',
      }),
    ).toBe(1);
    expect(
      value(s, 'slagate_admission_total', {
        class: 'interactive',
        decision: 'admitted',
        reason: 'upstream_error',
      }),
    ).toBe(1);
    // The refusal adds no TTFT or e2e sample anywhere.
    expect(value(s, 'slagate_ttft_seconds_count', { class: 'interactive', backend: 'gpu-0' })).toBe(3);
    expect(value(s, 'slagate_ttft_seconds_count', { backend: 'none' })).toBeUndefined();
    expect(value(s, 'slagate_e2e_seconds_count', { backend: 'none' })).toBeUndefined();
  });

  it('takes latency samples only from whole measurements; a cancel adds none (item 11)', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    const itl = [15, 25];
    m.observeRequest(record({ backend: 'ok' }), itl);
    m.observeRequest(
      record({
        backend: 'cancelled',
        outcome: 'client_cancelled',
        reason: 'client_cancelled',
        sla_met: null,
      }),
      itl,
    );
    m.observeRequest(
      record({ backend: 'cut', outcome: 'failed_after_commit', reason: 'upstream_error', sla_met: false }),
      itl,
    );
    m.observeRequest(
      record({
        backend: 'early',
        outcome: 'failed_before_commit',
        reason: 'upstream_error',
        ttft_ms: null,
        tpot_ms: null,
        sla_met: false,
      }),
    );
    const s = parseSamples(await m.render());
    const count = (h: string, backend: string) =>
      value(s, `slagate_${h}_seconds_count`, { class: 'interactive', backend }) ?? 0;
    const counts = (backend: string) =>
      Object.fromEntries(['ttft', 'tpot', 'itl', 'e2e', 'queue_wait'].map((h) => [h, count(h, backend)]));
    expect(counts('ok')).toEqual({ ttft: 1, tpot: 1, itl: 2, e2e: 1, queue_wait: 1 });
    expect(counts('cancelled')).toEqual({ ttft: 0, tpot: 0, itl: 0, e2e: 0, queue_wait: 0 });
    // A first token arrived, but the stream was cut short: its e2e and TPOT are not the fleet's.
    expect(counts('cut')).toEqual({ ttft: 1, tpot: 0, itl: 0, e2e: 0, queue_wait: 1 });
    expect(counts('early')).toEqual({ ttft: 0, tpot: 0, itl: 0, e2e: 0, queue_wait: 1 });
    // Every one of them is still counted as a request.
    for (const [backend, outcome] of [
      ['cancelled', 'client_cancelled'],
      ['cut', 'failed_after_commit'],
      ['early', 'failed_before_commit'],
    ] as const) {
      expect(value(s, 'slagate_requests_total', { class: 'interactive', backend, outcome })).toBe(1);
    }
  });

  it('records the queue wait of a request refused after queueing', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.observeRequest(
      record({
        class: 'batch',
        decision: 'refused',
        outcome: 'refused',
        reason: 'queue_timeout',
        backend: null,
        queue_ms: 1500,
        ttft_ms: null,
        sla_met: null,
      }),
    );
    const s = parseSamples(await m.render());
    expect(value(s, 'slagate_queue_wait_seconds_sum', { class: 'batch', backend: 'none' })).toBeCloseTo(1.5);
  });

  it("counts a backend's events from 0 once it is in service, and keeps a count across a reload", async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.setBackends(['gpu-0', 'gpu-1']);
    let s = parseSamples(await m.render());
    for (const name of [
      'slagate_backend_reprobes_total',
      'slagate_backend_ejections_total',
      'slagate_backend_engine_restarts_total',
    ]) {
      expect(value(s, name, { backend: 'gpu-0' })).toBe(0);
      expect(value(s, name, { backend: 'gpu-1' })).toBe(0);
    }
    m.backendEvent('ejection', 'gpu-1');
    m.setBackends(['gpu-1', 'gpu-2']);
    s = parseSamples(await m.render());
    expect(value(s, 'slagate_backend_ejections_total', { backend: 'gpu-1' })).toBe(1);
    expect(value(s, 'slagate_backend_ejections_total', { backend: 'gpu-2' })).toBe(0);
  });

  it('removeBackend drops every series of that backend and keeps the others', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    for (const backend of ['gpu-0', 'gpu-1']) {
      m.observeRequest(record({ backend }), [10]);
      m.observeRequest(record({ backend, class: 'batch', outcome: 'timeout', sla_met: false }));
      m.setBackendGauges(backend, { inflight: 1, healthy: true, concurrency_limit: 4 });
      m.backendEvent('reprobe', backend);
      m.backendEvent('ejection', backend);
      m.backendEvent('engine_restart', backend);
    }
    m.backendEvent('reprobe', 'gpu-1');
    expect(
      value(parseSamples(await m.render()), 'slagate_backend_reprobes_total', { backend: 'gpu-0' }),
    ).toBe(1);
    m.removeBackend('gpu-0');
    // A probe that ends after its backend's series went counts nowhere, nor does an event.
    m.backendEvent('reprobe', 'gpu-0');
    m.backendEvent('ejection', 'gpu-0');
    const text = await m.render();
    expect(text).not.toContain('backend="gpu-0"');
    const s = parseSamples(text);
    expect(value(s, 'slagate_requests_total', { backend: 'gpu-1', class: 'batch', outcome: 'timeout' })).toBe(
      1,
    );
    expect(value(s, 'slagate_backend_inflight', { backend: 'gpu-1' })).toBe(1);
    expect(value(s, 'slagate_backend_reprobes_total', { backend: 'gpu-1' })).toBe(2);
    expect(value(s, 'slagate_backend_ejections_total', { backend: 'gpu-1' })).toBe(1);
    expect(value(s, 'slagate_backend_engine_restarts_total', { backend: 'gpu-1' })).toBe(1);
    // A backend added back later (the reload names it again) starts from zero.
    m.setBackends(['gpu-0', 'gpu-1']);
    m.observeRequest(record({ backend: 'gpu-0' }));
    const again = parseSamples(await m.render());
    expect(
      value(again, 'slagate_requests_total', { backend: 'gpu-0', class: 'interactive', outcome: 'ok' }),
    ).toBe(1);
  });

  it('keeps gauges a partial update does not mention, and drops a scraped one that is unknown now', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    m.setBackendGauges('gpu-0', { inflight: 5, kv_cache_usage: 0.9, waiting: 3, healthy: true });
    m.setBackendGauges('gpu-0', { inflight: 2, kv_cache_usage: null, healthy: false });
    const s = parseSamples(await m.render());
    expect(value(s, 'slagate_backend_inflight', { backend: 'gpu-0' })).toBe(2);
    expect(value(s, 'slagate_backend_healthy', { backend: 'gpu-0' })).toBe(0);
    // Not mentioned: kept. Null (a stale scrape): no series, rather than its last value.
    expect(value(s, 'slagate_backend_waiting', { backend: 'gpu-0' })).toBe(3);
    expect(value(s, 'slagate_backend_kv_cache_usage', { backend: 'gpu-0' })).toBeUndefined();
  });

  it('follows the token-weighted prefix hit share of recent requests', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    const ratio = async () => value(parseSamples(await m.render()), 'slagate_prefix_hit_ratio', {})!;
    // Nothing estimated yet: no sample, not a plausible 0.
    expect(await ratio()).toBeUndefined();
    m.observeRequest(record({ prompt_tokens_est: null, prefix_hit_est: null }));
    expect(await ratio()).toBeUndefined();
    m.observeRequest(record({ prompt_tokens_est: 100, prefix_hit_est: 1 }));
    expect(await ratio()).toBe(1);
    m.observeRequest(record({ prompt_tokens_est: 300, prefix_hit_est: 0 }));
    const mixed = await ratio();
    expect(mixed).toBeGreaterThan(0.2);
    expect(mixed).toBeLessThan(0.3);
    for (let i = 0; i < 1000; i++) m.observeRequest(record({ prompt_tokens_est: 100, prefix_hit_est: 0 }));
    expect(await ratio()).toBeLessThan(0.001);
  });

  it('exports the log lines the loggers dropped and their writes that failed', async () => {
    const m = createMetrics(CLASSES, { processMetrics: false });
    const read = async (name: string) => value(parseSamples(await m.render()), name, {});
    const dropped = () => read('slagate_log_lines_dropped_total');
    const errors = () => read('slagate_log_write_errors_total');
    expect(await dropped()).toBe(0);
    expect(await errors()).toBe(0);
    let n = 0;
    let e = 0;
    m.countLogs({ dropped: () => n, writeErrors: () => e });
    n = 7;
    e = 2;
    expect(await dropped()).toBe(7);
    expect(await errors()).toBe(2);
    n = 9;
    e = 5;
    expect(await dropped()).toBe(9);
    expect(await errors()).toBe(5);
  });

  it('keeps separate registries per instance and can add process metrics', async () => {
    const a = createMetrics(CLASSES, { processMetrics: false });
    const b = createMetrics(CLASSES);
    a.observeRequest(record({}));
    expect(await b.render()).not.toContain('slagate_requests_total{');
    expect(await b.render()).toContain('process_cpu_user_seconds_total');
  });
});
