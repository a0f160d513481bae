import { once } from 'node:events';
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import type { AdmissionRecord } from '../telemetry/admission-log.ts';
import { OUTCOMES } from '../telemetry/outcome.ts';

// `slagate logs [FILE]`: reads an admission log (a file, or stdin) and explains it. Lines that are
// not admission records (other log lines, partial writes, anything not JSON) are skipped and counted.

const USAGE = `usage: slagate logs [FILE|-] [--pretty] [--json]
  Reads admission-log lines (from FILE, or stdin when FILE is absent or -).
  default   summary: outcomes, decisions and reasons, latency percentiles per class and backend,
            SLA attainment per class, SLA misses explained
  --pretty  one human line per request, printed as lines arrive
  --json    the summary as JSON
`;

export interface LogsIo {
  stdin: NodeJS.ReadableStream;
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
}

type LogRecord = AdmissionRecord & { time?: number };

export async function logsCommand(argv: string[], io: LogsIo = process): Promise<number> {
  let args: ReturnType<typeof parse>;
  try {
    args = parse(argv);
  } catch (err) {
    io.stderr.write(`${(err as Error).message}\n${USAGE}`);
    return 2;
  }
  if (args.values.help) {
    io.stdout.write(USAGE);
    return 0;
  }
  if (args.positionals.length > 1) {
    io.stderr.write(USAGE);
    return 2;
  }
  const file = args.positionals[0];
  const input = file === undefined || file === '-' ? io.stdin : createReadStream(file);
  const lines = createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY });
  // A reader that goes away (`slagate logs --pretty | head`) ends the command quietly.
  const onOutputError = () => lines.close();
  io.stdout.on('error', onOutputError);
  const summary = new Summary();
  try {
    for await (const line of lines) {
      const record = parseAdmissionLine(line);
      if (record === null) {
        if (line.trim() !== '') summary.skipped++;
        continue;
      }
      if (!args.values.pretty) summary.add(record);
      else if (!io.stdout.write(`${prettyLine(record)}\n`)) await once(io.stdout, 'drain');
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EPIPE') return 0;
    io.stderr.write(`slagate logs: ${(err as Error).message}\n`);
    return 1;
  } finally {
    io.stdout.off('error', onOutputError);
  }
  if (args.values.pretty) return 0;
  const report = summary.report();
  io.stdout.write(args.values.json ? `${JSON.stringify(report, null, 2)}\n` : formatReport(report));
  return 0;
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      pretty: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
}

/** The record on this line, or null when the line is not an admission record. */
export function parseAdmissionLine(line: string): LogRecord | null {
  if (!line.startsWith('{')) return null;
  let obj: unknown;
  try {
    obj = JSON.parse(line);
  } catch {
    return null;
  }
  if (typeof obj !== 'object' || obj === null) return null;
  const o = obj as Record<string, unknown>;
  if (o.kind !== 'admission' && o.msg !== 'admission') return null;
  if (typeof o.req_id !== 'string' || typeof o.outcome !== 'string') return null;
  return o as unknown as LogRecord;
}

// ---- pretty view --------------------------------------------------------------------------------

/** `time req_id class decision/outcome backend ttft/target tpot/target verdict reason`. */
export function prettyLine(r: LogRecord): string {
  const time = typeof r.time === 'number' ? new Date(r.time).toISOString().slice(11, 23) : '--:--:--.---';
  const what = r.decision === 'refused' ? `refused ${r.reason}` : `${r.outcome}`;
  const verdict = r.sla_met === true ? 'MET' : r.sla_met === false ? 'MISS' : '-';
  const parts = [
    time,
    r.req_id.padEnd(14),
    (r.class ?? '-').padEnd(12),
    what.padEnd(28),
    (r.backend ?? '-').padEnd(10),
  ];
  if (r.decision === 'refused') {
    parts.push(`predicted ${vsTarget(r.predicted_ttft_ms, r.ttft_target_ms)}`);
    if (r.queue_ms !== null) parts.push(`queued ${num(r.queue_ms)}ms`);
  } else {
    parts.push(`ttft ${vsTarget(r.ttft_ms, r.ttft_target_ms)}`.padEnd(20));
    parts.push(`tpot ${vsTarget(r.tpot_ms, r.tpot_target_ms)}`.padEnd(18));
    parts.push(verdict.padEnd(4));
    if (r.queue_ms !== null && r.queue_ms > 0) parts.push(`queue ${num(r.queue_ms)}ms`);
    // The reason only when it adds to the outcome (`client_cancelled` says it once).
    if (r.reason !== 'ok' && r.reason !== r.outcome) parts.push(r.reason);
  }
  if (r.error && r.error !== r.reason && r.error !== r.outcome) parts.push(`(${r.error})`);
  return parts.join(' ').trimEnd();
}

function vsTarget(v: number | null, target: number | null): string {
  return `${v === null ? '-' : num(v)}/${target === null ? '-' : num(target)}ms`;
}

function num(v: number): string {
  return String(Number(v.toFixed(1)));
}

