// The simulated fleet of `simulate:` in a child process of its own (`slagate sim` over an IPC
// channel), so its engines' steps and SSE writes never run on the gateway's event loop: on one
// loop, a loaded fleet delays the gateway's own reads, and the gateway then measures the fleet's
// latency without the time its own requests waited behind the fleet's work.
//
// Invariants: the promise resolves only once the child has reported every replica's URL over IPC
// (no sleeps, no output parsing), and rejects if it exits or stays silent first; close() ends the
// child and resolves when it has exited; a gateway that dies takes the fleet with it (the child
// exits when its IPC channel closes). The child's life is its parent's: it is in a process group
// of its own and ignores signals (slagate sim, over IPC), so a Ctrl-C or a SIGTERM to the whole
// group, which starts the gateway's drain, does not cut the streams that drain is waiting for; it
// ends when the parent closes the channel (close()) or dies.
import { type ChildProcess, spawn } from 'node:child_process';
import type { Socket } from 'node:net';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/slagate.js', import.meta.url));
const START_TIMEOUT_MS = 30_000;
/** Set in the environment of a fleet child started here. */
export const FLEET_CHILD_ENV = 'SLAGATE_FLEET_CHILD';
const STOP_TIMEOUT_MS = 10_000;

export interface FleetProcessOptions {
  replicas: number;
  profile: string;
  model?: string;
  timeScale?: number;
  seed?: number;
  /** Start the fleet's fault-control server on an ephemeral port. */
  admin?: boolean;
  /** The child exited when close() had not asked it to (a crash, an OOM kill), with its last stderr. */
  onUnexpectedExit?: (code: number | null, signal: NodeJS.Signals | null, stderr: string) => void;
}

export interface FleetProcess {
  urls: string[];
  /** The fault-control server (GET /replicas, POST|DELETE /replicas/:i/fault), when asked for. */
  adminUrl: string | null;
  /** The child's pid. */
  pid: number;
  close(): Promise<void>;
}

interface ReadyMessage {
  type: 'ready';
  urls: string[];
  adminUrl: string | null;
}

function isReady(m: unknown): m is ReadyMessage {
  return typeof m === 'object' && m !== null && (m as { type?: unknown }).type === 'ready';
}

export async function startFleetProcess(opts: FleetProcessOptions): Promise<FleetProcess> {
  const args = [
    BIN,
    'sim',
    '--replicas',
    String(opts.replicas),
    '--port',
    '0',
    '--profile',
    opts.profile,
    '--time-scale',
    String(opts.timeScale ?? 1),
    '--seed',
    String(opts.seed ?? 0),
  ];
  // Inline: a name that starts with '-' is never taken for an option.
  if (opts.model !== undefined) args.push(`--model=${opts.model}`);
  if (opts.admin) args.push('--admin-port', '0');
  const child = spawn(process.execPath, args, {
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    detached: true,
    // Tells `slagate sim` that its life is this process's (src/cli/sim.ts), not a guess from the
    // channel alone (a process manager's fork mode has one too).
    env: { ...process.env, [FLEET_CHILD_ENV]: '1' },
  });
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (d: string) => {
    stderr = (stderr + d).slice(-4096);
  });
  const ready = await new Promise<ReadyMessage>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`the simulated fleet did not start within ${START_TIMEOUT_MS} ms: ${stderr.trim()}`));
    }, START_TIMEOUT_MS);
    const onExit = (code: number | null) => {
      clearTimeout(timer);
      reject(new Error(`the simulated fleet exited with ${code}: ${stderr.trim()}`));
    };
    child.once('exit', onExit);
    child.on('message', (m: unknown) => {
      if (!isReady(m)) return;
      clearTimeout(timer);
      child.off('exit', onExit);
      resolve(m);
    });
  });
  // The child must not keep the gateway's process alive on its own, nor the other way round:
  // neither the process, its channel nor the pipe its stderr comes through.
  child.unref();
  (child.channel as { unref?: () => void } | undefined)?.unref?.();
  (child.stderr as Socket | null)?.unref();
  let closing = false;
  child.once('exit', (code, signal) => {
    if (!closing) opts.onUnexpectedExit?.(code, signal, stderr.trim());
  });
  return {
    urls: ready.urls,
    adminUrl: ready.adminUrl,
    pid: child.pid ?? -1,
    close: () => {
      closing = true;
      return stopFleetChild(child);
    },
  };
}

/**
 * Ends the fleet child as its parent going away would: the IPC channel closed (it ignores signals);
 * SIGKILL after `killAfterMs`. Resolves once it has exited.
 */
function stopFleetChild(child: ChildProcess, killAfterMs = STOP_TIMEOUT_MS): Promise<void> {
  return stopProcess(child, killAfterMs, (c) => (c.connected ? c.disconnect() : c.kill('SIGKILL')));
}

/**
 * Asks `child` to end (`ask`: SIGTERM by default), then resolves when the process has exited (at
 * once if it already has); SIGKILL after `killAfterMs`.
 */
export function stopProcess(
  child: ChildProcess,
  killAfterMs = STOP_TIMEOUT_MS,
  ask: (child: ChildProcess) => void = (c) => c.kill('SIGTERM'),
): Promise<void> {
  return new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    const timer = setTimeout(() => child.kill('SIGKILL'), killAfterMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    ask(child);
  });
}
