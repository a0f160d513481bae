// `slagate sim`: N simulated vLLM replicas on 127.0.0.1, running until SIGINT or SIGTERM. Started
// by a parent with an IPC channel (the gateway's `simulate:`, src/sim/fleet-process.ts), it also
// reports its URLs over that channel and exits when the parent goes away.

import { parseArgs } from 'node:util';
import { hostProblem } from '../config/index.ts';
import { startFleet } from '../sim/fleet.ts';
import { FLEET_CHILD_ENV } from '../sim/fleet-process.ts';
import { PROFILES } from '../sim/profiles.ts';
import { emptyOption } from './options.ts';

const USAGE = `usage: slagate sim [--replicas N] [--port P] [--host H] [--profile NAME] [--model NAME]
                  [--time-scale X] [--seed S] [--admin-port A]

  --replicas N     number of replicas (default 2)
  --port P         replica i listens on P+i (default 8000; 0 = ephemeral ports)
  --host H         address to listen on (default 127.0.0.1; 0.0.0.0 in a container)
  --profile NAME   GPU profile: ${Object.keys(PROFILES).join(', ')} (default llama3-8b-h100)
  --model NAME     served model name (default: the profile's)
  --time-scale X   wall time per simulated time; 0.1 runs ten times faster (default 1)
  --seed S         fleet seed for generated text (default 0)
  --admin-port A   fault-control server: GET /replicas, POST|DELETE /replicas/:i/fault`;

export async function simCommand(argv: string[]): Promise<number> {
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({
      args: argv,
      options: {
        replicas: { type: 'string' },
        port: { type: 'string' },
        host: { type: 'string' },
        profile: { type: 'string' },
        model: { type: 'string' },
        'time-scale': { type: 'string' },
        seed: { type: 'string' },
        'admin-port': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    }).values;
  } catch (e) {
    process.stderr.write(`slagate sim: ${e instanceof Error ? e.message : String(e)}\n\n${USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  // An empty port or seed would be 0 (an ephemeral port, seed 0), an empty --model served under no
  // name. (--host has its own check below, which says why.)
  const empty = emptyOption(
    values,
    Object.keys(values).filter((key) => key !== 'host'),
  );
  if (empty !== undefined) {
    process.stderr.write(`slagate sim: --${empty} must not be empty\n`);
    return 2;
  }
  const num = (key: string, fallback: number, ok: (n: number) => boolean): number => {
    const raw = values[key];
    if (raw === undefined) return fallback;
    const n = Number(raw);
    if (!ok(n)) throw new Error(`--${key}: invalid value '${String(raw)}'`);
    return n;
  };
  const isPort = (n: number) => Number.isInteger(n) && n >= 0 && n <= 65535;
  // Started as a fleet child (a gateway's `simulate:`, a benchmark: src/sim/fleet-process.ts, which
  // also opens the IPC channel), the fleet lives as long as its parent: a signal to the whole
  // process group (Ctrl-C, a service manager's stop) starts the parent's drain, which needs the
  // fleet's streams to finish. The parent ends it by closing the channel, or by dying. The signals
  // are taken from here on, before the parent can hear that the fleet is ready (and send any).
  const overIpc = process.send !== undefined && process.env[FLEET_CHILD_ENV] === '1';
  const ignore = (): void => {};
  const signals = overIpc ? (['SIGINT', 'SIGTERM', 'SIGHUP'] as const) : (['SIGINT', 'SIGTERM'] as const);
  let stopped = (): void => {};
  const done = new Promise<void>((resolve) => {
    stopped = resolve;
  });
  const stop = () => {
    for (const sig of signals) process.off(sig, overIpc ? ignore : stop);
    process.off('disconnect', stop);
    stopped();
  };
  for (const sig of signals) process.on(sig, overIpc ? ignore : stop);
  // The parent that started us over IPC is gone: nobody will ever stop us otherwise. (Gone already,
  // while this process was loading: its 'disconnect' came before anyone listened.)
  process.on('disconnect', stop);
  if (process.send !== undefined && !process.connected) stop();
  let fleet: Awaited<ReturnType<typeof startFleet>>;
  try {
    const adminPort = values['admin-port'] === undefined ? undefined : num('admin-port', 0, isPort);
    const replicas = num('replicas', 2, (n) => Number.isInteger(n) && n >= 1);
    const port = num('port', 8000, isPort);
    // Replica i listens on port + i: the last one must be a port too (0 picks free ones).
    if (port > 0 && port + replicas - 1 > 65535) {
      throw new Error(`--port ${port} with --replicas ${replicas} runs past port 65535`);
    }
    const host = typeof values.host === 'string' ? values.host : '127.0.0.1';
    const hostIssue = hostProblem(host);
    if (hostIssue !== null) throw new Error(`--host ${hostIssue}`);
    fleet = await startFleet({
      replicas,
      port,
      host,
      profile: typeof values.profile === 'string' ? values.profile : 'llama3-8b-h100',
      model: typeof values.model === 'string' ? values.model : undefined,
      timeScale: num('time-scale', 1, (n) => n > 0 && Number.isFinite(n)),
      seed: num('seed', 0, Number.isInteger),
      adminPort,
    });
  } catch (e) {
    stop();
    process.stderr.write(`slagate sim: ${e instanceof Error ? e.message : String(e)}\n`);
    // A system error (a port in use) is a failure to run, 1; a bad option is a usage error, 2.
    return (e as { code?: unknown } | null)?.code !== undefined ? 1 : 2;
  }
  const first = fleet.replicas[0];
  process.stdout.write(
    `simulated vLLM fleet: ${fleet.replicas.length} × ${first?.profile.name} serving ${first?.profile.model}\n`,
  );
  for (const url of fleet.urls) process.stdout.write(`  ${url}\n`);
  if (fleet.adminUrl !== undefined) process.stdout.write(`admin: ${fleet.adminUrl}\n`);
  if (process.connected)
    process.send?.({ type: 'ready', urls: fleet.urls, adminUrl: fleet.adminUrl ?? null });
  // Invariant: the process runs until it is told to stop (a signal, or its parent gone), whatever
  // its replicas do: a crash or refuse fault closes a replica's port, and with every port closed
  // nothing else would keep it alive through the fault's duration_ms.
  const running = setInterval(() => {}, 1 << 30);
  await done;
  clearInterval(running);
  if (process.connected) process.disconnect();
  await fleet.close();
  return 0;
}