// ---- summary ------------------------------------------------------------------------------------

const METRICS = ['ttft_ms', 'tpot_ms', 'e2e_ms', 'queue_ms'] as const;
type Metric = (typeof METRICS)[number];
type Percentiles = { p50: number; p90: number; p99: number } | null;

export interface GroupReport {
  n: number;
  ttft_ms: Percentiles;
  tpot_ms: Percentiles;
  e2e_ms: Percentiles;
  queue_ms: Percentiles;
}

export interface MissCause {
  cause: string;
  count: number;
  examples: string[];
}

export interface LogsReport {
  requests: number;
  skipped_lines: number;
  outcomes: Record<string, number>;
  reasons: { decision: string; reason: string; count: number }[];
  by_class: Record<string, GroupReport>;
  by_backend: Record<string, GroupReport>;
  sla: Record<
    string,
    {
      judged: number;
      met: number;
      attainment: number | null;
      ttft_target_ms: number | null;
      tpot_target_ms: number | null;
    }
  >;
  misses: Record<string, MissCause[]>;
}

const EXAMPLES = 3;
// A miss whose queue wait is at least this share of its TTFT is blamed on queueing.
const QUEUE_SHARE = 0.5;

class Group {
  n = 0;
  readonly values: Record<Metric, number[]> = { ttft_ms: [], tpot_ms: [], e2e_ms: [], queue_ms: [] };

  add(r: LogRecord): void {
    this.n++;
    if (r.queue_ms !== null) this.values.queue_ms.push(r.queue_ms);
    // Latencies describe served requests; a refusal's time-to-refuse is not a TTFT.
    if (r.decision === 'refused') return;
    for (const m of ['ttft_ms', 'tpot_ms', 'e2e_ms'] as const) {
      const v = r[m];
      if (v !== null && v !== undefined) this.values[m].push(v);
    }
  }

  report(): GroupReport {
    return {
      n: this.n,
      ttft_ms: percentiles(this.values.ttft_ms),
      tpot_ms: percentiles(this.values.tpot_ms),
      e2e_ms: percentiles(this.values.e2e_ms),
      queue_ms: percentiles(this.values.queue_ms),
    };
  }
}

class Summary {
  requests = 0;
  skipped = 0;
  private readonly outcomes = new Map<string, number>();
  private readonly reasons = new Map<string, { decision: string; reason: string; count: number }>();
  private readonly classes = new Map<string, Group>();
  private readonly backends = new Map<string, Group>();
  private readonly sla = new Map<string, LogsReport['sla'][string]>();
  private readonly misses = new Map<string, Map<string, MissCause>>();

  add(r: LogRecord): void {
    this.requests++;
    this.outcomes.set(r.outcome, (this.outcomes.get(r.outcome) ?? 0) + 1);
    const key = `${r.decision}\u0000${r.reason}`;
    const reason = this.reasons.get(key) ?? { decision: r.decision, reason: r.reason, count: 0 };
    reason.count++;
    this.reasons.set(key, reason);
    const cls = r.class ?? 'none';
    groupOf(this.classes, cls).add(r);
    if (r.backend !== null && r.backend !== undefined) groupOf(this.backends, r.backend).add(r);
    if (r.sla_met === null || r.sla_met === undefined) return;
    let sla = this.sla.get(cls);
    if (sla === undefined) {
      sla = { judged: 0, met: 0, attainment: null, ttft_target_ms: null, tpot_target_ms: null };
      this.sla.set(cls, sla);
    }
    sla.judged++;
    sla.ttft_target_ms = r.ttft_target_ms;
    sla.tpot_target_ms = r.tpot_target_ms;
    if (r.sla_met) {
      sla.met++;
      return;
    }
    let causes = this.misses.get(cls);
    if (causes === undefined) {
      causes = new Map();
      this.misses.set(cls, causes);
    }
    const why = missCause(r);
    const entry = causes.get(why) ?? { cause: why, count: 0, examples: [] };
    entry.count++;
    if (entry.examples.length < EXAMPLES) entry.examples.push(r.req_id);
    causes.set(why, entry);
  }

  report(): LogsReport {
    const outcomes: Record<string, number> = {};
    // Fixed order for the known outcomes, then anything unexpected in the order seen.
    for (const o of [...OUTCOMES, ...this.outcomes.keys()]) {
      const n = this.outcomes.get(o);
      if (n !== undefined) outcomes[o] = n;
    }
    const sla: LogsReport['sla'] = {};
    for (const [cls, s] of this.sla) sla[cls] = { ...s, attainment: s.judged > 0 ? s.met / s.judged : null };
    const misses: LogsReport['misses'] = {};
    for (const [cls, causes] of this.misses) {
      misses[cls] = [...causes.values()].sort((a, b) => b.count - a.count);
    }
    return {
      requests: this.requests,
      skipped_lines: this.skipped,
      outcomes,
      reasons: [...this.reasons.values()].sort((a, b) => b.count - a.count),
      by_class: reportGroups(this.classes),
      by_backend: reportGroups(this.backends),
      sla,
      misses,
    };
  }
}

