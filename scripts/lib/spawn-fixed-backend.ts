// Starts a helper script of scripts/lib in its own process and resolves with the URL it prints.
import { type ChildProcess, spawn } from 'node:child_process';

export interface Spawned {
  url: string;
  child: ChildProcess;
  stop(): void;
}

export async function spawnLibScript(
  script: string,
  args: string[],
  env: NodeJS.ProcessEnv = process.env,
): Promise<Spawned> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', new URL(`./${script}`, import.meta.url).pathname, ...args],
    { env, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const url = await new Promise<string>((resolve) =>
    child.stdout!.once('data', (d) => resolve(String(d).trim())),
  );
  return { url, child, stop: () => child.kill('SIGTERM') };
}

/** scripts/lib/fixed-backend.ts: first token after `ttftMs`, then one every `itlMs`. */
export function spawnFixedBackend(ttftMs = 20, itlMs = 10): Promise<Spawned> {
  return spawnLibScript('fixed-backend.ts', ['--ttft-ms', String(ttftMs), '--itl-ms', String(itlMs)]);
}

/** scripts/lib/floor-proxy.ts: a TCP pass-through or a minimal node:http (or undici) proxy to `target`. */
export function spawnFloor(
  kind: 'tcp' | 'http' | 'undici',
  target: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Spawned> {
  return spawnLibScript('floor-proxy.ts', ['--kind', kind, '--target', target], env);
}

/**
 * Stops `helpers` however this script ends: they have no IPC channel, so nothing else would. A
 * SIGINT or SIGTERM to the script alone (not its process group) ends it as the signal would, after
 * stopping them; 'exit' alone does not run on a signal.
 */
export function stopOnExit(helpers: Spawned[]): void {
  process.on('exit', () => {
    for (const h of helpers) h.stop();
  });
  for (const [signal, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
  ] as const) {
    process.once(signal, () => process.exit(code));
  }
}
