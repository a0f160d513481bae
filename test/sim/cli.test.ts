import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { runSlagate } from '../helpers/cli.ts';
import { connectResult, post, send } from './http-helpers.ts';

const BIN = fileURLToPath(new URL('../../bin/slagate.js', import.meta.url));

/**
 * `slagate sim ARGS` expected to refuse its options: its exit code and output. A fleet that starts
 * instead is stopped as soon as it says so, which fails the test (exit 0) rather than hanging it.
 */
function runRefused(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, 'sim', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => {
      out += c.toString();
      if (out.includes('simulated vLLM fleet')) child.kill('SIGTERM');
    });
    child.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, out, err }));
  });
}

describe('slagate sim', () => {
  it('prints the replica URLs, serves until SIGTERM and exits cleanly', async () => {
    const child = spawn(
      process.execPath,
      [BIN, 'sim', '--replicas', '2', '--port', '0', '--time-scale', '0.05', '--admin-port', '0'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    try {
      let out = '';
      child.stdout.on('data', (c: Buffer) => {
        out += c.toString();
      });
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      const deadline = Date.now() + 20_000;
      while (!/admin: http:\/\/\S+\n/.test(out)) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`no URLs printed: ${out}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const urls = [...out.matchAll(/^ {2}(http:\/\/127\.0\.0\.1:\d+)$/gm)].map((m) => m[1] as string);
      expect(urls).toHaveLength(2);
      for (const url of urls) expect((await send(url, 'GET', '/health')).status).toBe(200);
      const r = await post(urls[1] as string, '/v1/completions', { prompt: 'Hi', max_tokens: 3 });
      expect(JSON.parse(r.text).usage.completion_tokens).toBe(3);
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });

  it('runs on through a crash of its only replica, which is back after duration_ms', async () => {
    // No admin server: the replica's port is the process's only one.
    const child = spawn(
      process.execPath,
      [BIN, 'sim', '--replicas', '1', '--port', '0', '--time-scale', '0.05'],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    try {
      let out = '';
      child.stdout.on('data', (c: Buffer) => {
        out += c.toString();
      });
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      const listed = /^ {2}(http:\/\/127\.0\.0\.1:\d+)\n/m;
      const deadline = Date.now() + 20_000;
      while (!listed.test(out)) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`no URL printed: ${out}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      const url = listed.exec(out)![1]!;
      expect((await post(url, '/sim/fault', { mode: 'crash', duration_ms: 300 })).status).toBe(200);
      // Every port of the process closed: it runs on until the replica is back, and serves.
      while ((await connectResult(url)) !== 'ok') {
        if (child.exitCode !== null) throw new Error(`exited with ${child.exitCode} during the crash`);
        await new Promise((r) => setTimeout(r, 50));
      }
      expect((await send(url, 'GET', '/health')).status).toBe(200);
      expect(child.exitCode).toBeNull();
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });

  it('rejects an unknown profile with exit code 2', async () => {
    const child = spawn(process.execPath, [BIN, 'sim', '--profile', 'tpu-v9', '--port', '0'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
    expect(code).toBe(2);
    expect(err).toContain('unknown GPU profile');
  });

  it('refuses, with exit code 2, an empty host (every interface) and ports past 65535', async () => {
    // An unset variable: listen() would read '' as every interface.
    const empty = await runSlagate(['sim', '--host', '', '--port', '0']);
    expect(empty.code).toBe(2);
    expect(empty.err).toContain('--host must not be empty');
    expect(empty.out).toBe('');
    const past = await runSlagate(['sim', '--port', '65535', '--replicas', '2']);
    expect(past.code).toBe(2);
    expect(past.err).toContain('--port 65535 with --replicas 2 runs past port 65535');
  });

  it('refuses an empty value of any option with one line naming it, exit 2: `--port=` is not port 0', async () => {
    const flags = ['port', 'seed', 'admin-port', 'model', 'profile', 'replicas', 'time-scale', 'host'];
    const cases = [...flags.map((flag) => [flag, ''] as const), ['model', '  '] as const];
    // Each after a valid --port 0 (the last value wins): one that started would take no fixed port.
    // One after the other: a burst of CLI processes on two cores starves the other test files.
    for (const [flag, value] of cases) {
      const r = await runRefused(['--replicas', '1', '--port', '0', `--${flag}=${value}`]);
      const what = `--${flag}=${JSON.stringify(value)}`;
      expect(r.code, what).toBe(2);
      expect(r.out, what).toBe('');
      expect(r.err.trimEnd().split('\n'), what).toHaveLength(1);
      expect(r.err, what).toMatch(new RegExp(`^slagate sim: --${flag} must not be empty`));
    }
  });
});
