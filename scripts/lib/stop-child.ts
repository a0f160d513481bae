import type { ChildProcess } from 'node:child_process';

/** SIGTERM, then resolves when the process has exited (at once if it already has). */
export function stopChild(child: ChildProcess): Promise<void> {
  return new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}
