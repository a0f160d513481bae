import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, stat, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createLogger, REDACTED, requestLogger } from '../../src/telemetry/logger.ts';

const run = promisify(execFile);
let dir: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'slagate-logger-'));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function lines(path: string): Promise<Record<string, unknown>[]> {
  const text = await readFile(path, 'utf8');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

describe('createLogger', () => {
  it('redacts credentials wherever the gateway is likely to log them', async () => {
    const path = join(dir, 'app.log');
    const { logger, flush } = createLogger({ level: 'info', destination: path });
    const secrets = [
      'sk-one',
      'sk-two',
      'sk-three',
      'sk-four',
      'sk-five',
      'hunter2',
      'sk-six',
      'sk-seven',
      'session=cookie-eight',
      'sk-nine',
    ];
    logger.info(
      { req: { method: 'POST', headers: { authorization: `Bearer ${secrets[0]}`, host: 'gw' } } },
      'r',
    );
    logger.info({ headers: { 'x-api-key': secrets[1], 'content-type': 'application/json' } }, 'h');
    logger.info({ tenant: { name: 'team-a', api_key: secrets[2] } }, 't');
    logger.info({ client: { apiKey: secrets[3] } }, 'c');
    logger.info({ config: { tenants: { api_key: secrets[4] } } }, 'deep');
    logger.info({ config: { state: { redis_url: `redis://:${secrets[5]}@10.0.0.1:6379` } } }, 'redis');
    logger.info({ upstream: { headers: { authorization: `Bearer ${secrets[6]}` } } }, 'up');
    logger.info({ api_key: secrets[7] }, 'top');
    logger.info({ upstream: { headers: { cookie: secrets[8] } } }, 'cookie');
    logger.info({ attempt: { request: { authorization: `Bearer ${secrets[9]}` } } }, 'two down');
    await flush();
    const text = await readFile(path, 'utf8');
    for (const s of secrets) expect(text).not.toContain(s);
    const recs = await lines(path);
    expect(recs).toHaveLength(10);
    // Only the secret is replaced; the fields around it survive.
    expect(recs[0]).toMatchObject({
      req: { method: 'POST', headers: { authorization: REDACTED, host: 'gw' } },
    });
    expect(recs[1]).toMatchObject({ headers: { 'x-api-key': REDACTED, 'content-type': 'application/json' } });
    expect(recs[2]).toMatchObject({ tenant: { name: 'team-a', api_key: REDACTED } });
    expect(recs[5]).toMatchObject({ config: { state: { redis_url: REDACTED } } });
  });

  it('a reader that stops reading costs a bounded buffer and a bounded close, not memory and the exit', async () => {
    const fifo = join(dir, 'stalled.fifo');
    await run('mkfifo', [fifo]);
    // Holds the pipe open for reading and never reads: a blocked stdout, as a stalled log driver leaves it.
    const reader = spawn('sh', ['-c', `exec 3<"${fifo}"; exec sleep 60`], { stdio: 'ignore' });
    try {
      const { logger, close, dropped } = createLogger({
        level: 'info',
        destination: fifo,
        bufferBytes: 1024 * 1024,
        closeWaitMs: 200,
      });
      const pad = 'x'.repeat(1000);
      // About 5 MB: the pipe takes 64 KiB, the buffer 1 MiB, the rest is dropped.
      for (let i = 0; i < 5000; i++) logger.info({ i, pad }, 'line');
      expect(dropped()).toBeGreaterThan(3000);
      expect(dropped()).toBeLessThan(5000);
      let timer: NodeJS.Timeout | undefined;
      const hung = new Promise<'hung'>((resolve) => {
        timer = setTimeout(() => resolve('hung'), 5_000);
      });
      const closed = close().then((flushed) => (flushed ? 'flushed' : 'gave up'));
      expect(await Promise.race([closed, hung])).toBe('gave up');
      clearTimeout(timer);
      // A line logged after close() (a reload or a Redis tick finishing late) is dropped, not thrown.
      expect(() => logger.info('late')).not.toThrow();
    } finally {
      reader.kill('SIGKILL');
    }
  });

  it('a log that cannot be written says so once, counts its failed writes, holds its lines, and says when it is written again', async () => {
    // The path leads to /dev/full, where every write fails with ENOSPC (a full disk); the link is
    // then replaced by a file, and a reopen (SIGHUP's) takes the log there.
    const path = join(dir, 'full.log');
    await symlink('/dev/full', path);
    const said: string[] = [];
    const spy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk) => {
      said.push(String(chunk));
      return true;
    });
    const until = async (cond: () => boolean, what: string) => {
      const deadline = performance.now() + 5_000;
      while (!cond()) {
        if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    const cannot = () => said.filter((s) => s.includes('cannot be written (ENOSPC)'));
    try {
      const { logger, writeErrors, dropped, reopen, close } = createLogger({
        level: 'info',
        destination: path,
        flushIntervalMs: 10,
      });
      const pad = 'x'.repeat(200);
      // Past the 4 KiB a write waits for.
      for (let i = 0; i < 30; i++) logger.info({ i, pad }, 'line');
      await until(() => writeErrors() >= 1, 'a failed write');
      for (let i = 30; i < 60; i++) logger.info({ i, pad }, 'line');
      await until(() => writeErrors() >= 2, 'another failed write');
      // Said once, however many writes fail; nothing dropped: the lines are held.
      expect(cannot()).toHaveLength(1);
      expect(cannot()[0]).toContain(path);
      expect(dropped()).toBe(0);
      expect(said.some((s) => s.includes('written again'))).toBe(false);
      await rm(path);
      await reopen();
      logger.info({ i: 60 }, 'after');
      await until(() => said.some((s) => s.includes('is written again')), 'the log written again');
      expect(await close()).toBe(true);
      expect((await lines(path)).map((r) => r.i)).toEqual(Array.from({ length: 61 }, (_, i) => i));
    } finally {
      spy.mockRestore();
    }
  });

  it('a log path whose directory cannot be made fails at once, however the file system refuses it', () => {
    // procfs answers every new entry with ENOENT; Node's recursive mkdir retried that for good.
    expect(() =>
      createLogger({ level: 'info', destination: '/proc/slagate-nope/deeper/admission.log' }),
    ).toThrow(/ENOENT|EACCES|EPERM/);
    // An ordinary missing directory is still made, ancestors included.
    const path = join(dir, 'a', 'b', 'admission.log');
    const { close } = createLogger({ level: 'info', destination: path });
    return close().then(async (ok) => {
      expect(ok).toBe(true);
      expect((await stat(join(dir, 'a', 'b'))).isDirectory()).toBe(true);
    });
  });

  it('close() says when every line was written, and a line logged after it is dropped', async () => {
    const path = join(dir, 'closed.log');
    const { logger, close } = createLogger({ level: 'info', destination: path });
    logger.info({ i: 1 }, 'before');
    expect(await close()).toBe(true);
    expect(() => logger.info({ i: 2 }, 'after')).not.toThrow();
    expect((await lines(path)).map((r) => r.i)).toEqual([1]);
  });

  it('buffers file writes until flush, and flush writes every line', async () => {
    const path = join(dir, 'nested', 'dir', 'buffered.log');
    // A long periodic flush leaves only flush() to write the buffer within the test.
    const { logger, flush } = createLogger({ level: 'info', destination: path, flushIntervalMs: 60_000 });
    for (let i = 0; i < 20; i++) logger.info({ i }, 'line');
    await new Promise((r) => setTimeout(r, 50));
    const before = await stat(path).then(
      (s) => s.size,
      () => 0,
    );
    expect(before).toBe(0);
    await flush();
    const recs = await lines(path);
    expect(recs.map((r) => r.i)).toEqual([...Array(20).keys()]);
  });

  it('flush issued while a write is in flight still writes every line (the last few KB included)', async () => {
    const { appendFile } = await import('node:fs/promises');
    // Lines of ~1 KB written in one burst: the first write goes out once 4 KB are buffered, and
    // depending on the total, the tail left after the last full write is below that threshold.
    // Over these totals some tails are, so a flush that only waited for the writes in flight
    // would lose lines in at least one file.
    const pad = 'x'.repeat(900);
    for (let n = 1; n <= 48; n++) {
      const path = join(dir, `inflight-${n}.log`);
      const { logger, flush } = createLogger({ level: 'info', destination: path, flushIntervalMs: 60_000 });
      for (let i = 0; i < n; i++) logger.info({ i, pad }, 'line');
      await flush();
      await appendFile(path, '{"marker":true}\n');
      const recs = await lines(path);
      expect(recs.at(-1)).toEqual({ marker: true });
      expect(recs.slice(0, -1).map((r) => r.i)).toEqual([...Array(n).keys()]);
    }
  });

  it('concurrent flushes each cover the lines logged before them, without piling up listeners', async () => {
    const path = join(dir, 'concurrent.log');
    const { logger, flush } = createLogger({ level: 'info', destination: path, flushIntervalMs: 60_000 });
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on('warning', onWarning);
    try {
      const pad = 'x'.repeat(700);
      const checks: Promise<void>[] = [];
      for (let i = 0; i < 40; i++) {
        logger.info({ i, pad }, 'line');
        // Flushed: at least lines 0..i are in the file.
        checks.push(
          flush().then(async () => {
            const seen = (await lines(path)).map((r) => r.i);
            expect(seen.slice(0, i + 1)).toEqual([...Array(i + 1).keys()]);
          }),
        );
      }
      await Promise.all(checks);
      await new Promise((r) => setImmediate(r));
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('writes a quiet buffer by itself after the flush interval', async () => {
    const path = join(dir, 'periodic.log');
    const { logger } = createLogger({ level: 'info', destination: path, flushIntervalMs: 20 });
    logger.info({ n: 1 }, 'alone');
    let recs: Record<string, unknown>[] = [];
    for (let waited = 0; waited < 5000 && recs.length === 0; waited += 25) {
      await new Promise((r) => setTimeout(r, 25));
      recs = await lines(path).catch(() => []);
    }
    expect(recs).toHaveLength(1);
  });

  it('respects the level', async () => {
    const path = join(dir, 'level.log');
    const { logger, flush } = createLogger({ level: 'warn', destination: path });
    logger.info('dropped');
    logger.warn('kept');
    await flush();
    expect((await lines(path)).map((r) => r.msg)).toEqual(['kept']);
  });

  it('binds request context in child loggers', async () => {
    const path = join(dir, 'child.log');
    const { logger, flush } = createLogger({ level: 'info', destination: path });
    const child = requestLogger(logger, { req_id: 'req-1', tenant: 'team-a', class: 'interactive' });
    child.info({ backend: 'gpu-0' }, 'dispatched');
    await flush();
    expect((await lines(path))[0]).toMatchObject({
      req_id: 'req-1',
      tenant: 'team-a',
      class: 'interactive',
      backend: 'gpu-0',
      msg: 'dispatched',
    });
  });

  it('flush resolves on a pipe, where fsync fails with EINVAL, and stdout lines are redacted', async () => {
    const script = [
      `import { createLogger } from ${JSON.stringify(new URL('../../src/telemetry/logger.ts', import.meta.url).pathname)};`,
      `const { logger, flush } = createLogger({ level: 'info', destination: 'stdout', flushIntervalMs: 60000 });`,
      `logger.info({ headers: { authorization: 'Bearer sk-pipe' } }, 'piped');`,
      'await flush();',
      'process.exit(0);',
    ].join('\n');
    const { stdout } = await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script]);
    const rec = JSON.parse(stdout.trim()) as Record<string, unknown>;
    expect(rec).toMatchObject({ msg: 'piped', headers: { authorization: REDACTED } });
    expect(stdout).not.toContain('sk-pipe');
  });
});

describe('close', () => {
  it('writes every buffered line and releases the file', async () => {
    const { mkdtempSync, readFileSync, readdirSync, readlinkSync } = await import('node:fs');
    const file = join(mkdtempSync(join(tmpdir(), 'slagate-log-')), 'a.log');
    // Descriptors of this process open on the log file (Linux /proc).
    const openOnFile = () =>
      readdirSync('/proc/self/fd').filter((fd) => {
        try {
          return readlinkSync(`/proc/self/fd/${fd}`) === file;
        } catch {
          return false;
        }
      }).length;
    const log = createLogger({ level: 'info', destination: file, flushIntervalMs: 60_000 });
    log.logger.info({ n: 1 }, 'one');
    await log.flush();
    expect(openOnFile()).toBe(1);
    log.logger.info({ n: 2 }, 'two');
    await log.close();
    expect(readFileSync(file, 'utf8')).toContain('"n":2');
    expect(openOnFile()).toBe(0);
  });
});
