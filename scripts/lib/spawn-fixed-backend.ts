// Starts scripts/lib/fixed-backend.ts in its own process and resolves with its URL.
import { type ChildProcess, spawn } from 'node:child_process';

export async function spawnFixedBackend(
  ttftMs = 20,
  itlMs = 10,
): Promise<{ url: string; child: ChildProcess; stop(): void }> {
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      new URL('./fixed-backend.ts', import.meta.url).pathname,
      '--ttft-ms',
      String(ttftMs),
      '--itl-ms',
      String(itlMs),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const url = await new Promise<string>((resolve) =>
    child.stdout!.once('data', (d) => resolve(String(d).trim())),
  );
  return { url, child, stop: () => child.kill('SIGTERM') };
}
