// The command line as a new user meets it: the real bin/slagate.js in a child process, its exact
// stdout, stderr and exit code.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { BIN, runSlagate } from '../helpers/cli.ts';

/** The example configuration the README starts the gateway with. */
const CONFIG = fileURLToPath(new URL('../../config/gateway.yaml', import.meta.url));

const PKG = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
  version: string;
};

const run = runSlagate;

describe('slagate command line', () => {
  it('--version prints the package version and exits 0', async () => {
    for (const flag of ['--version', '-v']) {
      const r = await run([flag]);
      expect(r).toEqual({ code: 0, out: `slagate ${PKG.version}\n`, err: '' });
    }
  });

  it('--help and every COMMAND --help print their usage, ending in a newline, and exit 0', async () => {
    const results = await Promise.all(
      [[], ['serve'], ['sim'], ['bench'], ['bench', 'compare'], ['logs'], ['check-config']].map(
        async (cmd) => [cmd.join(' '), await run([...cmd, '--help'])] as const,
      ),
    );
    for (const [cmd, r] of results) {
      expect(r.code, cmd).toBe(0);
      expect(r.err, cmd).toBe('');
      expect(r.out, cmd).toMatch(/usage/i);
      expect(r.out.endsWith('\n'), `${cmd} ends with a newline`).toBe(true);
    }
    const top = results[0]![1].out;
    for (const c of ['serve', 'sim', 'bench', 'logs', 'check-config', '--version']) expect(top).toContain(c);
  });

  it('a bad bench option is one line of error and a pointer to --help, exit 2', async () => {
    for (const args of [
      ['bench', '--bogus'],
      ['bench', '--target', 'http://127.0.0.1:1', '--rate', 'fast'],
      // Parses as a URL of scheme `localhost:`: a bad flag, not a run that could not start.
      ['bench', '--target', 'localhost:8080', '--requests', '2'],
    ]) {
      const r = await run(args);
      expect(r.code).toBe(2);
      expect(r.out).toBe('');
      const lines = r.err.trimEnd().split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[0]).toMatch(/^slagate bench: /);
      expect(lines[1]).toBe('see: slagate bench --help');
    }
    expect((await run(['bench', '--bogus'])).err).toContain("'--bogus'");
    expect((await run(['bench', '--target', 'localhost:8080'])).err).toContain(
      'did you mean http://localhost:8080',
    );
  });

  it('bench refuses an empty --model or --label (an unset variable), exit 2', async () => {
    for (const args of [['--model='], ['--model', '  '], ['--label=']]) {
      // A run that started would send its one request to a closed port, and exit 1.
      const r = await run(['bench', '--target', 'http://127.0.0.1:1', '--requests', '1', ...args]);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.out).toBe('');
      const flag = args[0]!.replace('=', '');
      expect(r.err).toBe(`slagate bench: ${flag} must not be empty\nsee: slagate bench --help\n`);
    }
  });

  it('bench compare with a duration and no finite rate says what it needs in its own flags, exit 2', async () => {
    const r = await run(['bench', 'compare', '--policies', 'slagate', '--duration', '5']);
    expect(r.code).toBe(2);
    expect(r.err.split('\n')[0]).toBe('slagate bench compare: --duration needs a finite --rate or --rates');
  });

  it("help COMMAND prints the command's own usage, as COMMAND --help does; help of an unknown command is an error", async () => {
    // One after the other: a burst of CLI processes on two cores starves the other test files.
    for (const cmd of [['sim'], ['bench', 'compare']]) {
      const viaHelp = await run(['help', ...cmd]);
      expect(viaHelp, cmd.join(' ')).toEqual(await run([...cmd, '--help']));
      expect(viaHelp.code).toBe(0);
    }
    const unknown = await run(['help', 'frobnicate']);
    expect(unknown.code).toBe(2);
    expect(unknown.err.split('\n')[0]).toBe("slagate: unknown command 'frobnicate'");
  });

  it('serve refuses an empty or malformed --port (an empty one is not port 0), exit 2', async () => {
    for (const port of ['', ' ', 'x', '70000']) {
      const r = await run(['serve', '--port', port]);
      expect(r.code, JSON.stringify(port)).toBe(2);
      expect(r.err).toContain('--port');
    }
  });

  it('serve refuses an empty or malformed --host (an empty one would listen on every interface), exit 2', async () => {
    for (const host of ['', 'http://127.0.0.1', '127.0.0.1:8080', '[::1]']) {
      const r = await run(['serve', '--host', host]);
      expect(r.code, JSON.stringify(host)).toBe(2);
      expect(r.err).toContain('--host must');
    }
  });

  it('sim that cannot listen (its port in use) is a failure to run, exit 1, not a usage error', async () => {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const port = (server.address() as AddressInfo).port;
      const r = await run(['sim', '--replicas', '1', '--port', String(port)]);
      expect(r.code).toBe(1);
      expect(r.err).toContain('EADDRINUSE');
    } finally {
      server.close();
    }
  });

  it('a reader that closes the output early ends the output, not the command: check-config still exits 0, with no trace', async () => {
    const child = spawn(process.execPath, [BIN, 'check-config', CONFIG], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    // Gone before the first byte is written, as `| head -0` or a `grep -q` that matched is.
    child.stdout.destroy();
    let err = '';
    child.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    expect(err).toBe('');
    expect(code).toBe(0);
  });

  it('a stderr whose reader is gone ends that output, not the command: an unknown command still exits 2, not 1 for a crash', async () => {
    const child = spawn(process.execPath, [BIN, 'frobnicate'], { stdio: ['ignore', 'ignore', 'pipe'] });
    child.stderr.destroy();
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    expect(code).toBe(2);
  });

  it('an unknown command names itself and exits 2', async () => {
    const r = await run(['frobnicate']);
    expect(r.code).toBe(2);
    expect(r.err.split('\n')[0]).toBe("slagate: unknown command 'frobnicate'");
  });
});
