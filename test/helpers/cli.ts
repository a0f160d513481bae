// The real bin/slagate.js in a child process: its exit code, stdout and stderr, whole.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const BIN = fileURLToPath(new URL('../../bin/slagate.js', import.meta.url));

export function runSlagate(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return runNode([BIN, ...args]);
}

/** `node ARGS` (this Node) in a child process: its exit code, stdout and stderr, whole. */
export function runNode(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    child.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, out, err }));
  });
}

/** A `bench compare` sweep small enough for a test: two replicas at 20× speed, 12 requests, two rates. */
export const SMALL_SWEEP: readonly string[] = [
  '--replicas',
  '2',
  '--time-scale',
  '0.05',
  '--requests',
  '12',
  '--rates',
  '20,40',
  '--slo',
  'ttft=500,tpot=50',
];
