// `slagate <command> [args]`: one file per command under src/cli/, each exporting an async
// function that takes its own argv and returns the process exit code. Commands are imported
// lazily so `slagate logs` does not pay for loading fastify or the simulator.

import { constants } from 'node:os';
import { takeStopSignal } from './stop-signals.ts';

type Command = (argv: string[]) => Promise<number>;

/**
 * `takesStop`: the command takes the stop signals held since the process began over itself
 * (takeStopSignal, once its own handlers are on); for any other, main takes them before it runs.
 */
const COMMANDS: Record<string, { summary: string; load: () => Promise<Command>; takesStop?: true }> = {
  serve: {
    summary: 'run the gateway (--config FILE, default config/gateway.yaml; --host H --port N)',
    load: async () => (await import('./serve.ts')).serveCommand,
    takesStop: true,
  },
  sim: {
    summary:
      'run a simulated vLLM fleet (--replicas N --port P --host H --profile NAME --model NAME --time-scale X --seed S --admin-port A)',
    load: async () => (await import('./sim.ts')).simCommand,
  },
  bench: {
    summary:
      'load a target and report vLLM-style figures (--target URL --workload NAME --rate R); bench compare: policies side by side on a simulated fleet',
    load: async () => (await import('./bench.ts')).benchCommand,
  },
  logs: {
    summary: 'summarise admission logs from FILE or stdin (--pretty for a live view)',
    load: async () => (await import('./logs.ts')).logsCommand,
  },
  'check-config': {
    summary: 'validate a YAML config and print the effective configuration',
    load: async () => (await import('./check-config.ts')).checkConfigCommand,
  },
};

function usage(): string {
  const lines = ['usage: slagate <command> [options]', '', 'commands:'];
  for (const [name, c] of Object.entries(COMMANDS)) lines.push(`  ${name.padEnd(14)}${c.summary}`);
  lines.push(
    '',
    'slagate --version prints the version;',
    "slagate COMMAND --help (or slagate help COMMAND), a command's options.",
  );
  return lines.join('\n');
}

/** The version in package.json (read on demand: only `--version` needs it). */
async function version(): Promise<string> {
  const { readFile } = await import('node:fs/promises');
  const pkg = JSON.parse(await readFile(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}

async function main(argv: string[]): Promise<number> {
  const code = await dispatch(argv);
  // A stop held and never taken (help, a usage error, a command that ended before it took it)
  // ends the process as the signal would have, whatever the command returned.
  const held = takeStopSignal();
  return held === null ? code : 128 + constants.signals[held];
}

async function dispatch(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  // `slagate help COMMAND [SUB]` is `slagate COMMAND [SUB] --help`: the command's own usage.
  if (name === 'help' && rest[0] !== undefined) return dispatch([...rest, '--help']);
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(`${usage()}\n`);
    return name === undefined ? 1 : 0;
  }
  if (name === '--version' || name === '-v' || name === 'version') {
    process.stdout.write(`slagate ${await version()}\n`);
    return 0;
  }
  const command = COMMANDS[name];
  if (command === undefined) {
    process.stderr.write(`slagate: unknown command '${name}'\n\n${usage()}\n`);
    return 2;
  }
  const run = await command.load();
  if (command.takesStop === undefined) {
    // A stop asked for while the command loaded ends it before it starts, as the signal would have.
    const held = takeStopSignal();
    if (held !== null) return 128 + constants.signals[held];
  }
  return run(rest);
}

// Invariant: a reader that stops reading (`| head -1`, `| grep -q valid`) ends the output, not the
// command: the exit code stays the command's own (check-config's 0 for a valid file, which a
// pipeline under pipefail reads), with no EPIPE trace. So for stderr: a gateway whose stdout and
// stderr are one pipe (`serve 2>&1 | tee`, a journal stream) says on stderr that its log cannot be
// written when that pipe's reader is gone, and must go on serving. Any other error is thrown as before.
for (const out of [process.stdout, process.stderr])
  out.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE') throw err;
  });

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`slagate: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exitCode = 1;
  },
);
