// `slagate bench`: parse flags, run, print vLLM's table on stdout, save the JSON.
// Exit codes: 0 when at least one request succeeded, 1 when none did, the run could not
// start or an output file could not be written, 2 on bad flags. `slagate bench compare …` is its own subcommand (compareCommand below).
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { parseArgs } from 'node:util';
import type { EndpointKind } from '../bench/client.ts';
import {
  type CompareOptions,
  type CompareResult,
  type FleetGroup,
  fleetWords,
  parseFleet,
  runCompare,
} from '../bench/compare.ts';
import { parsePolicies, readGatewayYaml } from '../bench/compare-config.ts';
import { rateText, runFigures } from '../bench/compare-report.ts';
import { htmlReport } from '../bench/html-report.ts';
import { METRIC_NAMES, type MetricName, type Slo } from '../bench/metrics.ts';
import { pyFloat } from '../bench/report.ts';
import {
  type BenchOptions,
  type BenchResult,
  checkOptions,
  DEFAULT_METRICS,
  runBench,
} from '../bench/run.ts';
import { WORKLOAD_NAMES, type WorkloadName } from '../bench/workloads.ts';
import { getProfile } from '../sim/profiles.ts';
import { appendProblem } from '../telemetry/logger.ts';
import { emptyOption } from './options.ts';

export const BENCH_USAGE = `Usage: slagate bench --target URL [options]
       slagate bench compare --policies LIST [options]   (see slagate bench compare --help)

Open-loop load generator with vLLM's benchmark metrics (see docs/benchmark-tool.md).

  --target URL              base URL of the server or gateway, e.g. http://127.0.0.1:8080
  --endpoint chat|completions   /v1/chat/completions (default) or /v1/completions
  --model NAME              model to ask for (default: first id of GET /v1/models)
  --workload NAME           sharegpt (default) | prefix-shared | mixed | code
  --requests N              number of requests (default 1000; unbounded with --duration)
  --duration S              stop sending after S seconds (in-flight requests finish)
  --rate R                  requests per second, or inf (default inf: all at t=0)
  --burstiness B            gamma shape of arrival gaps; 1 = Poisson (default 1)
  --concurrency C           at most C requests in flight (vLLM's --max-concurrency)
  --seed S                  seed for the workload and the arrivals (default 0)
  --slo ttft=MS,tpot=MS[,e2el=MS]   targets for goodput (a request is good when all hold)
  --percentiles LIST        percentiles to report, e.g. 50,90,99 (default 99)
  --percentile-metrics LIST which of ttft,tpot,itl,e2el to report (default all four)
  --header K:V              extra request header, repeatable (e.g. "Authorization: Bearer k")
  --class-hints             send each request's workload class as x-slagate-class
  --no-session-id           do not send conversation ids as x-session-id
  --label NAME              label stored in the JSON
  --save-result FILE        write the result JSON (vLLM's keys) to FILE
  --report FILE.html        write a self-contained HTML page with charts of the run
  --save-detailed           include per-request arrays in the JSON
  --timeout S               per-request wait limit for headers / between chunks (default 21600)
  -h, --help                this text
`;

class UsageError extends Error {}

function num(flag: string, raw: string | undefined, integer = false): number | undefined {
  if (raw === undefined) return undefined;
  const v = raw === 'inf' ? Number.POSITIVE_INFINITY : Number(raw);
  if (Number.isNaN(v) || raw.trim() === '' || (integer && !Number.isInteger(v))) {
    throw new UsageError(`${flag} expects ${integer ? 'a whole number' : 'a number'}, got "${raw}"`);
  }
  return v;
}

/** "ttft=500,tpot=50" (vLLM's "ttft:500" form is accepted too), values in ms. */
export function parseSlo(raw: string): Slo {
  const slo: Slo = {};
  for (const part of raw.split(',')) {
    const m = /^\s*(ttft|tpot|e2el)\s*[=:]\s*([0-9.]+)\s*$/.exec(part);
    if (!m) throw new UsageError(`--slo: bad entry "${part}" (want ttft=MS, tpot=MS or e2el=MS)`);
    const value = Number(m[2]);
    if (!(value >= 0)) throw new UsageError(`--slo: bad value in "${part}"`);
    slo[m[1] as keyof Slo] = value;
  }
  return slo;
}

