import { appendFile, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Readable, Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { type LogsReport, logsCommand, prettyLine } from '../../src/cli/logs.ts';
import { ACCURACY } from '../../src/cli/quantile-sketch.ts';
import { AdmissionLog } from '../../src/telemetry/admission-log.ts';
import { createLogger } from '../../src/telemetry/logger.ts';

/** `v` to within the summary's accuracy (src/cli/quantile-sketch.ts): closeTo passes under α·v. */
const near = (v: number) => expect.closeTo(v, -Math.log10(2 * ACCURACY * v));

/** The text summary's line for one latency row: the JSON report's percentiles, as printed. */
const row = (p: { p50: number; p90: number; p99: number }) =>
  [p.p50, p.p90, p.p99].map((v) => String(Number(v.toFixed(1)))).join(' / ');

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'slagate-logs-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('stdin', () => {
  it('a terminal as stdin is said to be read from, then read; a pipe is read without a word', async () => {
    const tty = Object.assign(Readable.from([]), { isTTY: true });
    const atTerminal = io(tty);
    expect(await logsCommand([], atTerminal.io)).toBe(0);
    expect(atTerminal.err()).toMatch(/^slagate logs: reading an admission log from stdin, a terminal/);
    const piped = io(Readable.from([]));
    expect(await logsCommand([], piped.io)).toBe(0);
    expect(piped.err()).toBe('');
  });
});

function io(stdin: NodeJS.ReadableStream = Readable.from([])) {
  let out = '';
  let err = '';
  const sink = (f: (s: string) => void) =>
    new Writable({
      write(chunk, _enc, cb) {
        f(String(chunk));
        cb();
      },
    });
  return {
    io: { stdin, stdout: sink((s) => (out += s)), stderr: sink((s) => (err += s)) },
    out: () => out,
    err: () => err,
  };
}

const INTERACTIVE = { class: 'interactive', ttft_target_ms: 500, tpot_target_ms: 50 };
const BATCH = { class: 'batch', ttft_target_ms: 30000, tpot_target_ms: 200 };

/**
 * A known mix written through the real logger and admission log:
 * - interactive: 100 served, TTFT 10..1000 ms; 51..75 miss with little queueing, 76..100 miss queued;
 * - batch: 20 refused (sla_unattainable), 5 failed after commit, 10 served with TPOT over target.
 * Plus noise the reader must skip: another log line, a non-JSON line and a torn line.
 */
async function writeMix(path: string): Promise<void> {
  const { logger, flush } = createLogger({ level: 'info', destination: path });
  const log = new AdmissionLog(logger);
  logger.info({ port: 8080 }, 'listening');
  for (let i = 1; i <= 100; i++) {
    const ttft = i * 10;
    log.begin({ req_id: `i-${i}`, tenant: 'team-a', ...INTERACTIVE }).end('ok', {
      backend: i % 2 === 0 ? 'gpu-0' : 'gpu-1',
      attempts: 1,
      ttft_ms: ttft,
      queue_ms: i > 75 ? 0.8 * ttft : 0.1 * ttft,
      predicted_ttft_ms: 100,
      tpot_ms: 20,
      e2e_ms: ttft + 9 * 20,
      completion_tokens: 10,
    });
  }
  for (let i = 1; i <= 20; i++) {
    log
      .begin({ req_id: `r-${i}`, ...BATCH })
      .end('refused', { reason: 'sla_unattainable', predicted_ttft_ms: 40000 });
  }
  for (let i = 1; i <= 5; i++) {
    log.begin({ req_id: `f-${i}`, ...BATCH }).end('failed_after_commit', {
      reason: 'upstream_error',
      backend: 'gpu-0',
      attempts: 1,
      ttft_ms: 200,
      e2e_ms: 900,
      completion_tokens: 4,
      error: 'stream dropped',
    });
  }
  for (let i = 1; i <= 10; i++) {
    log.begin({ req_id: `t-${i}`, ...BATCH }).end('ok', {
      backend: 'gpu-1',
      attempts: 1,
      ttft_ms: 1000,
      tpot_ms: 300,
      e2e_ms: 1000 + 300 * 9,
      completion_tokens: 10,
    });
  }
  await flush();
  await appendFile(path, 'plain text line\n{"kind":"admission","req_id":\n');
}

