import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';
import { checkConfigCommand } from '../../src/cli/check-config.ts';
import { loadConfigFile } from '../../src/config/index.ts';

const root = (p: string) => fileURLToPath(new URL(`../../${p}`, import.meta.url));
const fixture = (name: string) => root(`test/fixtures/config/${name}`);

async function run(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await checkConfigCommand(argv, {
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text) },
  });
  return { code, stdout, stderr };
}

describe('slagate check-config', () => {
  it('prints the effective configuration of a valid file and exits 0', async () => {
    const file = root('config/gateway.yaml');
    const { code, stdout, stderr } = await run([file]);
    expect(code).toBe(0);
    expect(stderr).toBe('');
    expect(stdout.split('\n')[0]).toMatch(/valid/);
    // What it prints is exactly what the gateway would run with, defaults included.
    expect(parse(stdout)).toEqual(loadConfigFile(file));
    expect(stdout).toContain('first_token_timeout_ms: 60000');
  });

  it('takes the file as --config FILE too, as serve does', async () => {
    const file = root('config/gateway.yaml');
    const { code, stdout } = await run(['--config', file]);
    expect(code).toBe(0);
    expect(stdout).toBe((await run([file])).stdout);
    expect((await run(['--config'])).code).toBe(2);
    // `--config=FILE` too, as serve's parser reads it; two files are one too many.
    expect((await run([`--config=${file}`])).stdout).toBe((await run([file])).stdout);
    expect((await run(['--config', file, file])).code).toBe(2);
    expect((await run([file, '--bogus'])).code).toBe(2);
  });

  it('shows API key hashes as they are and hides the Redis password', async () => {
    const { code, stdout } = await run([fixture('full.yaml')]);
    expect(code).toBe(0);
    expect(stdout).toContain('2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae');
    expect(stdout).not.toContain('s3cret');
    expect(parse(stdout).state.redis_url).toBe('redis://:***@127.0.0.1:6379/0');
  });

  it('refuses an admission log path serve could not open, as serve does, and creates nothing', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'slagate-check-'));
    try {
      const base = parse(readFileSync(root('config/gateway.yaml'), 'utf8')) as Record<string, unknown>;
      const withLog = (path: string) => {
        const file = join(dir, `${Math.random().toString(36).slice(2)}.yaml`);
        writeFileSync(file, stringify({ ...base, logging: { admission_log: path } }));
        return file;
      };
      // A file where the log's directory would have to be (serve's start test uses the same).
      writeFileSync(join(dir, 'not-a-dir'), '');
      const underFile = await run([withLog(join(dir, 'not-a-dir', 'admission.log'))]);
      expect(underFile.code).toBe(1);
      expect(underFile.stdout).toBe('');
      expect(underFile.stderr).toMatch(
        /logging\.admission_log: cannot write .*not-a-dir\/admission\.log \(ENOTDIR\)/,
      );
      // With another problem in the file, one run reports both.
      const both = join(dir, 'both.yaml');
      writeFileSync(
        both,
        stringify({
          ...base,
          server: { ...(base.server as object), prot: 8080 },
          logging: { admission_log: join(dir, 'not-a-dir', 'admission.log') },
        }),
      );
      const two = await run([both]);
      expect(two.code).toBe(1);
      expect(two.stderr).toMatch(/\(2 problems\)/);
      expect(two.stderr).toMatch(/server\.prot/);
      expect(two.stderr).toMatch(/logging\.admission_log: cannot write .*\(ENOTDIR\)/);
      const aDirectory = await run([withLog(dir)]);
      expect(aDirectory.code).toBe(1);
      expect(aDirectory.stderr).toContain('(it is a directory)');
      // A trailing slash names a directory to be, which serve cannot open as its log either.
      const slash = await run([withLog(join(dir, 'new-dir/'))]);
      expect(slash.code).toBe(1);
      expect(slash.stderr).toContain('(EISDIR)');
      // A path whose directories do not exist yet is fine: serve creates them. check-config does not.
      const nested = join(dir, 'a', 'b', 'admission.log');
      const fresh = await run([withLog(nested)]);
      expect(fresh.code).toBe(0);
      expect(fresh.stderr).toBe('');
      expect(existsSync(join(dir, 'a'))).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('prints every problem with its path and exits 1, without a stack trace', async () => {
    const file = fixture('many-errors.yaml');
    const { code, stdout, stderr } = await run([file]);
    expect(code).toBe(1);
    expect(stdout).toBe('');
    const lines = stderr.trimEnd().split('\n');
    expect(lines[0]).toBe(`${file}: configuration is invalid (10 problems):`);
    expect(lines.slice(1).map((l) => l.trim().split(':')[0])).toEqual([
      'server.prot',
      'backends[1].name',
      'backends[1].url',
      'sla.default_class',
      'sla.classes.interactive.ttft_p99_ms',
      'tenants[0].api_key_sha256',
      'tenants[0].allowed_classes[1]',
      'scheduler.policy',
      'scheduler.concurrency.min',
      'upstream.retries',
    ]);
    expect(lines[1]).toBe(`  server.prot: unknown key (did you mean 'port'?) (${file}:2:28)`);
    expect(stderr).not.toMatch(/\n\s+at /);
  });

  it('reports a YAML syntax error with its position', async () => {
    const file = fixture('syntax-error.yaml');
    const { code, stderr } = await run([file]);
    expect(code).toBe(1);
    expect(stderr).toContain(`(root): YAML syntax:`);
    expect(stderr).toContain(`(${file}:4:1)`);
  });

  it('reports a missing file and exits 1', async () => {
    const { code, stderr } = await run([fixture('nope.yaml')]);
    expect(code).toBe(1);
    expect(stderr).toMatch(/cannot read the file \(ENOENT\)/);
  });

  it('usage: --help exits 0, a missing or extra argument exits 2', async () => {
    const help = await run(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^usage: slagate check-config FILE/);
    expect((await run([])).code).toBe(2);
    const extra = await run(['a.yaml', 'b.yaml']);
    expect(extra.code).toBe(2);
    expect(extra.stderr).toMatch(/^slagate check-config: give one FILE \(got 2\)\n\nusage:/);
  });

  it('says what is wrong with its arguments before the usage, exit 2', async () => {
    const cases = [
      [['--confg', 'x.yaml'], "Unknown option '--confg'"],
      [['--bogus'], "Unknown option '--bogus'"],
      [['a.yaml', 'b.yaml'], 'give one FILE (got 2)'],
      [[], 'give one FILE (got 0)'],
    ] as const;
    for (const [args, reason] of cases) {
      const r = await run([...args]);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stdout).toBe('');
      const [first, blank, usage] = r.stderr.split('\n');
      expect(first).toMatch(/^slagate check-config: /);
      expect(first).toContain(reason);
      expect(blank).toBe('');
      expect(usage).toMatch(/^usage: slagate check-config FILE/);
    }
  });
});
