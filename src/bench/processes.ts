// Child processes a benchmark measures: a simulated fleet (`slagate sim`) and a gateway
// (`slagate serve`), each in its own process so neither shares an event loop with the client
// that loads it. Both resolve only once the child has said where it listens (synchronising on
// its own output, never on a sleep), and reject with the child's output when it exits first or
// stays silent past a bounded start-up time. stop() SIGTERMs and waits for the exit.

import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { request } from 'undici';
import { startFleetProcess, stopProcess } from '../sim/fleet-process.ts';

const BIN = fileURLToPath(new URL('../../bin/slagate.js', import.meta.url));
const START_TIMEOUT_MS = 30_000;
/** After SIGTERM a child gets this long to drain and exit before it is killed. */
const STOP_TIMEOUT_MS = 30_000;
/** Output kept from a child for error messages (the tail). */
const OUTPUT_LIMIT = 8 * 1024;

/** SIGTERM, then the exit; SIGKILL if it has not exited after `killAfterMs` (a benchmark's drain can be long). */
export function stopChild(child: ChildProcess, killAfterMs = STOP_TIMEOUT_MS): Promise<void> {
  return stopProcess(child, killAfterMs);
}

/**
 * Reads `stream` until `match` finds what it waits for in the output so far, and resolves with
 * that. Rejects when the child exits first or after `timeoutMs` (killing the child then). The
 * stream keeps being read afterwards so the child never blocks on a full pipe.
 */
function awaitOutput<T>(
  child: ChildProcess,
  stream: NodeJS.ReadableStream,
  what: string,
  match: (output: string) => T | null,
  timeoutMs: number,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let out = '';
    let settled = false;
    const settle = (fn: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.off('exit', onExit);
      fn();
    };
    const onExit = (code: number | null, signal: string | null) =>
      settle(() => reject(new Error(`${what} exited with ${code ?? signal}: ${out.trim()}`)));
    const timer = setTimeout(() => {
      settle(() => reject(new Error(`${what} did not start within ${timeoutMs} ms: ${out.trim()}`)));
      child.kill('SIGKILL');
    }, timeoutMs);
    child.once('exit', onExit);
    stream.on('data', (d: Buffer) => {
      if (settled) return;
      out = (out + d.toString()).slice(-OUTPUT_LIMIT);
      const found = match(out);
      if (found !== null) settle(() => resolve(found));
    });
  });
}

export interface ChildFleet {
  urls: string[];
  stop(): Promise<void>;
}

/** Replicas of one GPU profile. A mixed fleet is several groups, each its own `slagate sim`. */
export interface FleetGroup {
  profile: string;
  replicas: number;
}

export interface ChildFleetOptions {
  replicas: number;
  profile: string;
  /** Default 1. */
  timeScale?: number;
  /** Default 0. */
  seed?: number;
}

/**
 * `slagate sim --port 0 …` over an IPC channel (the same child the gateway's `simulate:` runs):
 * resolves with the replica URLs it reports, and the fleet exits if this process dies.
 */
export async function startChildFleet(args: ChildFleetOptions): Promise<ChildFleet> {
  const fleet = await startFleetProcess({
    replicas: args.replicas,
    profile: args.profile,
    timeScale: args.timeScale ?? 1,
    seed: args.seed ?? 0,
  });
  return { urls: fleet.urls, stop: () => fleet.close() };
}

/**
 * One child fleet per group, started in turn; the URLs in group order (the first group's replicas
 * first). Group i gets seed + i, so two groups of one profile do not draw the same numbers.
 * Invariant: when a group fails to start, the groups already started are stopped before the
 * error is thrown, so no child outlives a failed start.
 */
export async function startChildFleets(
  groups: readonly FleetGroup[],
  opts: { timeScale?: number; seed?: number } = {},
): Promise<ChildFleet> {
  const started: ChildFleet[] = [];
  const stopAll = async () => {
    await Promise.all(started.map((f) => f.stop()));
  };
  try {
    for (const [i, g] of groups.entries()) {
      started.push(
        await startChildFleet({
          replicas: g.replicas,
          profile: g.profile,
          timeScale: opts.timeScale ?? 1,
          seed: (opts.seed ?? 0) + i,
        }),
      );
    }
  } catch (err) {
    await stopAll();
    throw err;
  }
  return { urls: started.flatMap((f) => f.urls), stop: stopAll };
}

export interface ChildGateway {
  url: string;
  child: ChildProcess;
  configPath: string;
  /** A fresh temporary directory holding the config (and whatever the config writes there). */
  dir: string;
  stop(): Promise<void>;
}

export interface ChildGatewayOptions {
  /** Node options before the script (e.g. --cpu-prof). */
  nodeArgs?: readonly string[];
}

/**
 * `slagate serve --config FILE --port 0` with a config written to a fresh temporary directory:
 * `yaml` is the text (every `$DIR` in it replaced by that directory) or a function of the
 * directory. Resolves with the URL from its "serving on" line. The directory is left in place
 * (the admission log may be read after stop); removing it is the caller's, except when the
 * gateway fails to start, which removes it.
 */
export async function startChildGateway(
  yaml: string | ((dir: string) => string),
  opts: ChildGatewayOptions = {},
): Promise<ChildGateway> {
  const dir = mkdtempSync(join(tmpdir(), 'slagate-gw-'));
  const configPath = join(dir, 'gateway.yaml');
  writeFileSync(configPath, typeof yaml === 'string' ? yaml.replaceAll('$DIR', dir) : yaml(dir));
  // With an IPC channel the gateway exits when this process goes away (src/cli/serve.ts).
  const args = [...(opts.nodeArgs ?? []), BIN, 'serve', '--config', configPath, '--port', '0'];
  const child = spawn(process.execPath, args, {
    stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
  });
  (child.channel as { unref?: () => void } | undefined)?.unref?.();
  let url: string;
  try {
    url = await awaitOutput(
      child,
      child.stderr!,
      'slagate serve',
      (out) => /serving on (http:\/\/[\d.]+:\d+)/.exec(out)?.[1] ?? null,
      START_TIMEOUT_MS,
    );
  } catch (err) {
    await stopChild(child);
    rmSync(dir, { recursive: true, force: true }); // nothing ran, so nothing in it is worth keeping
    throw err;
  }
  return { url, child, configPath, dir, stop: () => stopChild(child) };
}

/**
 * Polls GET `url`/readyz until it answers 200; rejects after `timeoutMs` with the last answer.
 * (Readiness has no event to wait on from outside the process, so this is the one poll.)
 */
export async function waitReady(url: string, timeoutMs = 15_000, intervalMs = 50): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = 'no answer';
  for (;;) {
    try {
      const res = await request(`${url}/readyz`, { headersTimeout: 2_000, bodyTimeout: 2_000 });
      const body = await res.body.text();
      if (res.statusCode === 200) return;
      last = `${res.statusCode} ${body.slice(0, 200)}`;
    } catch (err) {
      last = (err as Error).message;
    }
    if (Date.now() >= deadline) throw new Error(`${url}/readyz not ready within ${timeoutMs} ms: ${last}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
