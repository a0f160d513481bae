// `slagate check-config FILE`: exit 0 and print the effective configuration (defaults applied), or
// exit 1 and print every problem with its path and position. Usage errors exit 2. No stack traces:
// the output is for the person editing the file.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { parse, stringify } from 'yaml';
import {
  type Config,
  type ConfigIssue,
  formatIssue,
  isConfigError,
  loadConfigFile,
} from '../config/index.ts';
import { appendProblem } from '../telemetry/logger.ts';

export interface CommandIo {
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
}

const USAGE = `usage: slagate check-config FILE   (or --config FILE, as serve takes it)

Validates a gateway configuration file. Prints the effective configuration (with every default
applied) and exits 0, or prints each problem with its path and exits 1.
`;

export async function checkConfigCommand(
  argv: string[],
  io: CommandIo = { stdout: process.stdout, stderr: process.stderr },
): Promise<number> {
  if (argv.includes('-h') || argv.includes('--help')) {
    io.stdout.write(USAGE);
    return 0;
  }
  // `--config FILE` (or `--config=FILE`), read as serve reads it, names the same file. A usage
  // error says what was wrong before the usage: `--confg x.yaml` is not a missing FILE.
  let file: string;
  try {
    const { values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      options: { config: { type: 'string' } },
    });
    const named = values.config === undefined ? [] : [values.config];
    const files = [...named, ...positionals];
    if (files.length !== 1) throw new Error(`give one FILE (got ${files.length})`);
    file = files[0]!;
  } catch (err) {
    io.stderr.write(`slagate check-config: ${(err as Error).message}\n\n${USAGE}`);
    return 2;
  }

  let config: Config | null = null;
  let issues: ConfigIssue[] = [];
  try {
    config = loadConfigFile(file);
  } catch (err) {
    if (!isConfigError(err)) {
      io.stderr.write(`${file}: ${(err as Error).message}\n`);
      return 1;
    }
    issues = [...err.issues];
  }
  // The one setting serve checks against the machine rather than the schema: it opens the log at
  // its start and refuses to run when it cannot. Checked whatever else is wrong, so that one run
  // reports every problem: from the file as written when the schema refused it.
  const log = config !== null ? config.logging.admission_log : writtenLogPath(file);
  const problem = log === null || log === 'stdout' ? null : appendProblem(log);
  if (problem !== null)
    issues.push({ path: 'logging.admission_log', message: `cannot write ${log} (${problem})` });
  if (issues.length > 0 || config === null) {
    const count = issues.length === 1 ? '1 problem' : `${issues.length} problems`;
    io.stderr.write(`${file}: configuration is invalid (${count}):\n`);
    for (const issue of issues) io.stderr.write(`  ${formatIssue(issue, file)}\n`);
    return 1;
  }
  io.stdout.write(`# ${file}: valid. Effective configuration, defaults applied:\n`);
  io.stdout.write(stringify(redactSecrets(config), { lineWidth: 0 }));
  return 0;
}

/** The Redis password is the one secret a configuration may hold; API keys appear only as hashes. */
function redactSecrets(config: Config): Config {
  if (config.state.store !== 'redis') return config;
  const url = new URL(config.state.redis_url);
  if (url.password === '') return config;
  url.password = '***';
  return { ...config, state: { ...config.state, redis_url: url.toString() } };
}

/** `logging.admission_log` as the file writes it, when it is a path; null when unreadable or absent. */
function writtenLogPath(file: string): string | null {
  try {
    const doc = parse(readFileSync(file, 'utf8')) as { logging?: { admission_log?: unknown } } | null;
    const log = doc?.logging?.admission_log;
    return typeof log === 'string' && log !== '' ? log : null;
  } catch {
    return null;
  }
}
