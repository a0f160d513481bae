// Starts `slagate serve` in its own process with a generated config file and resolves with its
// URL once it listens.

import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stopChild } from './stop-child.ts';

const BIN = fileURLToPath(new URL('../../bin/slagate.js', import.meta.url));

export interface ChildGateway {
  url: string;
  child: ChildProcess;
  configPath: string;
  dir: string;
  stop(): Promise<void>;
}

export async function startChildGateway(yaml: string): Promise<ChildGateway> {
  const dir = mkdtempSync(join(tmpdir(), 'slagate-gw-'));
  const configPath = join(dir, 'gateway.yaml');
  writeFileSync(configPath, yaml.replaceAll('$DIR', dir));
  const child = spawn(process.execPath, [BIN, 'serve', '--config', configPath, '--port', '0'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let err = '';
    child.once('exit', (code) => reject(new Error(`slagate serve exited with ${code}: ${err}`)));
    child.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      const m = /serving on (http:\/\/[\d.]+:\d+)/.exec(err);
      if (m) resolve(m[1]!);
    });
  });
  return {
    url,
    child,
    configPath,
    dir,
    stop: () => stopChild(child),
  };
}