function groupOf(groups: Map<string, Group>, name: string): Group {
  let g = groups.get(name);
  if (g === undefined) {
    g = new Group();
    groups.set(name, g);
  }
  return g;
}

function reportGroups(groups: Map<string, Group>): Record<string, GroupReport> {
  const out: Record<string, GroupReport> = {};
  for (const name of [...groups.keys()].sort()) out[name] = groups.get(name)!.report();
  return out;
}

/** Why a judged request missed its SLA, in the first terms an operator would check. */
export function missCause(r: LogRecord): string {
  if (r.outcome !== 'ok') return `failed: ${r.outcome} (${r.reason})`;
  const ttftTarget = r.ttft_target_ms ?? Number.POSITIVE_INFINITY;
  if (r.ttft_ms === null) return 'no TTFT recorded';
  if (r.ttft_ms > ttftTarget) {
    const queue = r.queue_ms ?? 0;
    if (queue >= QUEUE_SHARE * r.ttft_ms) return 'TTFT over target: queued too long (queue >= half of TTFT)';
    if (r.predicted_ttft_ms !== null && r.predicted_ttft_ms <= ttftTarget) {
      return 'TTFT over target: prefill slower than predicted';
    }
    return 'TTFT over target: prefill slow (predicted over target too)';
  }
  if (r.tpot_ms === null) return 'TPOT missing with more than one output token';
  return 'TPOT over target: decode slow';
}

/** Percentiles by linear interpolation between closest ranks (numpy's default, as vLLM's bench). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = sorted[lo]!;
  return a + (sorted[hi]! - a) * (rank - lo);
}

function percentiles(values: number[]): Percentiles {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p90: percentile(sorted, 90), p99: percentile(sorted, 99) };
}

// ---- text report --------------------------------------------------------------------------------

function formatReport(rep: LogsReport): string {
  const out: string[] = [];
  const skipped = rep.skipped_lines > 0 ? ` (${rep.skipped_lines} other lines skipped)` : '';
  out.push(`admission log: ${rep.requests} requests${skipped}`);
  if (rep.requests === 0) return `${out.join('\n')}\n`;
  const share = (n: number) => `${((100 * n) / rep.requests).toFixed(1)}%`;

  out.push('', 'Outcomes');
  for (const [o, n] of Object.entries(rep.outcomes)) {
    out.push(`  ${o.padEnd(22)} ${String(n).padStart(8)}  ${share(n).padStart(6)}`);
  }
  out.push('', 'Decisions and reasons');
  for (const r of rep.reasons) {
    out.push(
      `  ${r.decision.padEnd(9)} ${r.reason.padEnd(22)} ${String(r.count).padStart(8)}  ${share(r.count).padStart(6)}`,
    );
  }
  out.push(...latencyTable('Latency per class', rep.by_class));
  out.push(...latencyTable('Latency per backend', rep.by_backend));

  out.push('', 'SLA attainment per class (both TTFT and TPOT targets met; refused and cancelled not judged)');
  for (const [cls, s] of Object.entries(rep.sla)) {
    const att = s.attainment === null ? '-' : `${(100 * s.attainment).toFixed(1)}%`;
    const targets = `targets ttft ${s.ttft_target_ms ?? '-'}ms tpot ${s.tpot_target_ms ?? '-'}ms`;
    out.push(`  ${cls.padEnd(14)} ${att.padStart(6)}  ${s.met}/${s.judged} met  ${targets}`);
  }
  out.push('', 'SLA misses explained');
  const missed = Object.entries(rep.misses);
  if (missed.length === 0) out.push('  none');
  for (const [cls, causes] of missed) {
    const total = causes.reduce((sum, c) => sum + c.count, 0);
    out.push(`  ${cls}: ${total} missed`);
    for (const c of causes) {
      out.push(`    ${String(c.count).padStart(6)}  ${c.cause}  e.g. ${c.examples.join(', ')}`);
    }
  }
  return `${out.join('\n')}\n`;
}

function latencyTable(title: string, groups: Record<string, GroupReport>): string[] {
  const names = Object.keys(groups);
  if (names.length === 0) return [];
  const cols = ['ttft', 'tpot', 'e2e', 'queue'];
  const lines = ['', `${title} (ms, p50 / p90 / p99)`];
  lines.push(
    `  ${'name'.padEnd(14)} ${'n'.padStart(7)}  ${cols.map((c) => c.padEnd(24)).join(' ')}`.trimEnd(),
  );
  for (const name of names) {
    const g = groups[name]!;
    const cells = METRICS.map((m) => {
      const p = g[m];
      return (p === null ? '-' : `${num(p.p50)} / ${num(p.p90)} / ${num(p.p99)}`).padEnd(24);
    });
    lines.push(`  ${name.padEnd(14)} ${String(g.n).padStart(7)}  ${cells.join(' ')}`.trimEnd());
  }
  return lines;
}
