// Starts `slagate sim` in its own process (so a benchmark's client does not share its event
// loop) and resolves with the replica URLs once it prints them.

import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { stopChild } from './stop-child.ts';

const BIN = fileURLToPath(new URL('../../bin/slagate.js', import.meta.url));

export interface ChildFleet {
  urls: string[];
  child: ChildProcess;
  stop(): Promise<void>;
}

export async function startChildFleet(args: {
  replicas: number;
  profile: string;
  timeScale?: number;
  seed?: number;
}): Promise<ChildFleet> {
  const child = spawn(
    process.execPath,
    [
      BIN,
      'sim',
      '--replicas',
      String(args.replicas),
      '--port',
      '0',
      '--profile',
      args.profile,
      '--time-scale',
      String(args.timeScale ?? 1),
      '--seed',
      String(args.seed ?? 0),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const urls = await new Promise<string[]>((resolve, reject) => {
    let out = '';
    const found: string[] = [];
    child.once('exit', (code) => reject(new Error(`slagate sim exited with ${code}: ${out}`)));
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      for (const m of out.matchAll(/http:\/\/127\.0\.0\.1:\d+/g)) if (!found.includes(m[0])) found.push(m[0]);
      if (found.length >= args.replicas) resolve(found.slice(0, args.replicas));
    });
  });
  return {
    urls,
    child,
    stop: () => stopChild(child),
  };
}
