// `slagate check-config FILE`: exit 0 and print the effective configuration (defaults applied), or
// exit 1 and print every problem with its path and position. Usage errors exit 2. No stack traces:
// the output is for the person editing the file.
import { stringify } from 'yaml';
import { type Config, formatIssue, isConfigError, loadConfigFile } from '../config/index.ts';
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
  // `--config FILE`, as serve takes it, names the same file.
  const args = argv[0] === '--config' ? argv.slice(1) : argv;
  const [file, ...rest] = args;
  if (file === undefined || file.startsWith('-') || rest.length > 0) {
    io.stderr.write(USAGE);
    return 2;
  }

  let config: Config;
  try {
    config = loadConfigFile(file);
  } catch (err) {
    if (!isConfigError(err)) {
      io.stderr.write(`${file}: ${(err as Error).message}\n`);
      return 1;
    }
    const count = err.issues.length === 1 ? '1 problem' : `${err.issues.length} problems`;
    io.stderr.write(`${file}: configuration is invalid (${count}):\n`);
    for (const issue of err.issues) io.stderr.write(`  ${formatIssue(issue, file)}\n`);
    return 1;
  }
  // The one setting serve checks against the machine rather than the schema: it opens the log at
  // its start and refuses to run when it cannot.
  const log = config.logging.admission_log;
  const problem = log === 'stdout' ? null : appendProblem(log);
  if (problem !== null) {
    io.stderr.write(`${file}: configuration is invalid (1 problem):\n`);
    io.stderr.write(`  logging.admission_log: cannot write ${log} (${problem})\n`);
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
