// `slagate serve` as a real child process and SIGTERM: new requests are refused with 503 at once,
// an in-flight stream drains to completion (or is cut after a short grace period), the process
// exits 0, and the admission log file holds every record. Checklist item 34.
import { once } from 'node:events';
import { renameSync } from 'node:fs';
import { type AddressInfo, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterEach, expect, it } from 'vitest';
import {
  chat,
  MODEL,
  openStream,
  post,
  readRecords,
  type ServedGateway,
  serveChild,
  sseData,
  waitFor,
} from './harness.ts';

const CHAT = '/v1/chat/completions';
const BIN_PATH = join(import.meta.dirname, '../../bin/slagate.js');
/** `node --import` this: the process sends itself SIGTERM while the command's modules load. */
const SIGTERM_AT_MAIN = join(import.meta.dirname, '../fixtures/signals/sigterm-at-main.mjs');

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function serve(graceMs: number): Promise<ServedGateway> {
  const s = await serveChild({
    server: { shutdown_grace_ms: graceMs },
    models: [MODEL],
    simulate: { replicas: 1, time_scale: 0.2 },
  });
  cleanups.push(s.dispose);
  return s;
}

it('SIGTERM: refuse new requests, drain the in-flight stream (a SIGHUP or a second SIGTERM meanwhile changes nothing), flush every record, exit 0', async () => {
  const s = await serve(10_000);
  for (let i = 0; i < 5; i++) {
    expect((await post(s.url, CHAT, chat(), { 'x-request-id': `before-${i}` })).status).toBe(200);
  }
  // About 0.8 s of tokens: long enough to still be streaming when the 503 is checked.
  const stream = await openStream(s.url, CHAT, chat({ stream: true, max_tokens: 600, ignore_eos: true }), {
    'x-request-id': 'draining',
  }).response;
  await stream.until((text) => sseData(text).length >= 2);
  s.child.kill('SIGTERM');
  await waitFor(() => s.stderr().includes('SIGTERM, draining'), 5000, 'SIGTERM seen');
  // A reload signal during the drain (a config reloader, systemctl reload) does not end the process,
  // nor does a second stop signal (a second `docker stop`).
  s.child.kill('SIGHUP');
  s.child.kill('SIGTERM');
  await waitFor(() => s.stderr().includes('SIGTERM, already draining'), 5000, 'second SIGTERM seen');
  const refused = await post(s.url, CHAT, chat(), { 'x-request-id': 'after-sigterm' });
  expect(refused.status).toBe(503);
  expect(refused.headers['retry-after']).toMatch(/^\d+$/);
  expect(JSON.parse(refused.text)).toMatchObject({ error: { code: 'shutting_down' } });
  expect(await stream.ended).toEqual({ complete: true });
  const events = sseData(stream.received());
  expect(events.at(-1)).toBe('[DONE]');
  expect(events.filter((e) => e.includes('"delta":{"content"')).length).toBe(600);
  expect(await s.exited).toBe(0);

  const records = readRecords(s.log);
  const byId = Object.fromEntries(records.map((r) => [r.req_id, r.outcome]));
  expect(records).toHaveLength(7);
  expect(byId).toEqual({
    'before-0': 'ok',
    'before-1': 'ok',
    'before-2': 'ok',
    'before-3': 'ok',
    'before-4': 'ok',
    draining: 'ok',
    'after-sigterm': 'refused',
  });
});