export function parseHeaders(raw: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of raw) {
    const colon = h.indexOf(':');
    if (colon <= 0) throw new UsageError(`--header expects K:V, got "${h}"`);
    out[h.slice(0, colon).trim().toLowerCase()] = h.slice(colon + 1).trim();
  }
  return out;
}

function list<T extends string>(flag: string, raw: string, allowed: readonly T[]): T[] {
  const items = raw.split(',').map((s) => s.trim());
  for (const item of items) {
    if (!allowed.includes(item as T))
      throw new UsageError(`${flag}: unknown "${item}" (${allowed.join(', ')})`);
  }
  return items as T[];
}

export interface BenchArgs {
  options: BenchOptions;
  saveResult?: string;
  /** --report FILE.html */
  report?: string;
}

/** The run described by command-line flags; null means --help. */
export function parseBenchArgs(argv: string[]): BenchArgs | null {
  let values: ReturnType<typeof parse>['values'];
  try {
    values = parse(argv).values;
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  if (values.help) return null;
  if (values.target === undefined) throw new UsageError('--target URL is required');
  // Every request would ask for model "", and the JSON would carry a label that says nothing.
  const empty = emptyOption(values, ['model', 'label']);
  if (empty !== undefined) throw new UsageError(`--${empty} must not be empty`);
  let target: URL;
  try {
    target = new URL(values.target);
  } catch {
    throw new UsageError(`--target is not a URL: "${values.target}"`);
  }
  // `localhost:8080` parses, as a URL of scheme `localhost:`: refused here, as a bad flag.
  if (target.protocol !== 'http:' && target.protocol !== 'https:') {
    throw new UsageError(
      `--target must be an http:// or https:// URL, got "${values.target}" (did you mean http://${values.target}?)`,
    );
  }
  const endpoint = values.endpoint ?? 'chat';
  if (endpoint !== 'chat' && endpoint !== 'completions') {
    throw new UsageError(`--endpoint must be chat or completions, got "${endpoint}"`);
  }
  const workload = values.workload ?? 'sharegpt';
  if (!WORKLOAD_NAMES.includes(workload as WorkloadName)) {
    throw new UsageError(`--workload must be one of ${WORKLOAD_NAMES.join(', ')}, got "${workload}"`);
  }
  const percentiles =
    values.percentiles === undefined
      ? undefined
      : values.percentiles.split(',').map((p) => num('--percentiles', p.trim()) as number);
  const metrics: MetricName[] =
    values['percentile-metrics'] === undefined
      ? [...DEFAULT_METRICS]
      : list('--percentile-metrics', values['percentile-metrics'], METRIC_NAMES);
  const timeout = num('--timeout', values.timeout);
  const opts: BenchOptions = {
    target: values.target,
    endpoint: endpoint as EndpointKind,
    workload: workload as WorkloadName,
    metrics,
    headers: parseHeaders(values.header ?? []),
    classHints: values['class-hints'] ?? false,
    sessionIds: !(values['no-session-id'] ?? false),
    detailed: values['save-detailed'] ?? false,
  };
  const optional: Partial<BenchOptions> = {
    model: values.model,
    requests: num('--requests', values.requests, true),
    durationS: num('--duration', values.duration),
    rate: num('--rate', values.rate),
    burstiness: num('--burstiness', values.burstiness),
    concurrency: num('--concurrency', values.concurrency, true),
    seed: num('--seed', values.seed, true),
    slo: values.slo === undefined ? undefined : parseSlo(values.slo),
    percentiles,
    label: values.label,
    timeoutMs: timeout === undefined ? undefined : timeout * 1000,
  };
  for (const [k, v] of Object.entries(optional)) {
    if (v !== undefined) (opts as unknown as Record<string, unknown>)[k] = v;
  }
  try {
    checkOptions(opts);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const saveResult = values['save-result'];
  const report = values.report;
  checkOutputs(saveResult, report);
  return {
    options: opts,
    ...(saveResult === undefined ? {} : { saveResult }),
    ...(report === undefined ? {} : { report }),
  };
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv,
    strict: true,
    allowPositionals: false,
    options: {
      target: { type: 'string' },
      endpoint: { type: 'string' },
      model: { type: 'string' },
      workload: { type: 'string' },
      requests: { type: 'string' },
      duration: { type: 'string' },
      rate: { type: 'string' },
      burstiness: { type: 'string' },
      concurrency: { type: 'string' },
      seed: { type: 'string' },
      slo: { type: 'string' },
      percentiles: { type: 'string' },
      'percentile-metrics': { type: 'string' },
      header: { type: 'string', multiple: true },
      'class-hints': { type: 'boolean' },
      'no-session-id': { type: 'boolean' },
      label: { type: 'string' },
      'save-result': { type: 'string' },
      report: { type: 'string' },
      'save-detailed': { type: 'boolean' },
      timeout: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

export async function benchCommand(argv: string[]): Promise<number> {
  if (argv[0] === 'compare') return compareCommand(argv.slice(1));
  let args: BenchArgs | null;
  try {
    args = parseBenchArgs(argv);
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    // One line and a pointer: the whole usage would scroll the error away.
    process.stderr.write(`slagate bench: ${err.message}\nsee: slagate bench --help\n`);
    return 2;
  }
  if (args === null) {
    process.stdout.write(BENCH_USAGE);
    return 0;
  }
  const { options: opts, saveResult: saveTo, report } = args;

  const rate = opts.rate ?? Number.POSITIVE_INFINITY;
  const burstiness = opts.burstiness ?? 1;
  process.stdout.write(
    `Traffic request rate: ${pyFloat(rate)}\n` +
      `Burstiness factor: ${pyFloat(burstiness)} (${burstiness === 1 ? 'Poisson process' : 'Gamma distribution'})\n` +
      `Maximum request concurrency: ${opts.concurrency ?? 'None'}\n`,
  );

  // Ctrl-C stops sending and cancels what is in flight; the partial result is still reported.
  const abort = new AbortController();
  const onSigint = () => abort.abort();
  process.once('SIGINT', onSigint);
  try {
    const result = await runBench({ ...opts, signal: abort.signal });
    const failures = result.records.filter((r) => !r.success);
    if (failures.length > 0) {
      process.stderr.write('Failed requests during benchmark run detected (capping to 10):\n');
      failures.slice(0, 10).forEach((r, i) => {
        process.stderr.write(`Error ${i}: ${r.error}\n`);
      });
    }
    process.stdout.write(result.table);
    const written = await writeOutputs('slagate bench', false, [
      { path: saveTo, what: 'Result saved', text: () => `${JSON.stringify(result.json)}\n` },
      { path: report, what: 'Report written', text: () => benchReport(opts, result) },
    ]);
    return written && result.metrics.completed > 0 ? 0 : 1;
  } catch (err) {
    process.stderr.write(`slagate bench: ${(err as Error).message}\n`);
    return 1;
  } finally {
    process.off('SIGINT', onSigint);
  }
}

export const COMPARE_USAGE = `Usage: slagate bench compare --policies LIST [options]

Runs the same workload, seed and arrival schedule against each gateway policy. Every run (one
per policy and rate) gets a fresh simulated fleet and a fresh gateway, each a child process, and
stops both before the next run. Prints one table (see docs/benchmark-tool.md).

  --policies LIST           comma-separated ROUTER[/SCHEDULER] items, e.g. round_robin,least_loaded/fcfs
                            ROUTER: slagate, round_robin, least_loaded, prefix_only, cache_aware, oracle
                            SCHEDULER: slagate (default) or fcfs
  --workload NAME           sharegpt (default) | prefix-shared | mixed | code
  --rate R                  requests per second, or inf (default inf: all at t=0)
  --rates R1,R2,...         a sweep: one run per policy and rate, plus each policy's goodput rate
  --requests N              requests per run (default 1000)
  --duration S              instead of --requests: stop sending after S seconds in each run
  --burstiness B            gamma shape of arrival gaps; 1 = Poisson (default 1)
  --seed S                  seed for the workload, the arrivals and the fleet (default 0)
  --slo ttft=MS,tpot=MS     targets for goodput, attainment and the goodput rate
  --replicas N              simulated replicas per run (default 4)
  --profile NAME            GPU profile of the replicas (default llama3-8b-h100)
  --fleet NAME:N,...        a mixed fleet instead: N replicas of each profile, one model for all,
                            e.g. llama3-8b-h100:2,llama3-8b-a100:2
  --time-scale X            wall time per simulated time; 0.1 runs ten times faster (default 1)
  --gateway-yaml FILE       gateway YAML merged into each generated config (its keys win, except
                            server, models, backends and the two policies)
  --class-hints             send each request's workload class as x-slagate-class
  --save-result FILE        write the comparison JSON (each run's bench JSON inside) to FILE
  --report FILE.html        write a self-contained HTML page with charts per policy and across rates
  --quiet                   no progress lines on stderr
  -h, --help                this text
`;

export interface CompareArgs {
  options: CompareOptions;
  saveResult?: string;
  /** --report FILE.html */
  report?: string;
  quiet: boolean;
}

function parseRates(raw: string): number[] {
  const rates = raw.split(',').map((r) => num('--rates', r.trim()) as number);
  if (new Set(rates).size !== rates.length) throw new UsageError(`--rates lists a rate twice: "${raw}"`);
  return rates;
}

/** The comparison described by command-line flags; null means --help. Throws UsageError. */
export function parseCompareArgs(argv: string[]): CompareArgs | null {
  let values: ReturnType<typeof parseCompare>['values'];
  try {
    values = parseCompare(argv).values;
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  if (values.help) return null;
  if (values.policies === undefined) throw new UsageError('--policies LIST is required');
  if (values.rate !== undefined && values.rates !== undefined) {
    throw new UsageError('give --rate or --rates, not both');
  }
  if (values.requests !== undefined && values.duration !== undefined) {
    throw new UsageError('give --requests or --duration, not both');
  }
  const workload = values.workload ?? 'sharegpt';
  if (!WORKLOAD_NAMES.includes(workload as WorkloadName)) {
    throw new UsageError(`--workload must be one of ${WORKLOAD_NAMES.join(', ')}, got "${workload}"`);
  }
  const replicas = num('--replicas', values.replicas, true);
  if (replicas !== undefined && replicas < 1) throw new UsageError(`--replicas must be ≥ 1, got ${replicas}`);
  const timeScale = num('--time-scale', values['time-scale']);
  if (timeScale !== undefined && !(timeScale > 0 && Number.isFinite(timeScale))) {
    throw new UsageError(`--time-scale must be a positive number, got ${timeScale}`);
  }
  if (values.profile !== undefined) {
    try {
      getProfile(values.profile);
    } catch (err) {
      throw new UsageError(`--profile: ${(err as Error).message}`);
    }
  }
  if (values.fleet !== undefined && (values.replicas !== undefined || values.profile !== undefined)) {
    throw new UsageError('give --fleet, or --replicas and --profile, not both');
  }
  let fleet: FleetGroup[] | undefined;
  try {
    fleet = values.fleet === undefined ? undefined : parseFleet(values.fleet);
  } catch (err) {
    throw new UsageError(`--fleet: ${(err as Error).message}`);
  }
  let policies: ReturnType<typeof parsePolicies>;
  try {
    policies = parsePolicies(values.policies);
  } catch (err) {
    throw new UsageError(`--policies: ${(err as Error).message}`);
  }
  const rates =
    values.rates !== undefined
      ? parseRates(values.rates)
      : values.rate !== undefined
        ? [num('--rate', values.rate) as number]
        : undefined;
  const opts: CompareOptions = {
    policies,
    workload: workload as WorkloadName,
    classHints: values['class-hints'] ?? false,
  };
  const optional: Partial<CompareOptions> = {
    rates,
    requests: num('--requests', values.requests, true),
    durationS: num('--duration', values.duration),
    burstiness: num('--burstiness', values.burstiness),
    seed: num('--seed', values.seed, true),
    slo: values.slo === undefined ? undefined : parseSlo(values.slo),
    replicas,
    profile: values.profile,
    fleet,
    timeScale,
    gatewayYaml: values['gateway-yaml'],
  };
  for (const [k, v] of Object.entries(optional)) {
    if (v !== undefined) (opts as unknown as Record<string, unknown>)[k] = v;
  }
  // Each run of a comparison is open-loop at a rate (no --concurrency here): a duration bounds
  // the sending only at a finite one, which the bench's own message would not say in compare's terms.
  if (
    opts.durationS !== undefined &&
    (opts.rates ?? [Number.POSITIVE_INFINITY]).some((r) => r === Number.POSITIVE_INFINITY)
  ) {
    throw new UsageError('--duration needs a finite --rate or --rates');
  }
  // The bench options every run will use, checked once per rate before anything starts.
  try {
    for (const rate of opts.rates ?? [Number.POSITIVE_INFINITY]) {
      checkOptions({
        target: 'http://127.0.0.1',
        rate,
        ...(opts.requests !== undefined ? { requests: opts.requests } : {}),
        ...(opts.durationS !== undefined ? { durationS: opts.durationS } : {}),
        ...(opts.burstiness !== undefined ? { burstiness: opts.burstiness } : {}),
      });
    }
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const quiet = values.quiet ?? false;
  const saveResult = values['save-result'];
  const report = values.report;
  checkOutputs(saveResult, report);
  return {
    options: opts,
    quiet,
    ...(saveResult === undefined ? {} : { saveResult }),
    ...(report === undefined ? {} : { report }),
  };
}

function parseCompare(argv: string[]) {
  return parseArgs({
    args: argv,
    strict: true,
    allowPositionals: false,
    options: {
      policies: { type: 'string' },
      workload: { type: 'string' },
      rate: { type: 'string' },
      rates: { type: 'string' },
      requests: { type: 'string' },
      duration: { type: 'string' },
      burstiness: { type: 'string' },
      seed: { type: 'string' },
      slo: { type: 'string' },
      replicas: { type: 'string' },
      profile: { type: 'string' },
      fleet: { type: 'string' },
      'time-scale': { type: 'string' },
      'gateway-yaml': { type: 'string' },
      'class-hints': { type: 'boolean' },
      'save-result': { type: 'string' },
      report: { type: 'string' },
      quiet: { type: 'boolean', short: 'q' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

/**
 * `slagate bench compare`: the table on stdout and nothing else; progress and errors on stderr.
 * Exit codes: 0 when every run completed, 1 when a run could not start (or was interrupted),
 * 2 on bad flags (one line and a pointer to --help, not the whole usage).
 */
export async function compareCommand(argv: string[]): Promise<number> {
  const usageError = (message: string) => {
    process.stderr.write(`slagate bench compare: ${message}\nsee: slagate bench compare --help\n`);
    return 2;
  };
  let args: CompareArgs | null;
  try {
    args = parseCompareArgs(argv);
    if (args?.options.gatewayYaml !== undefined) {
      try {
        await readGatewayYaml(args.options.gatewayYaml);
      } catch (err) {
        throw new UsageError(`--gateway-yaml: ${(err as Error).message.split('\n')[0]}`);
      }
    }
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    return usageError(err.message);
  }
  if (args === null) {
    process.stdout.write(COMPARE_USAGE);
    return 0;
  }
  const { options, saveResult, report, quiet } = args;
  // Ctrl-C stops the current run and skips the rest; its processes are still stopped.
  const abort = new AbortController();
  const onSigint = () => abort.abort();
  process.once('SIGINT', onSigint);
  try {
    const result = await runCompare({
      ...options,
      signal: abort.signal,
      // On a terminal only: piped, long work stays quiet (the failures below are always said).
      progress: !quiet && process.stderr.isTTY === true,
      ...(quiet || process.stderr.isTTY !== true
        ? {}
        : { onProgress: (line: string) => process.stderr.write(`${line}\n`) }),
    });
    for (const run of result.runs) {
      if (run.error !== null) {
        process.stderr.write(
          `slagate bench compare: ${run.policy} at rate ${rateText(run.rate)}: ${run.error}\n`,
        );
      }
    }
    process.stdout.write(result.table);
    const written = await writeOutputs('slagate bench compare', quiet, [
      { path: saveResult, what: 'Result saved', text: () => `${JSON.stringify(result.json)}\n` },
      { path: report, what: 'Report written', text: () => compareReport(result) },
    ]);
    return written && result.ok ? 0 : 1;
  } catch (err) {
    process.stderr.write(`slagate bench compare: ${(err as Error).message}\n`);
    return 1;
  } finally {
    process.off('SIGINT', onSigint);
  }
}

/** The HTML page of one bench run: the target is its one "policy". */
function benchReport(opts: BenchOptions, result: BenchResult): string {
  const backends = new Set(
    result.records.map((r) => r.headers['x-slagate-backend']).filter((b) => b !== undefined),
  );
  const figures = runFigures(result.records, result.metrics, Math.max(1, backends.size), opts.slo, null);
  const rate = opts.rate ?? Number.POSITIVE_INFINITY;
  return htmlReport({
    title: `slagate bench: ${opts.target}`,
    subtitle: `workload ${typeof opts.workload === 'object' ? opts.workload.name : (opts.workload ?? 'sharegpt')}, rate ${rateText(rate)}, ${result.records.length} requests, seed ${opts.seed ?? 0}`,
    slo: opts.slo ?? null,
    runs: [
      {
        policy: opts.target,
        rate,
        records: result.records,
        figures,
        throughput: result.metrics.requestThroughput,
        error: null,
      },
    ],
  });
}

/** The HTML page of a comparison: every run, by policy and rate. */
function compareReport(result: CompareResult): string {
  const f = result.fleet;
  return htmlReport({
    title: `slagate bench compare: ${result.workload}`,
    subtitle: `${result.date}; workload ${result.workload}, seed ${result.seed}, rates ${result.rates.map(rateText).join(', ')}; fleet ${fleetWords(f.groups)} at time scale ${f.timeScale}`,
    slo: result.slo,
    runs: result.runs.map((r) => ({
      policy: r.policy,
      rate: r.rate,
      records: r.bench?.records ?? null,
      figures: r.figures,
      throughput: r.bench?.metrics.requestThroughput ?? null,
      error: r.error,
    })),
  });
}

/**
 * The output files are checked before the run: a run of many minutes must not end by failing to
 * write its results. A missing directory is created when they are written.
 */
function checkOutputs(saveResult: string | undefined, report: string | undefined): void {
  for (const [flag, path] of [
    ['--save-result', saveResult],
    ['--report', report],
  ] as const) {
    if (path === undefined) continue;
    const problem = appendProblem(path);
    if (problem !== null) throw new UsageError(`${flag} ${path}: cannot be written (${problem})`);
  }
}

/** Writes each output that was asked for; one that fails does not keep the others from being written. */
async function writeOutputs(
  command: string,
  quiet: boolean,
  outputs: readonly { path: string | undefined; what: string; text: () => string }[],
): Promise<boolean> {
  let ok = true;
  for (const { path, what, text } of outputs) {
    if (path === undefined) continue;
    try {
      await mkdir(dirname(path), { recursive: true });
      await writeFile(path, text());
      if (!quiet) process.stderr.write(`${what} to ${path}\n`);
    } catch (err) {
      process.stderr.write(`${command}: ${(err as Error).message}\n`);
      ok = false;
    }
  }
  return ok;
}
