import { once } from 'node:events';
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { PassThrough, type Readable } from 'node:stream';
import { parseArgs } from 'node:util';
import { createGunzip, constants as zlibConstants } from 'node:zlib';
import type { AdmissionRecord } from '../telemetry/admission-log.ts';
import { OUTCOMES } from '../telemetry/outcome.ts';
import { QuantileSketch } from './quantile-sketch.ts';

// `slagate logs [FILE...]`: reads admission logs (files in the order given, or stdin; each
// gzip-compressed, as logrotate leaves old ones, or not) and explains them. Lines that are not
// admission records (other log lines, partial writes, anything not JSON) are skipped and counted. A
// compressed file cut short (still being written, or copied in part) gives the lines before the
// cut.

const USAGE = `usage: slagate logs [FILE...|-] [--pretty] [--json] [--since T] [--class C] [--tenant T]
  Reads admission-log lines from each FILE in turn (a rotated set: app.log.2.gz app.log.1 app.log),
  or from stdin when there is none or for -. Give rotated files as arguments, not concatenated:
  a file's compression is told from its first bytes.
  default        summary: outcomes, decisions and reasons, latency percentiles per class and
                 backend, SLA attainment per class and target set, SLA misses explained, the
                 slowest requests
  --pretty       one human line per request, printed as lines arrive
  --json         the summary as JSON
  --since T      only records from T on: an ISO time (2026-12-01T10:00:00Z; one without a zone
                 is UTC, as --pretty prints times) or an age (90s, 15m, 2h)
  --class C      only requests of class C
  --tenant T     only requests of tenant T
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
  const files = args.positionals.length === 0 ? ['-'] : args.positionals;
  if (files.filter((f) => f === '-').length > 1) {
    io.stderr.write(USAGE);
    return 2;
  }
  // Waiting on a terminal for a log typed in is rarely what was meant: said, and then waited for.
  if (files.includes('-') && (io.stdin as { isTTY?: boolean }).isTTY === true)
    io.stderr.write(
      'slagate logs: reading an admission log from stdin, a terminal (Ctrl-D ends it); give the log FILE, or pipe the log in: slagate serve | slagate logs --pretty\n',
    );
  let keep: (r: LogRecord) => boolean;
  try {
    keep = recordFilter(args.values, Date.now());
  } catch (err) {
    io.stderr.write(`slagate logs: ${(err as Error).message}\n`);
    return 2;
  }
  // A reader that goes away (`slagate logs --pretty | head`, or the summary's reader) ends the
  // command quietly: the handler stays until the report is written. Any other output error (a
  // full disk) ends it too, said on stderr, with exit status 1 (`ended`).
  let readerGone = false;
  let outputError: NodeJS.ErrnoException | null = null;
  let reading: { raw: Readable; lines: ReturnType<typeof createInterface> } | null = null;
  const onOutputError = (err: NodeJS.ErrnoException) => {
    outputError ??= err;
    readerGone = true;
    reading?.lines.close();
    // The input too: piped into the gunzip check, it would flow on (a `tail -f` never ends).
    reading?.raw.destroy();
  };
  io.stdout.on('error', onOutputError);
  const summary = new Summary();
  let unreadable = false;
  /** The exit status: 1 when some input could not be read or the output failed (not its reader gone). */
  const ended = (): number => {
    if (outputError !== null && outputError.code !== 'EPIPE') {
      io.stderr.write(`slagate logs: ${outputError.message}\n`);
      return 1;
    }
    return unreadable ? 1 : 0;
  };
  try {
    for (const file of files) {
      if (readerGone) break;
      const raw = (file === '-' ? io.stdin : createReadStream(file)) as Readable;
      const input = maybeGunzip(raw, (err) => {
        unreadable = true;
        const name = file === '-' ? 'stdin' : file;
        io.stderr.write(
          (err as NodeJS.ErrnoException).code === 'Z_BUF_ERROR'
            ? `slagate logs: ${name}: compressed data cut short (${err.message}); read what came before the cut\n`
            : `slagate logs: ${name}: compressed data unreadable from here on (${err.message}); read what came before it\n`,
        );
      });
      const lines = createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY });
      reading = { raw, lines };
      let first = true;
      try {
        for await (const text of lines) {
          // A byte-order mark (a file saved by an editor) is not part of the first line's JSON.
          const line = first && text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
          first = false;
          const record = parseAdmissionLine(line);
          if (record === null) {
            if (line.trim() !== '') summary.skipped++;
            continue;
          }
          if (!keep(record)) continue;
          if (!args.values.pretty) summary.add(record);
          else if (!io.stdout.write(`${prettyLine(record)}\n`)) await once(io.stdout, 'drain');
        }
      } catch (err) {
        // One file that cannot be opened or read (logrotate deleted the oldest of a rotated set,
        // a directory, no permission) is reported and skipped: the others are still read, and the
        // report is of what could be.
        // The output failing (its reader gone, a full disk) is not this input's: handled below.
        if (readerGone || (err as NodeJS.ErrnoException).code === 'EPIPE') throw err;
        unreadable = true;
        io.stderr.write(`slagate logs: ${file === '-' ? 'stdin' : file}: ${(err as Error).message}\n`);
        raw.destroy();
      }
    }
    // Exit status 1 when some input could not be read (its report is of what could): a script
    // can tell a damaged file from a whole one.
    if (args.values.pretty || readerGone) return ended();
    const report = summary.report();
    // The summary's lines quote records' strings (classes, tenants, backends, request ids, reasons):
    // each is made visible as --pretty's lines are, so that no log another tool wrote can hide text.
    const out = args.values.json
      ? `${JSON.stringify(report, null, 2)}\n`
      : formatReport(visibleDeep(report) as LogsReport);
    // Written whole before the handler goes: a reader that left meanwhile (EPIPE) ends it quietly.
    // The write's callback comes once it is done or has failed, on a stream already gone too.
    await new Promise<void>((resolve) =>
      io.stdout.write(out, (err) => {
        if (err) outputError ??= err;
        resolve();
      }),
    );
    return ended();
  } catch (err) {
    // The output's own error, met while waiting for it to drain: said once, by ended().
    if (outputError !== null) return ended();
    if ((err as NodeJS.ErrnoException).code === 'EPIPE') return 0;
    io.stderr.write(`slagate logs: ${(err as Error).message}\n`);
    return 1;
  } finally {
    io.stdout.off('error', onOutputError);
  }
}

/**
 * `input` as text: through gunzip when its first bytes are gzip's magic (1f 8b), as logrotate
 * leaves old logs; as it is otherwise. A read error of the input reaches the reader. Compressed
 * data cut short gives what came before the cut, and the cut is told to `onCut` (a file copied in
 * part, or a disk that filled, is not read as a whole one). Compressed data followed by bytes that
 * are not gzip ends the text there, told to `onCut`; what zlib inflated from the same chunk of
 * input as those bytes is lost with it.
 *
 * Invariant: the end of the input is a sync flush, then the finishing flush. zlib's finishing
 * flush is what finds compressed data cut short; given to the last chunk of input (as a stream
 * that ends while that chunk waits has it), its error drops all that chunk inflated. After a sync
 * flush every byte zlib can inflate has been handed on, and the finishing flush has no input.
 */
function maybeGunzip(input: Readable, onCut: (err: Error) => void): Readable {
  const out = new PassThrough();
  let decided = false;
  // The first bytes, until there are two to compare (a pipe may deliver one alone).
  let head: Buffer[] = [];
  let headBytes = 0;
  const decide = (ended: boolean) => {
    decided = true;
    input.off('data', onData);
    const first = Buffer.concat(head);
    head = [];
    const gz = first.length >= 2 && first[0] === 0x1f && first[1] === 0x8b;
    if (!gz) {
      if (first.length > 0) out.write(first);
      if (ended) out.end();
      else input.pipe(out);
      return;
    }
    const gunzip = createGunzip();
    gunzip.pipe(out);
    gunzip.on('error', (err) => {
      input.unpipe(gunzip);
      input.destroy();
      onCut(err);
      out.end();
    });
    gunzip.write(first);
    const finish = () => gunzip.flush(zlibConstants.Z_SYNC_FLUSH, () => gunzip.end());
    if (ended) finish();
    else {
      input.pipe(gunzip, { end: false });
      input.once('end', finish);
    }
  };
  const onData = (chunk: Buffer | string) => {
    if (decided) return;
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    head.push(b);
    headBytes += b.length;
    if (headBytes < 2) return;
    input.pause();
    decide(false);
  };
  input.on('data', onData);
  input.on('error', (err) => out.destroy(err));
  input.on('end', () => {
    if (!decided) decide(true);
  });
  return out;
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      pretty: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      since: { type: 'string' },
      class: { type: 'string' },
      tenant: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
}

const AGE = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)$/;
const ISO_DATE = /^\d{4}-\d{2}-\d{2}/;
const AGE_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** The records the filters keep; `now` anchors an age such as --since 15m. Throws on a bad value. */
export function recordFilter(
  opts: { since?: string | undefined; class?: string | undefined; tenant?: string | undefined },
  now: number,
): (r: LogRecord) => boolean {
  let from: number | null = null;
  if (opts.since !== undefined) {
    const age = AGE.exec(opts.since);
    // A date must be written as one: Date.parse reads a bare number as a year (`--since 45`, a unit
    // forgotten, would be 2045 and keep nothing, silently).
    if (age !== null) from = now - Number(age[1]) * AGE_MS[age[2]!]!;
    else {
      const impossible = impossibleDate(opts.since);
      if (impossible !== null) throw new Error(`--since ${opts.since}: no such ${impossible}`);
      from = ISO_DATE.test(opts.since) ? Date.parse(asUtc(opts.since)) : Number.NaN;
    }
    if (Number.isNaN(from)) throw new Error(`--since ${opts.since}: not an ISO time or an age like 15m`);
  }
  const { class: cls, tenant } = opts;
  return (r) =>
    (from === null || (typeof r.time === 'number' && r.time >= from)) &&
    // A record without a class is what the summary lists under `none` (a reserved class name).
    (cls === undefined || (r.class ?? 'none') === cls) &&
    (tenant === undefined || r.tenant === tenant);
}

/** The date and time of day as written: year, month, day, then hours, minutes, seconds if given. */
const ISO_FIELDS = /^(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2}))?)?/;

/**
 * 'date' or 'time of day' when the text names one that does not exist, else null. Date.parse rolls
 * an impossible day over (2026-02-30 is March 2) and reads 24:00 as the next day's midnight: a
 * typo would filter from a time nobody meant, silently. Checked on the text, before any zone.
 */
function impossibleDate(text: string): 'date' | 'time of day' | null {
  const m = ISO_FIELDS.exec(text);
  if (m === null) return null;
  const [year, month, day] = [Number(m[1]), Number(m[2]), Number(m[3])];
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
  if (days === undefined || day < 1 || day > days) return 'date';
  if (m[4] === undefined) return null;
  const [hours, minutes, seconds] = [Number(m[4]), Number(m[5]), Number(m[6] ?? 0)];
  return hours > 23 || minutes > 59 || seconds > 59 ? 'time of day' : null;
}

/**
 * An ISO time without a zone, taken as UTC (the times --pretty prints): Date.parse reads a date
 * and time without one as the machine's local time, and only a date alone as UTC.
 */
function asUtc(text: string): string {
  const t = text.trim().replace(' ', 'T').toUpperCase();
  if (!t.includes('T')) return t;
  if (/(?:Z|[+-]\d{2}:?\d{2})$/i.test(t)) return t;
  // An offset of hours alone (`+01`, as ISO 8601 allows) is one Date.parse does not read.
  return /[+-]\d{2}$/.test(t) ? `${t}:00` : `${t}Z`;
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
  if (typeof o.req_id !== 'string' || typeof o.outcome !== 'string' || typeof o.reason !== 'string')
    return null;
  // Every field the views read has its record's type, or the line is not a record (one line of
  // another shape in a mixed stream must not end the report); a field a line lacks reads as null.
  for (const [fields, type] of FIELD_TYPES) {
    for (const k of fields) {
      const v = o[k];
      if (v === undefined) o[k] = null;
      else if (v !== null && (typeof v !== type || (type === 'number' && !Number.isFinite(v)))) return null;
    }
  }
  if (o.decision !== null && o.decision !== 'admitted' && o.decision !== 'refused') return null;
  // A time that is no date (the pretty view prints it as one).
  if (o.time !== null && Math.abs(o.time as number) > MAX_DATE_MS) return null;
  return o as unknown as LogRecord;
}

/** The largest time from the epoch, either way, that a JavaScript Date holds (ECMA-262). */
const MAX_DATE_MS = 8.64e15;

const FIELD_TYPES: readonly (readonly [readonly string[], 'string' | 'number' | 'boolean'])[] = [
  [['tenant', 'class', 'model', 'backend', 'runner_up', 'error', 'decision'], 'string'],
  [
    [
      'time',
      'prompt_tokens_est',
      'prompt_tokens',
      'completion_tokens',
      'max_tokens',
      'prefix_blocks',
      'prefix_hit_est',
      'attempts',
      'predicted_ttft_ms',
      'runner_up_predicted_ttft_ms',
      'queue_ms',
      'ttft_ms',
      'tpot_ms',
      'e2e_ms',
      'ttft_target_ms',
      'tpot_target_ms',
    ],
    'number',
  ],
  [['stream', 'sla_met'], 'boolean'],
];

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
  return visible(parts.join(' ').trimEnd());
}

// C0 and C1 controls and DEL. A record's strings may carry a client's (the model a request named,
// its path, a backend's message that echoes them): JSON escapes them in the log, and printed raw a
// newline would forge a line of its own and an escape sequence would hide text on the terminal.
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const CONTROLS = /[\u0000-\u001f\u007f-\u009f]/g;

/** `s` with every control character written as its JSON escape, so one record is one line. */
function visible(s: string): string {
  return s.replace(CONTROLS, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** `v` with every string in it, keys included, made visible: a report whose text quotes records. */
function visibleDeep(v: unknown): unknown {
  if (typeof v === 'string') return visible(v);
  if (Array.isArray(v)) return v.map(visibleDeep);
  if (v === null || typeof v !== 'object') return v;
  const out: Record<string, unknown> = Object.create(null);
  for (const [k, x] of Object.entries(v)) out[visible(k)] = visibleDeep(x);
  return out;
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
  sla: Record<string, ClassSla>;
  /** Per class: misses of judged requests and refusals, by cause. */
  misses: Record<string, MissCause[]>;
  /** The served requests with the longest TTFT, longest first. */
  slowest: SlowRequest[];
}

export interface TargetSet {
  ttft_target_ms: number | null;
  tpot_target_ms: number | null;
  judged: number;
  met: number;
  attainment: number | null;
  /** P99 of the judged requests' TTFT and TPOT under these targets. */
  ttft_p99_ms: number | null;
  tpot_p99_ms: number | null;
}

export interface ClassSla {
  judged: number;
  met: number;
  attainment: number | null;
  /** The targets of the class's last judged record. */
  ttft_target_ms: number | null;
  tpot_target_ms: number | null;
  /** One entry per set of targets the records carry (more than one when the file spans a reload). */
  by_targets: TargetSet[];
}

export interface SlowRequest {
  req_id: string;
  class: string | null;
  tenant: string | null;
  backend: string | null;
  ttft_ms: number;
  ttft_target_ms: number | null;
  queue_ms: number | null;
  attempts: number | null;
  outcome: string;
  /** Why it missed, when it did (the same words as the misses). */
  cause: string | null;
}

const EXAMPLES = 3;
const SLOWEST = 5;
// A miss whose queue wait is at least this share of its TTFT is blamed on queueing.
const QUEUE_SHARE = 0.5;

/** A served request's TTFT: a stream cut after its first token has one, a cancel or refusal not. */
function wholeTtft(r: LogRecord): number | null {
  const firstToken = r.outcome === 'ok' || r.outcome === 'failed_after_commit';
  return firstToken && r.decision !== 'refused' ? (r.ttft_ms ?? null) : null;
}

class Group {
  n = 0;
  readonly values: Record<Metric, QuantileSketch> = {
    ttft_ms: new QuantileSketch(),
    tpot_ms: new QuantileSketch(),
    e2e_ms: new QuantileSketch(),
    queue_ms: new QuantileSketch(),
  };

  /**
   * Whole measurements only, as /metrics takes them: a cancel's queue wait was cut short, a
   * refusal's time-to-refuse is no TTFT, and a stream cut after its first token has a TTFT but
   * no whole TPOT or e2e.
   */
  add(r: LogRecord): void {
    this.n++;
    if (r.queue_ms !== null && r.outcome !== 'client_cancelled') this.values.queue_ms.add(r.queue_ms);
    const ttft = wholeTtft(r);
    if (ttft !== null) this.values.ttft_ms.add(ttft);
    if (r.outcome !== 'ok') return;
    if (r.tpot_ms !== null && r.tpot_ms !== undefined) this.values.tpot_ms.add(r.tpot_ms);
    if (r.e2e_ms !== null && r.e2e_ms !== undefined) this.values.e2e_ms.add(r.e2e_ms);
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
  private readonly sla = new Map<string, ClassSla>();
  /** Per class, per target set: the judged requests' TTFT and TPOT samples. */
  private readonly targetSamples = new Map<TargetSet, { ttft: QuantileSketch; tpot: QuantileSketch }>();
  private readonly misses = new Map<string, Map<string, MissCause>>();
  private readonly slowest: SlowRequest[] = [];

  add(r: LogRecord): void {
    this.requests++;
    this.outcomes.set(r.outcome, (this.outcomes.get(r.outcome) ?? 0) + 1);
    const decision = r.decision ?? 'none';
    const key = `${decision}\u0000${r.reason}`;
    const reason = this.reasons.get(key) ?? { decision, reason: r.reason, count: 0 };
    reason.count++;
    this.reasons.set(key, reason);
    const cls = r.class ?? 'none';
    groupOf(this.classes, cls).add(r);
    if (r.backend !== null && r.backend !== undefined) groupOf(this.backends, r.backend).add(r);
    if (r.decision === 'refused') {
      this.miss(cls, `refused: ${r.reason}`, r.req_id);
      return;
    }
    const judged = r.sla_met !== null && r.sla_met !== undefined;
    const cause = judged && !r.sla_met ? missCause(r) : null;
    this.noteSlow(r, cause);
    if (!judged) return;
    let sla = this.sla.get(cls);
    if (sla === undefined) {
      sla = {
        judged: 0,
        met: 0,
        attainment: null,
        ttft_target_ms: null,
        tpot_target_ms: null,
        by_targets: [],
      };
      this.sla.set(cls, sla);
    }
    sla.judged++;
    sla.ttft_target_ms = r.ttft_target_ms;
    sla.tpot_target_ms = r.tpot_target_ms;
    let set = sla.by_targets.find(
      (t) => t.ttft_target_ms === r.ttft_target_ms && t.tpot_target_ms === r.tpot_target_ms,
    );
    if (set === undefined) {
      set = {
        ttft_target_ms: r.ttft_target_ms,
        tpot_target_ms: r.tpot_target_ms,
        judged: 0,
        met: 0,
        attainment: null,
        ttft_p99_ms: null,
        tpot_p99_ms: null,
      };
      sla.by_targets.push(set);
      this.targetSamples.set(set, { ttft: new QuantileSketch(), tpot: new QuantileSketch() });
    }
    set.judged++;
    const samples = this.targetSamples.get(set)!;
    // The same whole measurements as the latency tables: a cancel judged late adds no sample.
    const ttft = wholeTtft(r);
    if (ttft !== null) samples.ttft.add(ttft);
    if (r.outcome === 'ok' && r.tpot_ms !== null && r.tpot_ms !== undefined) samples.tpot.add(r.tpot_ms);
    if (r.sla_met) {
      sla.met++;
      set.met++;
      return;
    }
    this.miss(cls, cause!, r.req_id);
  }

  private miss(cls: string, why: string, reqId: string): void {
    let causes = this.misses.get(cls);
    if (causes === undefined) {
      causes = new Map();
      this.misses.set(cls, causes);
    }
    const entry = causes.get(why) ?? { cause: why, count: 0, examples: [] };
    entry.count++;
    if (entry.examples.length < EXAMPLES) entry.examples.push(reqId);
    causes.set(why, entry);
  }

  /** Keeps the SLOWEST served requests by TTFT (a short sorted list: one insert per record). */
  private noteSlow(r: LogRecord, cause: string | null): void {
    // Served ones only, as the latency tables count them: a cancel's time to its first token is not.
    const ttft = wholeTtft(r);
    if (ttft === null) return;
    const list = this.slowest;
    if (list.length === SLOWEST && list[SLOWEST - 1]!.ttft_ms >= ttft) return;
    const entry: SlowRequest = {
      req_id: r.req_id,
      class: r.class ?? null,
      tenant: r.tenant ?? null,
      backend: r.backend ?? null,
      ttft_ms: ttft,
      ttft_target_ms: r.ttft_target_ms ?? null,
      queue_ms: r.queue_ms ?? null,
      attempts: r.attempts ?? null,
      outcome: r.outcome,
      cause,
    };
    const at = list.findIndex((e) => e.ttft_ms < ttft);
    if (at < 0) list.push(entry);
    else list.splice(at, 0, entry);
    if (list.length > SLOWEST) list.pop();
  }

  report(): LogsReport {
    const outcomes: Record<string, number> = {};
    // Fixed order for the known outcomes, then anything unexpected in the order seen.
    for (const o of [...OUTCOMES, ...this.outcomes.keys()]) {
      const n = this.outcomes.get(o);
      if (n !== undefined) outcomes[o] = n;
    }
    const sla: LogsReport['sla'] = {};
    const p99 = (xs: QuantileSketch) => xs.percentiles([99])[0] as number | null;
    for (const [cls, s] of this.sla) {
      const byTargets = s.by_targets.map((t) => {
        const samples = this.targetSamples.get(t)!;
        return {
          ...t,
          attainment: t.judged > 0 ? t.met / t.judged : null,
          ttft_p99_ms: p99(samples.ttft),
          tpot_p99_ms: p99(samples.tpot),
        };
      });
      sla[cls] = { ...s, attainment: s.judged > 0 ? s.met / s.judged : null, by_targets: byTargets };
    }
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
      slowest: this.slowest,
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

/**
 * Why a judged request missed its SLA, in the first terms an operator would check. A cause is only
 * named when the record holds the evidence for it: no queue wait recorded, no queueing blamed; no
 * prediction recorded, no "slower than predicted".
 */
export function missCause(r: LogRecord): string {
  if (r.outcome === 'client_cancelled') {
    const noToken = r.ttft_ms === null || r.ttft_ms === undefined;
    return noToken ? 'client left: no first token within the TTFT target' : 'client left: TTFT over target';
  }
  if (r.outcome !== 'ok') return `failed: ${r.outcome} (${r.reason})`;
  const ttftTarget = r.ttft_target_ms ?? Number.POSITIVE_INFINITY;
  if (r.ttft_ms === null) return 'no TTFT recorded';
  if (r.ttft_ms > ttftTarget) {
    if (r.attempts !== null && r.attempts !== undefined && r.attempts > 1) {
      return 'TTFT over target: retried (more than one attempt)';
    }
    // Sent where it was predicted late, on purpose: the miss was the price of a second home for its prefix.
    if (r.reason === 'seed') return 'TTFT over target: a seed (sent cold on purpose, predicted late)';
    if (r.queue_ms === null || r.queue_ms === undefined) return 'TTFT over target: no queue wait recorded';
    if (r.queue_ms >= QUEUE_SHARE * r.ttft_ms)
      return 'TTFT over target: queued too long (queue >= half of TTFT)';
    if (r.predicted_ttft_ms === null || r.predicted_ttft_ms === undefined) {
      return 'TTFT over target: slow after dispatch (no prediction recorded)';
    }
    if (r.predicted_ttft_ms <= ttftTarget) return 'TTFT over target: prefill slower than predicted';
    return 'TTFT over target: prefill slow (predicted over target too)';
  }
  if (r.tpot_ms === null) return 'TPOT missing with more than one output token';
  return 'TPOT over target: decode slow';
}

/** p50 / p90 / p99 of a series (quantile-sketch.ts: each within 0.1%), null when it has none. */
function percentiles(values: QuantileSketch): Percentiles {
  const [p50, p90, p99] = values.percentiles([50, 90, 99]);
  return p50 === null ? null : { p50: p50!, p90: p90!, p99: p99! };
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

  out.push(
    '',
    'SLA attainment per class (both TTFT and TPOT targets met; refusals not judged, nor a client that left before its target passed)',
  );
  const pct = (a: number | null) => (a === null ? '-' : `${(100 * a).toFixed(1)}%`);
  for (const [cls, s] of Object.entries(rep.sla)) {
    for (const t of s.by_targets) {
      const targets = `targets ttft ${t.ttft_target_ms ?? '-'}ms tpot ${t.tpot_target_ms ?? '-'}ms`;
      const p99 = `p99 ttft ${t.ttft_p99_ms === null ? '-' : num(t.ttft_p99_ms)} tpot ${t.tpot_p99_ms === null ? '-' : num(t.tpot_p99_ms)}`;
      out.push(
        `  ${cls.padEnd(14)} ${pct(t.attainment).padStart(6)}  ${t.met}/${t.judged} met  ${targets}  ${p99}`,
      );
    }
    if (s.by_targets.length > 1)
      out.push(`  ${cls.padEnd(14)} ${pct(s.attainment).padStart(6)}  ${s.met}/${s.judged} met  all targets`);
  }
  out.push('', 'SLA misses explained (judged requests that missed, and refusals)');
  const missed = Object.entries(rep.misses);
  if (missed.length === 0) out.push('  none');
  for (const [cls, causes] of missed) {
    const refused = causes
      .filter((c) => c.cause.startsWith('refused: '))
      .reduce((sum, c) => sum + c.count, 0);
    const total = causes.reduce((sum, c) => sum + c.count, 0) - refused;
    out.push(`  ${cls}: ${total} missed, ${refused} refused`);
    for (const c of causes) {
      out.push(`    ${String(c.count).padStart(6)}  ${c.cause}  e.g. ${c.examples.join(', ')}`);
    }
  }
  if (rep.slowest.length > 0) {
    out.push('', 'Slowest requests by TTFT');
    for (const r of rep.slowest) {
      const target = r.ttft_target_ms === null ? '' : `/${r.ttft_target_ms}ms`;
      const queue = r.queue_ms === null ? '' : `  queue ${num(r.queue_ms)}ms`;
      const why = r.cause === null ? '' : `  ${r.cause}`;
      out.push(
        `  ${r.req_id.padEnd(24)} ${(r.class ?? '-').padEnd(12)} ${(r.backend ?? '-').padEnd(10)} ttft ${num(r.ttft_ms)}${target}${queue}  attempts ${r.attempts ?? '-'}  ${r.outcome}${why}`,
      );
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
