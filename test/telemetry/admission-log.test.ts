import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import {
  type AdmissionFields,
  AdmissionLog,
  type AdmissionRecord,
} from '../../src/telemetry/admission-log.ts';
import { createLogger } from '../../src/telemetry/logger.ts';

// DESIGN section 5, in its order, plus the short failure detail.
const DESIGN_FIELDS = [
  'req_id',
  'tenant',
  'class',
  'model',
  'stream',
  'prompt_tokens_est',
  'prompt_tokens',
  'completion_tokens',
  'max_tokens',
  'prefix_blocks',
  'prefix_hit_est',
  'decision',
  'reason',
  'outcome',
  'backend',
  'attempts',
  'predicted_ttft_ms',
  'queue_ms',
  'ttft_ms',
  'tpot_ms',
  'e2e_ms',
  'ttft_target_ms',
  'tpot_target_ms',
  'sla_met',
  'error',
  // DESIGN section 5's "also carries": the runner-up's prediction and each failed attempt.
  'runner_up',
  'runner_up_predicted_ttft_ms',
  'failed_attempts',
];
// What pino and the admission child logger add around each record.
const FRAMING = ['level', 'time', 'pid', 'hostname', 'kind', 'msg'];

function capture(level = 'info') {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l) lines.push(JSON.parse(l));
      cb();
    },
  });
  const { logger } = createLogger({ level, destination: sink });
  return { logger, lines, settle: () => new Promise((r) => setImmediate(r)) };
}

function fakeClock(start = 1000) {
  const c = { t: start, now: () => c.t };
  return c;
}

const TARGETS = { ttft_target_ms: 500, tpot_target_ms: 50 };

