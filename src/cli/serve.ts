// `slagate serve [--config FILE] [--host H] [--port N]`: run the gateway until SIGTERM/SIGINT,
// then drain gracefully (server.shutdown_grace_ms) and exit.

import { parseArgs } from 'node:util';
import { hostProblem, isConfigError } from '../config/index.ts';
import { startGateway } from '../gateway.ts';
import { takeStopSignal } from './stop-signals.ts';

const USAGE =
  'usage: slagate serve [--config FILE] [--host H] [--port N]\n  --config defaults to config/gateway.yaml, relative to the working directory';

export async function serveCommand(argv: string[]): Promise<number> {
  let values: { config?: string; host?: string; port?: string; help?: boolean };
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        config: { type: 'string', default: 'config/gateway.yaml' },
        host: { type: 'string' },
        port: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (err) {
    process.stderr.write(`slagate serve: ${(err as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  // Number('') is 0: an empty --port would listen on a random port.
  const port =
    values.port === undefined ? undefined : values.port.trim() === '' ? Number.NaN : Number(values.port);
  if (port !== undefined && !(Number.isInteger(port) && port >= 0 && port < 65536)) {
    process.stderr.write(`slagate serve: --port must be an integer in 0..65535\n`);
    return 2;
  }
  // The flag is held to server.host's rule: an empty one (an unset variable) would listen on every
  // interface, where the file's key refuses it.
  const hostIssue = values.host === undefined ? null : hostProblem(values.host);
  if (hostIssue !== null) {
    process.stderr.write(`slagate serve: --host ${hostIssue}\n`);
    return 2;
  }
  // Invariant: a SIGHUP never ends the process. It asks for a reload, which the config watcher
  // handles while it runs; before it starts and after it stops (the start, the shutdown's drain)
  // Node's default action for an unhandled SIGHUP would kill the process mid-drain.
  const ignoreHup = (): void => {};
  process.on('SIGHUP', ignoreHup);
  try {
    return await serveUntilStopped(values.config!, values.host, port);
  } finally {
    process.off('SIGHUP', ignoreHup);
  }
}

async function serveUntilStopped(
  configPath: string,
  host: string | undefined,
  port: number | undefined,
): Promise<number> {
  // Invariant: a stop asked for at any moment is heard, during the start too. The start can take
  // seconds (the backends' model lists, an unreachable Redis, a simulated fleet's child), and a
  // signal without a handler is ignored by a process that runs as PID 1, as the container image's
  // does: a `docker stop` or a pod deleted then was lost, and the gateway started and served until
  // SIGKILL, with no drain. One asked for during the start is kept, and the drain begins once the
  // gateway is up. The same for a parent (over IPC) gone before the start ended.
  let stopAsked: string | null = null;
  let onStop = (why: string): void => {
    if (stopAsked !== null) return;
    stopAsked = why;
    process.stderr.write(`slagate: ${why} while starting; stopping once started\n`);
  };
  const onTerm = () => onStop('SIGTERM');
  const onInt = () => onStop('SIGINT');
  const onParentGone = () => onStop('parent gone');
  process.on('SIGTERM', onTerm);
  process.on('SIGINT', onInt);
  // A stop asked for before these handlers were on, while the modules loaded, is kept the same
  // way (a SIGHUP then asked for a reload of a configuration not yet read: nothing to do).
  const held = takeStopSignal();
  if (held === 'SIGTERM' || held === 'SIGINT') onStop(held);
  // Started over IPC by a parent (a benchmark, a test) that is gone: nobody will stop us otherwise.
  if (process.send !== undefined) {
    process.channel?.unref();
    if (process.connected) process.once('disconnect', onParentGone);
    else onParentGone();
  }
  let gateway: Awaited<ReturnType<typeof startGateway>>;
  try {
    gateway = await startGateway({ configPath, host, port });
  } catch (err) {
    process.off('SIGTERM', onTerm);
    process.off('SIGINT', onInt);
    process.off('disconnect', onParentGone);
    // A config error lists every issue with its path; anything else is one line.
    process.stderr.write(`slagate serve: ${isConfigError(err) ? err.message : (err as Error).message}\n`);
    return 1;
  }
  const backends = gateway.runtime.backends.list().map((b) => `${b.name}=${b.url}`);
  process.stderr.write(
    `slagate: serving on ${gateway.url} (OpenAI base URL ${gateway.url}/v1)\n` +
      `  backends: ${backends.join(', ')}${gateway.fleet ? ' (simulated, in a child process)' : ''}\n` +
      `  models: ${gateway.runtime.config.models.join(', ')}\n` +
      `  ops: ${gateway.url}/dashboard ${gateway.url}/metrics ${gateway.url}/admin/state ${gateway.url}/readyz\n`,
  );
  return new Promise<number>((resolve) => {
    let draining = false;
    // A SIGHUP also reopens a file admission log at its path (the config watcher reloads the
    // config on the same signal): logrotate's usual `create` renames the file, and a descriptor
    // kept open would write on into the renamed (or compressed and deleted) one.
    const onHup = () => {
      gateway.reopenLogs().then(
        (path) => {
          if (path !== null)
            process.stderr.write(`slagate: SIGHUP, admission log reopened at ${path}
`);
        },
        (err: unknown) =>
          process.stderr.write(`slagate: SIGHUP, admission log not reopened: ${String(err)}
`),
      );
    };
    // Once the drain is over (or failed), a stop signal ends the process at once: whatever keeps
    // it alive then, a signal ends it (as PID 1 no default action would).
    const done = (code: number) => {
      onStop = () => process.exit(code);
      process.off('SIGHUP', onHup);
      resolve(code);
    };
    const stop = (signal: string) => {
      // Invariant: a stop signal during the drain leaves it running. With `once`, the next SIGTERM
      // (a second `docker stop`, a runtime re-sending it) met Node's default action and killed
      // the process mid-drain: streams reset, their records never written. The grace period
      // bounds the drain; SIGKILL ends it at once.
      if (draining) {
        process.stderr.write(`slagate: ${signal}, already draining (SIGKILL ends it at once)\n`);
        return;
      }
      draining = true;
      process.stderr.write(`slagate: ${signal}, draining\n`);
      gateway.close().then(
        ({ cut, logsFlushed }) => {
          if (cut > 0) process.stderr.write(`slagate: cut ${cut} request(s) after the grace period\n`);
          // A log reader that stopped reading holds writes in flight, which would keep the process
          // alive for as long as it does: exit now, as a bounded wait for them has passed.
          if (!logsFlushed) {
            process.stderr.write(
              'slagate: the logs were not all written (their reader fell behind, or writes failed); exiting\n',
            );
            gateway.abandonLogs();
            process.exit(0);
          }
          done(0);
        },
        (err: unknown) => {
          process.stderr.write(`slagate: shutdown failed: ${String(err)}\n`);
          done(1);
        },
      );
    };
    process.on('SIGHUP', onHup);
    onStop = stop;
    if (stopAsked !== null) stop(stopAsked);
  });
}