/** A URL of 127.0.0.1 where nothing listens: a backend whose model-list call fails at once. */
async function closedPort(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

/** A backend that takes connections and answers nothing: a gateway's start waits for its model list. */
async function silentBackend(): Promise<{ url: string; server: ReturnType<typeof createServer> }> {
  const held: Socket[] = [];
  const server = createServer((socket) => held.push(socket));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(() => {
    for (const socket of held) socket.destroy();
    return new Promise((resolve) => server.close(resolve));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

it('SIGTERM while the gateway starts (its backend holds the model-list call): the stop is kept, the gateway drains once up and exits 0', async () => {
  const backend = await silentBackend();
  const s = await serveChild(
    { models: [MODEL], backends: [{ name: 'r0', url: backend.url }] },
    {
      // The first connection the gateway makes to its backend is during its start.
      spawned: (child) => backend.server.once('connection', () => child.kill('SIGTERM')),
    },
  );
  cleanups.push(s.dispose);
  expect(await s.exited).toBe(0);
  expect(s.stderr()).toContain('SIGTERM while starting; stopping once started');
  expect(s.stderr()).toContain('SIGTERM, draining');
});

it('SIGTERM while the modules load, before serve runs: the stop is held, the gateway drains once up and exits 0', async () => {
  const s = await serveChild(
    { models: [MODEL], backends: [{ name: 'r0', url: await closedPort() }] },
    { nodeArgs: ['--import', SIGTERM_AT_MAIN] },
  );
  cleanups.push(s.dispose);
  expect(await s.exited).toBe(0);
  expect(s.stderr()).toContain('SIGTERM while starting; stopping once started');
  expect(s.stderr()).toContain('SIGTERM, draining');
});

it('SIGTERM while the modules load, for a command that takes no stop itself or ends before it takes one: it ends as the signal would', async () => {
  const { spawn } = await import('node:child_process');
  // check-config is ended before it runs; serve --help returns before its handlers are on, and
  // the stop held is not dropped for it. One after the other: CLI processes in a burst starve the
  // other test files.
  for (const args of [
    ['check-config', '--help'],
    ['serve', '--help'],
  ]) {
    const child = spawn(process.execPath, ['--import', SIGTERM_AT_MAIN, BIN_PATH, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => {
      stdout += c;
    });
    const [code, signal] = await once(child, 'exit');
    expect({ code, signal }, args.join(' ')).toEqual({ code: 143, signal: null });
    // check-config did not run: no usage printed.
    if (args[0] === 'check-config') expect(stdout).toBe('');
  }
});

it('a parent (over IPC) gone while the gateway starts: the gateway drains once up and exits 0, not left running', async () => {
  const backend = await silentBackend();
  const s = await serveChild(
    { models: [MODEL], backends: [{ name: 'r0', url: backend.url }] },
    { ipc: true, spawned: (child) => backend.server.once('connection', () => child.disconnect()) },
  );
  cleanups.push(s.dispose);
  expect(await s.exited).toBe(0);
  expect(s.stderr()).toContain('parent gone while starting; stopping once started');
});

it('SIGTERM with a short grace period: a longer stream is cut, recorded, and the process exits', async () => {
  const s = await serve(300);
  const stream = await openStream(s.url, CHAT, chat({ stream: true, max_tokens: 20_000, ignore_eos: true }), {
    'x-request-id': 'too-long',
  }).response;
  await stream.until((text) => sseData(text).length >= 2);
  const killedAt = performance.now();
  s.child.kill('SIGTERM');
  // DESIGN section 4: a stream cut after it started ends with one error event, then [DONE].
  expect((await stream.ended).complete).toBe(true);
  const cutEvents = sseData(stream.received());
  expect(cutEvents.at(-1)).toBe('[DONE]');
  expect(JSON.parse(cutEvents.at(-2)!)).toMatchObject({ error: { code: 'shutting_down' } });
  expect(await s.exited).toBe(0);
  expect(performance.now() - killedAt).toBeLessThan(5000);
  expect(s.stderr()).toContain('cut 1 request');
  const records = readRecords(s.log);
  expect(records).toHaveLength(1);
  expect(records[0]).toMatchObject({
    req_id: 'too-long',
    outcome: 'failed_after_commit',
    reason: 'shutting_down',
  });
  // No usage chunk came: the record counts the output the client was sent, not null.
  const relayed = cutEvents.filter((e) => e.includes('"delta":{"content"')).length;
  expect(relayed).toBeGreaterThan(1);
  expect(records[0]!.completion_tokens).toBe(relayed);
});

it('SIGTERM with a log reader that stopped reading: the process exits after the bounded wait for the logs', async () => {
  const s = await serveChild(
    {
      server: { shutdown_grace_ms: 0 },
      models: [MODEL],
      simulate: { replicas: 1, time_scale: 0.2 },
      logging: { level: 'info', admission_log: 'stdout' },
    },
    { readStdout: false },
  );
  cleanups.push(s.dispose);
  // Refused requests, each an admission line of about 0.6 KB on stdout: far more than the pipe holds.
  for (let i = 0; i < 2000; i++) {
    const res = await post(s.url, CHAT, {
      model: 'x'.repeat(200),
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(res.status).toBe(404);
  }
  s.child.kill('SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  const stuck = new Promise<'stuck'>((resolve) => {
    timer = setTimeout(() => resolve('stuck'), 20_000);
  });
  expect(await Promise.race([s.exited, stuck])).toBe(0);
  clearTimeout(timer);
  expect(s.stderr()).toContain(
    'the logs were not all written (their reader fell behind, or writes failed); exiting',
  );
});

it('SIGHUP after a rotation renamed the admission log: later records go to a new file at the path, none is lost', async () => {
  const s = await serve(10_000);
  for (const id of ['before-0', 'before-1']) {
    expect((await post(s.url, CHAT, chat(), { 'x-request-id': id })).status).toBe(200);
  }
  await waitFor(() => readRecords(s.log).length === 2, 5000, 'the first records written');
  // logrotate's default: rename the file, then signal the process.
  const rotated = `${s.log}.1`;
  renameSync(s.log, rotated);
  s.child.kill('SIGHUP');
  await waitFor(() => s.stderr().includes('admission log reopened'), 5000, 'the log reopened');
  expect(s.stderr()).toContain(`admission log reopened at ${s.log}`);
  expect((await post(s.url, CHAT, chat(), { 'x-request-id': 'after-0' })).status).toBe(200);
  await waitFor(() => readRecords(s.log).length === 1, 5000, 'a record in the new file');
  expect(readRecords(s.log).map((r) => r.req_id)).toEqual(['after-0']);
  expect(readRecords(rotated).map((r) => r.req_id)).toEqual(['before-0', 'before-1']);
  // The signal did not end the process: it still serves.
  expect((await post(s.url, CHAT, chat(), { 'x-request-id': 'after-1' })).status).toBe(200);
});