describe('AdmissionLog', () => {
  it('writes exactly one record per request even when end() is called twice', async () => {
    const { logger, lines, settle } = capture();
    const log = new AdmissionLog(logger);
    const h = log.begin({ req_id: 'r1', class: 'interactive', ...TARGETS });
    const first = h.end('ok', { ttft_ms: 100, completion_tokens: 1 });
    const second = h.end('failed_after_commit', { reason: 'upstream_error' });
    await settle();
    expect(first?.outcome).toBe('ok');
    expect(second).toBeNull();
    expect(h.ended).toBe(true);
    expect(log.recorded).toBe(1);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ req_id: 'r1', outcome: 'ok', kind: 'admission', msg: 'admission' });
  });

  it('writes every DESIGN field on every line, null when unknown, and nothing else', async () => {
    const { logger, lines, settle } = capture();
    const log = new AdmissionLog(logger);
    log.begin({ req_id: 'bare' }).end('refused', { reason: 'invalid_api_key' });
    await settle();
    const line = lines[0]!;
    expect(Object.keys(line).sort()).toEqual([...DESIGN_FIELDS, ...FRAMING].sort());
    for (const f of DESIGN_FIELDS) expect(line[f], f).not.toBeUndefined();
    expect(line).toMatchObject({
      tenant: null,
      class: null,
      backend: null,
      ttft_ms: null,
      tpot_ms: null,
      prompt_tokens: null,
      decision: 'refused',
      reason: 'invalid_api_key',
      attempts: 0,
      runner_up: null,
      runner_up_predicted_ttft_ms: null,
      failed_attempts: [],
      sla_met: null,
      level: 30,
    });
  });

  it('keeps fields set during the request and lets end() override them', async () => {
    const { logger, lines, settle } = capture();
    const log = new AdmissionLog(logger);
    const h = log.begin({ req_id: 'r2', tenant: 'team-a', class: 'interactive', model: 'm', stream: true });
    h.set({ prompt_tokens_est: 900, prefix_blocks: 56, prefix_hit_est: 0.75, ...TARGETS });
    h.set({ backend: 'gpu-1', attempts: 1, predicted_ttft_ms: 120, queue_ms: 5 });
    h.end('failed_before_commit', {
      backend: 'gpu-2',
      attempts: 2,
      reason: 'upstream_error',
      error: 'ECONNRESET',
    });
    await settle();
    expect(lines[0]).toMatchObject({
      tenant: 'team-a',
      model: 'm',
      stream: true,
      prompt_tokens_est: 900,
      prefix_blocks: 56,
      prefix_hit_est: 0.75,
      backend: 'gpu-2',
      attempts: 2,
      predicted_ttft_ms: 120,
      queue_ms: 5,
      decision: 'admitted',
      outcome: 'failed_before_commit',
      reason: 'upstream_error',
      error: 'ECONNRESET',
      sla_met: false,
    });
  });

  it('takes e2e from its clock and derives TPOT as (e2e − ttft)/(n − 1)', () => {
    const { logger } = capture();
    const clock = fakeClock();
    const log = new AdmissionLog(logger, { now: clock.now });
    const h = log.begin({ req_id: 'r3', ...TARGETS });
    clock.t += 1100;
    expect(h.elapsedMs()).toBe(1100);
    const r = h.end('ok', { ttft_ms: 100, completion_tokens: 11 })!;
    expect(r.e2e_ms).toBe(1100);
    expect(r.tpot_ms).toBe(100);
    // Measured values win over derived ones.
    const r2 = log
      .begin({ req_id: 'r4' })
      .end('ok', { e2e_ms: 50, tpot_ms: 7, ttft_ms: 10, completion_tokens: 5 })!;
    expect(r2.e2e_ms).toBe(50);
    expect(r2.tpot_ms).toBe(7);
    // An e2e shorter than the TTFT cannot give a TPOT.
    const r3 = log.begin({ req_id: 'r5' }).end('ok', { e2e_ms: 50, ttft_ms: 90, completion_tokens: 5 })!;
    expect(r3.tpot_ms).toBeNull();
  });

  it('computes sla_met from the class targets', () => {
    const { logger } = capture();
    const log = new AdmissionLog(logger);
    const end = (outcome: AdmissionRecord['outcome'], f: AdmissionFields) =>
      log.begin({ req_id: 'x', ...TARGETS }).end(outcome, f)!.sla_met;
    expect(end('ok', { ttft_ms: 500, tpot_ms: 50, completion_tokens: 10 })).toBe(true);
    expect(end('ok', { ttft_ms: 501, tpot_ms: 10, completion_tokens: 10 })).toBe(false);
    expect(end('ok', { ttft_ms: 100, tpot_ms: 51, completion_tokens: 10 })).toBe(false);
    // One output token has no TPOT; TTFT alone decides.
    expect(end('ok', { ttft_ms: 100, completion_tokens: 1, e2e_ms: 100 })).toBe(true);
    expect(end('ok', { ttft_ms: 100, completion_tokens: 0 })).toBe(true);
    // Completed, but no first token was observable (a body passed through whole): unknown, not a miss.
    expect(end('ok', { completion_tokens: 3 })).toBeNull();
    // Several tokens and no TPOT measured: unknown too.
    expect(end('ok', { ttft_ms: 100, tpot_ms: null, completion_tokens: 3 })).toBeNull();
    expect(end('failed_after_commit', { ttft_ms: 100, tpot_ms: 10, completion_tokens: 10 })).toBe(false);
    expect(end('timeout', { reason: 'first_token_timeout' })).toBe(false);
    // A backend's rejection that is surely the client's own error: not judged...
    const rejected = (clientError: boolean) =>
      log
        .begin({ req_id: 'z', ...TARGETS })
        .end('failed_before_commit', { reason: 'invalid_request' }, clientError)!.sla_met;
    expect(rejected(true)).toBeNull();
    // ...one that may be an engine failure vLLM labelled 400, and the fleet's own failures, are.
    expect(rejected(false)).toBe(false);
    expect(end('failed_before_commit', { reason: 'upstream_error' })).toBe(false);
    expect(end('failed_before_commit', { reason: 'no_healthy_backend' })).toBe(false);
    expect(end('refused', { reason: 'sla_unattainable' })).toBeNull();
    // A client that left: judged only when what it saw was already a miss. TARGETS' TTFT is 500 ms.
    expect(end('client_cancelled', { ttft_ms: 100, e2e_ms: 2000 })).toBeNull();
    expect(end('client_cancelled', { ttft_ms: 501, e2e_ms: 900 })).toBe(false);
    expect(end('client_cancelled', { e2e_ms: 400 })).toBeNull();
    expect(end('client_cancelled', { e2e_ms: 501 })).toBe(false);
    // One that left mid-upload, before any decision, was promised nothing.
    expect(end('client_cancelled', { decision: null, e2e_ms: 900 })).toBeNull();
    // A body passed through whole shows no first token: its first token may have come in time.
    const passedThrough = log
      .begin({ req_id: 'p', ...TARGETS })
      .end('client_cancelled', { e2e_ms: 900 }, false, false)!.sla_met;
    expect(passedThrough).toBeNull();
    // A request without a class has no targets to judge against.
    expect(
      log.begin({ req_id: 'y' }).end('ok', { ttft_ms: 1, tpot_ms: 1, completion_tokens: 2 })!.sla_met,
    ).toBeNull();
  });

  it('writes router candidates only at debug level', async () => {
    const candidates = [
      { backend: 'gpu-0', cost: 0.12, ttft_s: 0.1, prefill_s: 0.02 },
      { backend: 'gpu-1', cost: 0.3, ttft_s: 0.0, prefill_s: 0.3 },
    ];
    const info = capture('info');
    const debug = capture('debug');
    new AdmissionLog(info.logger).begin({ req_id: 'a', candidates }).end('ok');
    new AdmissionLog(debug.logger).begin({ req_id: 'b', candidates }).end('ok');
    await info.settle();
    await debug.settle();
    expect(info.lines[0]).not.toHaveProperty('candidates');
    expect(debug.lines[0]).toMatchObject({ candidates });
  });

  it('is off when the logger is silent', async () => {
    const { logger, lines, settle } = capture('silent');
    const log = new AdmissionLog(logger);
    log.begin({ req_id: 'hushed' }).end('ok');
    await settle();
    expect(lines).toEqual([]);
    expect(log.recorded).toBe(1);
  });

  it('writes records at info even when the logger is quieter', async () => {
    const { logger, lines, settle } = capture('warn');
    const log = new AdmissionLog(logger);
    logger.info('not an admission record');
    log.begin({ req_id: 'quiet' }).end('ok');
    await settle();
    expect(lines.map((l) => l.req_id)).toEqual(['quiet']);
  });

  it("writes the very line pino's own log.info would, escapes and debug candidates included", async () => {
    // Well-formed text only: a lone surrogate is where the two differ (next test).
    for (const level of ['info', 'debug']) {
      const raw: string[] = [];
      const sink = new Writable({
        write(chunk, _enc, cb) {
          raw.push(...String(chunk).split(/(?<=\n)/));
          cb();
        },
      });
      const { logger } = createLogger({ level, destination: sink });
      const log = new AdmissionLog(logger);
      const record = log
        .begin({ req_id: 'r"1\u2028\\', tenant: 'tén 🚀', class: 'x', ...TARGETS })
        .end('ok', {
          ttft_ms: 100.1234567,
          completion_tokens: 5,
          predicted_ttft_ms: Number.POSITIVE_INFINITY,
          failed_attempts: [
            { backend: 'a', reason: 'upstream_status', status: 503, detail: 'upstream status 503' },
          ],
          candidates: [{ backend: 'a', cost: 0.25, cached_tokens: 512 }],
        });
      // The same record through pino's serialiser, on a child like the admission log's.
      logger.child({ kind: 'admission' }, { level, redact: [] }).info(record, 'admission');
      await new Promise((r) => setImmediate(r));
      expect(raw).toHaveLength(2);
      const [ours, pinos] = raw.map((l) => l.replace(/"time":\d+/, '"time":0'));
      expect(ours).toBe(pinos);
      expect(JSON.parse(ours!).candidates === undefined).toBe(level === 'info');
    }
  });

  it('keeps a lone surrogate as an escape, so the line stays valid UTF-8 and the value reads back', async () => {
    const raw: string[] = [];
    const sink = new Writable({
      write(chunk, _enc, cb) {
        raw.push(String(chunk));
        cb();
      },
    });
    const { logger } = createLogger({ level: 'info', destination: sink });
    new AdmissionLog(logger).begin({ req_id: 'r', model: 'm\ud800x' }).end('ok');
    await new Promise((r) => setImmediate(r));
    // What a file holds: the line encoded as UTF-8. pino's own serialiser writes the surrogate
    // raw, which the encoding turns into U+FFFD.
    const onDisk = Buffer.from(raw.join(''), 'utf8').toString('utf8');
    expect(JSON.parse(onDisk).model).toBe('m\ud800x');
  });
});