describe('slagate logs', () => {
  it('summarises a known mix: counts, percentiles, attainment and misses', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    const t = io();
    expect(await logsCommand([path, '--json'], t.io)).toBe(0);
    const rep = JSON.parse(t.out()) as LogsReport;
    expect(rep.requests).toBe(135);
    expect(rep.skipped_lines).toBe(3);
    expect(rep.outcomes).toEqual({ ok: 110, refused: 20, failed_after_commit: 5 });
    expect(rep.reasons).toEqual([
      { decision: 'admitted', reason: 'ok', count: 110 },
      { decision: 'refused', reason: 'sla_unattainable', count: 20 },
      { decision: 'admitted', reason: 'upstream_error', count: 5 },
    ]);
    // TTFT 10, 20, ..., 1000 ms: linear interpolation between closest ranks.
    const ttft = rep.by_class.interactive!.ttft_ms!;
    expect(ttft).toEqual({ p50: near(505), p90: near(901), p99: near(990.1) });
    expect(rep.by_class.interactive!.n).toBe(100);
    expect(rep.by_class.batch!.n).toBe(35);
    // Refusals have no latency samples: batch TTFTs are the 5 failures (200) and 10 slow ones (1000).
    expect(rep.by_class.batch!.ttft_ms!.p50).toEqual(near(1000));
    expect(rep.by_class.batch!.queue_ms).toBeNull();
    expect(rep.by_backend['gpu-0']!.n).toBe(55);
    expect(rep.by_backend['gpu-1']!.n).toBe(60);
    expect(rep.sla.interactive).toMatchObject({ judged: 100, met: 50, attainment: 0.5, ttft_target_ms: 500 });
    expect(rep.sla.batch).toMatchObject({ judged: 15, met: 0, attainment: 0 });
    const causes = (cls: string) => Object.fromEntries(rep.misses[cls]!.map((c) => [c.cause, c.count]));
    expect(causes('interactive')).toEqual({
      'TTFT over target: queued too long (queue >= half of TTFT)': 25,
      'TTFT over target: prefill slower than predicted': 25,
    });
    expect(causes('batch')).toEqual({
      'refused: sla_unattainable': 20,
      'TPOT over target: decode slow': 10,
      'failed: failed_after_commit (upstream_error)': 5,
    });
    // The five longest TTFTs: interactive 1000, 990, ..., 960 ms come after the batch ones at 1000
    // only if longer; ties keep the first seen (i-100 was written before t-1..t-10).
    expect(rep.slowest.map((r) => [r.req_id, r.ttft_ms])).toEqual([
      ['i-100', 1000],
      ['t-1', 1000],
      ['t-2', 1000],
      ['t-3', 1000],
      ['t-4', 1000],
    ]);
    expect(rep.slowest[0]).toMatchObject({
      class: 'interactive',
      queue_ms: 800,
      cause: 'TTFT over target: queued too long (queue >= half of TTFT)',
    });
    const queued = rep.misses.interactive!.find((c) => c.cause.includes('queued'))!;
    expect(queued.examples).toEqual(['i-76', 'i-77', 'i-78']);
  });

  it('lists the slowest served requests: a cancel after its first token is not one', async () => {
    const path = join(dir, 'admission.log');
    const { logger, flush } = createLogger({ level: 'info', destination: path });
    const log = new AdmissionLog(logger);
    for (let i = 1; i <= 6; i++) {
      log.begin({ req_id: `ok-${i}`, ...INTERACTIVE }).end('ok', {
        backend: 'gpu-0',
        attempts: 1,
        ttft_ms: i * 10,
        e2e_ms: i * 10 + 100,
        completion_tokens: 5,
      });
    }
    log.begin({ req_id: 'left', ...INTERACTIVE }).end('client_cancelled', {
      backend: 'gpu-0',
      attempts: 1,
      ttft_ms: 900,
      e2e_ms: 950,
    });
    await flush();
    const t = io();
    expect(await logsCommand([path, '--json'], t.io)).toBe(0);
    const rep = JSON.parse(t.out()) as LogsReport;
    expect(rep.slowest.map((r) => r.req_id)).toEqual(['ok-6', 'ok-5', 'ok-4', 'ok-3', 'ok-2']);
  });

  it('names a cause only from the evidence a record holds', async () => {
    const path = join(dir, 'admission.log');
    const lines = [
      // queue wait not recorded: nothing is blamed on queueing
      { req_id: 'no-queue', queue_ms: null, predicted_ttft_ms: 100 },
      // no prediction: not "slower than predicted", not "predicted over target"
      { req_id: 'no-pred', queue_ms: 5, predicted_ttft_ms: null },
      // a retry explains a late first token before anything else
      { req_id: 'retried', queue_ms: 500, predicted_ttft_ms: 100, attempts: 2 },
      { req_id: 'pred-over', queue_ms: 5, predicted_ttft_ms: 900 },
      // a seed was predicted late and sent anyway: that is its cause, not the queue or the prediction
      { req_id: 'seed', queue_ms: 500, predicted_ttft_ms: 900, reason: 'seed' },
    ].map((f) =>
      JSON.stringify({
        kind: 'admission',
        class: 'interactive',
        decision: 'admitted',
        reason: 'ok',
        outcome: 'ok',
        attempts: 1,
        ttft_ms: 800,
        tpot_ms: 10,
        ttft_target_ms: 500,
        tpot_target_ms: 50,
        sla_met: false,
        ...f,
      }),
    );
    await appendFile(path, `${lines.join('\n')}\n`);
    const t = io();
    expect(await logsCommand([path, '--json'], t.io)).toBe(0);
    const rep = JSON.parse(t.out()) as LogsReport;
    const byReq = Object.fromEntries(rep.slowest.map((r) => [r.req_id, r.cause]));
    expect(byReq).toEqual({
      'no-queue': 'TTFT over target: no queue wait recorded',
      'no-pred': 'TTFT over target: slow after dispatch (no prediction recorded)',
      retried: 'TTFT over target: retried (more than one attempt)',
      'pred-over': 'TTFT over target: prefill slow (predicted over target too)',
      seed: 'TTFT over target: a seed (sent cold on purpose, predicted late)',
    });
  });

  it('counts a client that left after its TTFT target as a miss, with its cause, and its partial times nowhere', async () => {
    const path = join(dir, 'admission.log');
    const base = {
      kind: 'admission',
      class: 'interactive',
      decision: 'admitted',
      attempts: 1,
      queue_ms: 5,
      ttft_target_ms: 500,
      tpot_target_ms: 50,
    };
    const cancelled = { ...base, reason: 'client_cancelled', outcome: 'client_cancelled' };
    const lines = [
      { ...base, req_id: 'met', reason: 'ok', outcome: 'ok', ttft_ms: 100, tpot_ms: 20, sla_met: true },
      // Left with no first token 900 ms after arrival; left after a first token at 700 ms (its
      // TPOT so far, 5 ms, is no whole TPOT); left early: not judged.
      { ...cancelled, req_id: 'waited', ttft_ms: null, tpot_ms: null, e2e_ms: 900, sla_met: false },
      { ...cancelled, req_id: 'late', ttft_ms: 700, tpot_ms: 5, e2e_ms: 800, sla_met: false },
      { ...cancelled, req_id: 'early', ttft_ms: null, tpot_ms: null, e2e_ms: 80, sla_met: null },
    ].map((l) => JSON.stringify(l));
    await appendFile(path, `${lines.join('\n')}\n`);
    const t = io();
    expect(await logsCommand([path, '--json'], t.io)).toBe(0);
    const rep = JSON.parse(t.out()) as LogsReport;
    expect(rep.sla.interactive).toMatchObject({ judged: 3, met: 1 });
    expect(rep.sla.interactive!.by_targets[0]).toMatchObject({ judged: 3, met: 1, tpot_p99_ms: near(20) });
    const causes = Object.fromEntries(rep.misses.interactive!.map((c) => [c.cause, c.examples]));
    expect(causes).toEqual({
      'client left: no first token within the TTFT target': ['waited'],
      'client left: TTFT over target': ['late'],
    });
  });

  it('judges each record against its own targets in a file that spans a change of targets', async () => {
    const path = join(dir, 'admission.log');
    // 10 records under ttft 500 / tpot 50, then 10 under ttft 1000 / tpot 50 (a reload); TTFT
    // 100, 200, ..., 1000 ms in both halves, TPOT 20 ms.
    const lines: string[] = [];
    for (const target of [500, 1000]) {
      for (let i = 1; i <= 10; i++) {
        const ttft = 100 * i;
        lines.push(
          JSON.stringify({
            kind: 'admission',
            req_id: `t${target}-${i}`,
            class: 'interactive',
            decision: 'admitted',
            reason: 'ok',
            outcome: 'ok',
            attempts: 1,
            queue_ms: 1,
            predicted_ttft_ms: 50,
            ttft_ms: ttft,
            tpot_ms: 20,
            ttft_target_ms: target,
            tpot_target_ms: 50,
            sla_met: ttft <= target,
          }),
        );
      }
    }
    await appendFile(path, `${lines.join('\n')}\n`);
    const t = io();
    expect(await logsCommand([path, '--json'], t.io)).toBe(0);
    const sla = (JSON.parse(t.out()) as LogsReport).sla.interactive!;
    expect(sla).toMatchObject({ judged: 20, met: 15, attainment: 0.75, ttft_target_ms: 1000 });
    // p99 of 100..1000: 991 by linear interpolation, in each half.
    expect(sla.by_targets).toEqual([
      {
        ttft_target_ms: 500,
        tpot_target_ms: 50,
        judged: 10,
        met: 5,
        attainment: 0.5,
        ttft_p99_ms: near(991),
        tpot_p99_ms: near(20),
      },
      {
        ttft_target_ms: 1000,
        tpot_target_ms: 50,
        judged: 10,
        met: 10,
        attainment: 1,
        ttft_p99_ms: near(991),
        tpot_p99_ms: near(20),
      },
    ]);
    const text = io();
    expect(await logsCommand([path], text.io)).toBe(0);
    const printed = (v: number | null) => String(Number(v!.toFixed(1)));
    const [first] = sla.by_targets;
    expect(text.out()).toMatch(
      new RegExp(
        `interactive\\s+50\\.0%\\s+5/10 met\\s+targets ttft 500ms tpot 50ms\\s+p99 ttft ${printed(first!.ttft_p99_ms)} tpot ${printed(first!.tpot_p99_ms)}`,
      ),
    );
    expect(text.out()).toMatch(/interactive\s+100\.0%\s+10\/10 met\s+targets ttft 1000ms/);
    expect(text.out()).toMatch(/interactive\s+75\.0%\s+15\/20 met\s+all targets/);
  });

  it('--since, --class and --tenant keep only the matching records', async () => {
    const path = join(dir, 'admission.log');
    const base = Date.parse('2026-12-01T10:00:00Z');
    const lines = [
      { req_id: 'old-a', time: base - 60_000, class: 'interactive', tenant: 'a' },
      { req_id: 'new-a', time: base + 1_000, class: 'interactive', tenant: 'a' },
      { req_id: 'new-b', time: base + 2_000, class: 'batch', tenant: 'b' },
      { req_id: 'new-b2', time: base + 3_000, class: 'interactive', tenant: 'b' },
      // Refused before its class was known: the summary's `none`.
      { req_id: 'anon', time: base + 4_000, class: null, tenant: null },
    ].map((f) =>
      JSON.stringify({ kind: 'admission', decision: 'admitted', reason: 'ok', outcome: 'ok', ...f }),
    );
    await appendFile(path, `${lines.join('\n')}\n`);
    const run = async (...args: string[]) => {
      const t = io();
      expect(await logsCommand([path, '--json', ...args], t.io)).toBe(0);
      return (JSON.parse(t.out()) as LogsReport).requests;
    };
    expect(await run()).toBe(5);
    expect(await run('--since', '2026-12-01T10:00:00Z')).toBe(4);
    expect(await run('--class', 'none')).toBe(1);
    expect(await run('--since', '2026-12-01T10:00:00Z', '--class', 'interactive')).toBe(2);
    // A time without a zone is UTC, as --pretty prints times, wherever the command runs.
    const tz = process.env.TZ;
    process.env.TZ = 'America/New_York';
    try {
      expect(await run('--since', '2026-12-01T10:00:00')).toBe(4);
      expect(await run('--since', '2026-12-01 10:00:00.000')).toBe(4);
      expect(await run('--since', '2026-12-01t10:00:00')).toBe(4);
      expect(await run('--since', '2026-12-01T05:00:00-05:00')).toBe(4);
      // An offset of hours alone, as ISO 8601 allows it.
      expect(await run('--since', '2026-12-01T05:00:00-05')).toBe(4);
      expect(await run('--since', '2026-12-01T11:00:01.500+01')).toBe(3);
    } finally {
      if (tz === undefined) delete process.env.TZ;
      else process.env.TZ = tz;
    }
    expect(await run('--tenant', 'b')).toBe(2);
    expect(await run('--tenant', 'b', '--class', 'batch')).toBe(1);
    // An age counts back from now: these records are long past.
    expect(await run('--since', '15m')).toBe(0);
    const bad = io();
    expect(await logsCommand([path, '--since', 'yesterday-ish'], bad.io)).toBe(2);
    expect(bad.err()).toContain('--since yesterday-ish');
    // A bare number is no date (Date.parse would read it as a year) and no age without its unit.
    for (const n of ['45', '90', '5']) {
      const bare = io();
      expect(await logsCommand([path, '--since', n], bare.io)).toBe(2);
      expect(bare.err()).toContain(`--since ${n}: not an ISO time or an age like 15m`);
    }
  });

  it('--since refuses a date or time of day that does not exist, and takes every real one, in each format', async () => {
    const path = join(dir, 'admission.log');
    await appendFile(path, '');
    const impossible = [
      ['2026-02-30', 'date'],
      ['2026-02-29', 'date'],
      ['1900-02-29', 'date'],
      ['2026-04-31', 'date'],
      ['2026-12-01T24:00:00Z', 'time of day'],
      ['2026-12-01 23:59:60', 'time of day'],
      ['2026-12-01t10:60z', 'time of day'],
    ] as const;
    for (const [since, what] of impossible) {
      const t = io();
      expect(await logsCommand([path, '--since', since], t.io), since).toBe(2);
      expect(t.err(), since).toBe(`slagate logs: --since ${since}: no such ${what}\n`);
    }
    const real = [
      '2028-02-29',
      '2000-02-29',
      '2026-12-31T23:59:59.999Z',
      '2026-12-01 00:00',
      '2026-12-01t10:00:00z',
      '2026-12-01T10:00:00+0100',
      '2026-12-01T10:00:00+01',
      '2026-12-01T10:00:00-05:00',
      '15m',
    ];
    for (const since of real) {
      const t = io();
      expect(await logsCommand([path, '--since', since], t.io), since).toBe(0);
      expect(t.err(), since).toBe('');
    }
  });

  it("skips a line shaped like a record whose fields are not a record's, and reports the rest", async () => {
    const path = join(dir, 'admission.log');
    const good = {
      kind: 'admission',
      req_id: 'good',
      decision: 'admitted',
      reason: 'ok',
      outcome: 'ok',
      ttft_ms: 12,
    };
    const lines = [
      good,
      // No reason; a TTFT as a string; a decision nobody makes.
      { kind: 'admission', req_id: 'x', outcome: 'ok', msg: 'admission' },
      { ...good, req_id: 'y', ttft_ms: '700' },
      { ...good, req_id: 'z', decision: 'maybe' },
      // A time no date has (past JavaScript's ±8.64e15 ms), and one JSON reads as Infinity.
      { ...good, req_id: 't', time: 1e17 },
      // A cancel before admission: decision null, read as a record.
      {
        ...good,
        req_id: 'gone',
        decision: null,
        reason: 'client_cancelled',
        outcome: 'client_cancelled',
        ttft_ms: null,
      },
    ].map((l) => JSON.stringify(l));
    lines.splice(1, 0, JSON.stringify({ ...good, req_id: 'inf' }).replace('{', '{"time":1e400,'));
    await appendFile(path, `${lines.join('\n')}\n`);
    const text = io();
    expect(await logsCommand([path], text.io)).toBe(0);
    expect(text.out()).toContain('admission log: 2 requests (5 other lines skipped)');
    const pretty = io();
    expect(await logsCommand([path, '--pretty'], pretty.io)).toBe(0);
    // Each good record, the one after the bad times included.
    expect(pretty.out().trimEnd().split('\n')).toHaveLength(2);
    expect(pretty.out()).toContain('gone');
  });

  it("prints no record's control characters raw in the summary: an escape sequence cannot hide text", async () => {
    const path = join(dir, 'admission.log');
    const rec = {
      kind: 'admission',
      req_id: 'x\u001b[2J',
      class: 'inter\nactive',
      decision: 'admitted',
      reason: 'ok',
      outcome: 'ok',
      ttft_ms: 900,
      ttft_target_ms: 500,
      tpot_target_ms: 50,
    };
    await appendFile(path, `${JSON.stringify(rec)}\n`);
    const text = io();
    expect(await logsCommand([path], text.io)).toBe(0);
    const out = text.out();
    // Written as their escapes: no line forged by a newline in a class name, no escape sequence.
    expect(out).toContain('x\\u001b[2J');
    expect(out).toContain('inter\\u000aactive');
    expect(out).not.toContain('\u001b');
    expect(out.split('\n').some((l) => l.trimStart().startsWith('active'))).toBe(false);
  });

  it('prints the same summary as text', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    const t = io();
    expect(await logsCommand([path], t.io)).toBe(0);
    const text = t.out();
    const json = io();
    expect(await logsCommand([path, '--json'], json.io)).toBe(0);
    const ttft = (JSON.parse(json.out()) as LogsReport).by_class.interactive!.ttft_ms!;
    expect(text).toContain('admission log: 135 requests (3 other lines skipped)');
    expect(text).toMatch(/ok\s+110\s+81\.5%/);
    expect(text).toMatch(/refused\s+sla_unattainable\s+20/);
    expect(text).toMatch(new RegExp(`interactive\\s+100\\s+${row(ttft)}`));
    expect(text).toMatch(/interactive\s+50\.0%\s+50\/100 met/);
    expect(text).toMatch(/25\s+TTFT over target: queued too long .* e\.g\. i-76, i-77, i-78/);
    expect(text).toContain('SLA misses explained');
  });

  it('an output that fails (a full disk) is said as such, exit 1, not blamed on the file being read, in every mode', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    for (const mode of [[], ['--json'], ['--pretty']]) {
      let err = '';
      const stdout = new Writable({
        highWaterMark: 1,
        write(_chunk, _enc, cb) {
          setImmediate(() =>
            cb(Object.assign(new Error('write ENOSPC'), { code: 'ENOSPC', syscall: 'write' })),
          );
        },
      });
      const stderr = new Writable({
        write(chunk, _enc, cb) {
          err += String(chunk);
          cb();
        },
      });
      expect(
        await logsCommand([path, ...mode], { stdin: Readable.from([]), stdout, stderr }),
        mode.join(' '),
      ).toBe(1);
      expect(err, mode.join(' ')).toBe('slagate logs: write ENOSPC\n');
    }
  });

  it('reads a gzip-compressed log (as logrotate leaves it) and one that starts with a byte-order mark', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    const { readFile, writeFile } = await import('node:fs/promises');
    const { gzipSync } = await import('node:zlib');
    const content = await readFile(path);
    await writeFile(`${path}.1.gz`, gzipSync(content));
    await writeFile(`${path}.bom`, Buffer.concat([Buffer.from('\ufeff'), content]));
    for (const file of [`${path}.1.gz`, `${path}.bom`]) {
      const t = io();
      expect(await logsCommand([file, '--json'], t.io)).toBe(0);
      const report = JSON.parse(t.out()) as LogsReport;
      expect(report.requests).toBe(135);
    }
    // Compressed, from a pipe that delivers its first byte alone.
    const gz = gzipSync(content);
    const stdin = new PassThrough();
    const t = io(stdin);
    const done = logsCommand(['--json'], t.io);
    stdin.write(gz.subarray(0, 1));
    await new Promise((r) => setImmediate(r));
    stdin.end(gz.subarray(1));
    expect(await done).toBe(0);
    expect((JSON.parse(t.out()) as LogsReport).requests).toBe(135);
  });

  it('reads a rotated set given as files, and of a compressed file cut short or followed by plain text, what comes before', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    const { readFile, writeFile } = await import('node:fs/promises');
    const { gzipSync } = await import('node:zlib');
    const content = await readFile(path);
    const gz = gzipSync(content);
    await writeFile(`${path}.1.gz`, gz);
    // Being compressed still, or copied in part: the lines before the cut are read.
    await writeFile(`${path}.cut.gz`, gz.subarray(0, gz.length - 100));
    const report = async (args: string[], stdin?: NodeJS.ReadableStream, status = 0) => {
      const t = io(stdin);
      expect(await logsCommand([...args, '--json'], t.io)).toBe(status);
      return { rep: JSON.parse(t.out()) as LogsReport, err: t.err() };
    };
    // The old file compressed, then the current one: both counted.
    expect((await report([`${path}.1.gz`, path])).rep.requests).toBe(270);
    // The oldest of the set already deleted by logrotate, and a directory: each said, the rest read.
    const missing = await report([`${path}.2.gz`, `${path}.1.gz`, dir, path], undefined, 1);
    expect(missing.rep.requests).toBe(270);
    expect(missing.err).toMatch(/admission\.log\.2\.gz: ENOENT/);
    expect(missing.err).toMatch(/EISDIR/);
    // ... and said to be cut (exit status 1), down to a cut in its last eight bytes (the length).
    const cut = await report([`${path}.cut.gz`], undefined, 1);
    expect(cut.rep.requests).toBeGreaterThan(100);
    expect(cut.rep.requests).toBeLessThan(135);
    expect(cut.err).toMatch(/cut\.gz: compressed data cut short \(unexpected end of file\)/);
    await writeFile(`${path}.trailer.gz`, gz.subarray(0, gz.length - 2));
    const trailer = await report([`${path}.trailer.gz`], undefined, 1);
    expect(trailer.rep.requests).toBe(135);
    expect(trailer.err).toMatch(/trailer\.gz: compressed data cut short/);
    // The same from a pipe whose end comes while its last pieces still wait to be inflated (all
    // written at once): no line before the cut is lost with the last piece.
    const piped = new PassThrough();
    const cutTrailer = gz.subarray(0, gz.length - 2);
    for (let at = 0; at < cutTrailer.length; at += 512) piped.write(cutTrailer.subarray(at, at + 512));
    piped.end();
    const fromPipe = await report([], piped, 1);
    expect(fromPipe.rep.requests).toBe(135);
    expect(fromPipe.err).toMatch(/stdin: compressed data cut short/);
    // Concatenated into one stream (cat old.gz current): the compressed part is read up to the
    // chunk the plain text starts in (lost with it, as zlib gives it up), and the rest is said to
    // be unreadable: the report of what was read, and exit status 1.
    const both = await report(
      [],
      Readable.from([gz.subarray(0, gz.length - 1), Buffer.concat([gz.subarray(-1), content])]),
      1,
    );
    expect(both.rep.requests).toBeGreaterThan(100);
    expect(both.err).toMatch(/stdin: compressed data unreadable from here on/);
    // stdin at most once.
    const t = io();
    expect(await logsCommand(['-', '-'], t.io)).toBe(2);
  });

  it('--pretty whose reader has gone stops reading an input that never ends (tail -f)', async () => {
    const stdin = new PassThrough();
    const gone = new Writable({
      write(_chunk, _enc, cb) {
        cb(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }));
      },
    });
    gone.on('error', () => {});
    const t = io(stdin);
    const done = logsCommand(['--pretty'], { ...t.io, stdout: gone });
    const rec = {
      kind: 'admission',
      req_id: 'a',
      decision: 'admitted',
      reason: 'ok',
      outcome: 'ok',
      ...INTERACTIVE,
    };
    stdin.write(`${JSON.stringify(rec)}\n`);
    stdin.write(`${JSON.stringify({ ...rec, req_id: 'b' })}\n`);
    // stdin stays open, as a `tail -f` does: the command ends all the same, and lets go of it.
    expect(await done).toBe(0);
    expect(stdin.destroyed).toBe(true);
  });

  it('takes whole measurements only, as /metrics does: no TPOT or e2e of a stream cut short, no queue wait of a cancel', async () => {
    const path = join(dir, 'admission.log');
    const base = { kind: 'admission', decision: 'admitted', ...INTERACTIVE };
    const lines = [
      {
        ...base,
        req_id: 'ok',
        reason: 'ok',
        outcome: 'ok',
        ttft_ms: 100,
        tpot_ms: 20,
        e2e_ms: 1000,
        queue_ms: 10,
      },
      {
        ...base,
        req_id: 'cut',
        reason: 'upstream_error',
        outcome: 'failed_after_commit',
        ttft_ms: 200,
        tpot_ms: 5,
        e2e_ms: 300,
        queue_ms: 20,
      },
      {
        ...base,
        req_id: 'gone',
        reason: 'client_cancelled',
        outcome: 'client_cancelled',
        ttft_ms: 50,
        tpot_ms: 4,
        e2e_ms: 60,
        queue_ms: 3000,
      },
    ].map((l) => JSON.stringify(l));
    await appendFile(path, `${lines.join('\n')}\n`);
    const t = io();
    expect(await logsCommand([path, '--json'], t.io)).toBe(0);
    const g = (JSON.parse(t.out()) as LogsReport).by_class.interactive!;
    expect(g.n).toBe(3);
    expect(g.ttft_ms).toMatchObject({ p50: near(150) }); // ok and the cut stream: each had a first token
    expect(g.tpot_ms).toMatchObject({ p50: near(20), p99: near(20) });
    expect(g.e2e_ms).toMatchObject({ p50: near(1000), p99: near(1000) });
    expect(g.queue_ms).toMatchObject({ p50: near(15), p99: near(19.9) });
  });

  it('a summary whose reader has gone (EPIPE) ends quietly', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    for (const argv of [[path], [path, '--json']]) {
      const gone = new Writable({
        write(_chunk, _enc, cb) {
          cb(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }));
        },
      });
      // An 'error' nobody listens for would end a real process with a stack trace: caught here.
      const unheard: unknown[] = [];
      const emit = gone.emit.bind(gone);
      gone.emit = ((event: string | symbol, ...args: unknown[]) => {
        if (event === 'error' && gone.listenerCount('error') === 0) {
          unheard.push(args[0]);
          return false;
        }
        return emit(event, ...args);
      }) as typeof gone.emit;
      const t = io();
      expect(await logsCommand(argv, { ...t.io, stdout: gone })).toBe(0);
      await new Promise((r) => setImmediate(r));
      expect(unheard).toEqual([]);
      expect(t.err()).toBe('');
    }
  });

  it('reads stdin when the file is - or absent', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    const { readFile } = await import('node:fs/promises');
    const content = await readFile(path, 'utf8');
    for (const argv of [['-', '--json'], ['--json']]) {
      const t = io(Readable.from([content]));
      expect(await logsCommand(argv, t.io)).toBe(0);
      expect((JSON.parse(t.out()) as LogsReport).requests).toBe(135);
    }
  });

  it('--pretty prints each record as its line arrives', async () => {
    const stdin = new PassThrough();
    const t = io(stdin);
    const done = logsCommand(['--pretty'], t.io);
    const lines = [
      {
        kind: 'admission',
        msg: 'admission',
        time: Date.UTC(2025, 0, 1, 12, 0, 1, 234),
        req_id: 'req-a',
        class: 'interactive',
        decision: 'admitted',
        reason: 'ok',
        outcome: 'ok',
        backend: 'gpu-1',
        queue_ms: 3,
        ttft_ms: 120.25,
        tpot_ms: 12.5,
        ttft_target_ms: 500,
        tpot_target_ms: 50,
        predicted_ttft_ms: 110,
        sla_met: true,
        error: null,
      },
      {
        kind: 'admission',
        msg: 'admission',
        time: Date.UTC(2025, 0, 1, 12, 0, 2, 0),
        req_id: 'req-b',
        class: 'batch',
        decision: 'refused',
        reason: 'sla_unattainable',
        outcome: 'refused',
        backend: null,
        queue_ms: null,
        ttft_ms: null,
        tpot_ms: null,
        ttft_target_ms: 30000,
        tpot_target_ms: 200,
        predicted_ttft_ms: 41000,
        sla_met: null,
        error: null,
      },
    ];
    stdin.write('{"level":30,"msg":"listening"}\n');
    stdin.write(`${JSON.stringify(lines[0])}\n`);
    // The first line is printed before the stream ends: the view follows a live stream.
    for (let i = 0; i < 200 && !t.out().includes('req-a'); i++) await new Promise((r) => setTimeout(r, 10));
    expect(t.out()).toContain('req-a');
    expect(t.out()).not.toContain('req-b');
    stdin.end(`${JSON.stringify(lines[1])}\n`);
    expect(await done).toBe(0);
    const out = t.out().trimEnd().split('\n');
    expect(out).toHaveLength(2);
    expect(out[0]).toMatch(
      /^12:00:01\.234 req-a\s+interactive\s+ok\s+gpu-1\s+ttft 120\.3\/500ms\s+tpot 12\.5\/50ms\s+MET/,
    );
    expect(out[1]).toMatch(
      /^12:00:02\.000 req-b\s+batch\s+refused sla_unattainable\s+-\s+predicted 41000\/30000ms$/,
    );
  });

  it('marks misses and failures in the pretty view', () => {
    const line = prettyLine({
      req_id: 'req-c',
      tenant: null,
      class: 'interactive',
      model: null,
      stream: true,
      prompt_tokens_est: 10,
      prompt_tokens: 10,
      completion_tokens: 3,
      max_tokens: 10,
      prefix_blocks: 0,
      prefix_hit_est: 0,
      decision: 'admitted',
      reason: 'upstream_error',
      outcome: 'failed_after_commit',
      backend: 'gpu-0',
      attempts: 1,
      predicted_ttft_ms: 100,
      runner_up: null,
      runner_up_predicted_ttft_ms: null,
      failed_attempts: [],
      queue_ms: 0,
      ttft_ms: 700,
      tpot_ms: null,
      e2e_ms: 900,
      ttft_target_ms: 500,
      tpot_target_ms: 50,
      sla_met: false,
      error: 'stream dropped',
    });
    expect(line).toMatch(
      /failed_after_commit\s+gpu-0\s+ttft 700\/500ms\s+tpot -\/50ms\s+MISS upstream_error \(stream dropped\)$/,
    );
  });

  it('prints a client’s control characters as escapes: one record is one line, and no escape sequence reaches the terminal', () => {
    const forged = 'nope\n09:00:00.000 admin-req-1  interactive  ok  gpu-0  MET\u001b[8m\u009b2K';
    const line = prettyLine({
      req_id: 'req-e',
      tenant: null,
      class: 'interactive',
      model: forged,
      stream: true,
      prompt_tokens_est: 10,
      prompt_tokens: null,
      completion_tokens: null,
      max_tokens: 10,
      prefix_blocks: 0,
      prefix_hit_est: null,
      decision: 'refused',
      reason: 'model_not_found',
      outcome: 'refused',
      backend: null,
      attempts: 0,
      predicted_ttft_ms: null,
      runner_up: null,
      runner_up_predicted_ttft_ms: null,
      failed_attempts: [],
      queue_ms: null,
      ttft_ms: null,
      tpot_ms: null,
      e2e_ms: 1,
      ttft_target_ms: 500,
      tpot_target_ms: 50,
      sla_met: null,
      error: `The model '${forged}' does not exist.`,
    });
    const controls = [...line].filter((c) => {
      const n = c.charCodeAt(0);
      return n < 0x20 || (n >= 0x7f && n <= 0x9f);
    });
    expect(controls).toEqual([]);
    expect(line).toContain("(The model 'nope\\u000a09:00:00.000 admin-req-1");
    expect(line).toContain('MET\\u001b[8m\\u009b2K');
  });

  it('says a cancellation once in the pretty view', () => {
    const base = {
      req_id: 'req-d',
      tenant: null,
      class: 'interactive',
      model: null,
      stream: true,
      prompt_tokens_est: 10,
      prompt_tokens: null,
      completion_tokens: null,
      max_tokens: 10,
      prefix_blocks: 0,
      prefix_hit_est: null,
      decision: 'admitted',
      reason: 'client_cancelled',
      outcome: 'client_cancelled',
      backend: null,
      attempts: 0,
      predicted_ttft_ms: null,
      runner_up: null,
      runner_up_predicted_ttft_ms: null,
      failed_attempts: [],
      queue_ms: 12,
      ttft_ms: null,
      tpot_ms: null,
      e2e_ms: 15,
      ttft_target_ms: 500,
      tpot_target_ms: 50,
      sla_met: null,
    } as const;
    for (const error of [null, 'client_cancelled']) {
      const line = prettyLine({ ...base, error });
      expect(line.match(/client_cancelled/g)).toHaveLength(1);
      expect(line).toMatch(/client_cancelled\s+-\s+ttft -\/500ms\s+tpot -\/50ms\s+-\s+queue 12ms$/);
    }
  });

  it('--pretty stops quietly when its reader goes away', async () => {
    const path = join(dir, 'admission.log');
    await writeMix(path);
    let written = 0;
    const stdout = new Writable({
      write(_chunk, _enc, cb) {
        written++;
        cb(written > 2 ? Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }) : null);
      },
    });
    const t = io();
    expect(await logsCommand([path, '--pretty'], { ...t.io, stdout })).toBe(0);
    expect(written).toBeLessThan(135);
    expect(t.err()).toBe('');
  });

  it('fails cleanly on a missing file and on bad arguments', async () => {
    const missing = io();
    expect(await logsCommand([join(dir, 'nope.log')], missing.io)).toBe(1);
    expect(missing.err()).toContain('ENOENT');
    const bad = io();
    expect(await logsCommand(['--bogus'], bad.io)).toBe(2);
    expect(bad.err()).toContain('usage: slagate logs');
  });
});
