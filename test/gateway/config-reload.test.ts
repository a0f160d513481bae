// Configuration at start and on reload, through startGateway: a bad file is refused with the exact
// path, a failed start leaves nothing running, a bad reload keeps the running configuration, and
// a good one changes backends and models without touching a stream in flight. Checklist item 33.
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { parse, stringify } from 'yaml';
import { isConfigError } from '../../src/config/index.ts';
import { startGateway } from '../../src/gateway.ts';
import { startFleet } from '../../src/sim/fleet.ts';
import { deferred } from '../helpers/deferred.ts';
import { listenLoopback } from '../helpers/http.ts';
import { alive, childPids } from '../helpers/processes.ts';
import {
  baseConfig,
  chat,
  chatStreamText,
  get,
  MODEL,
  merge,
  openStream,
  post,
  type Script,
  scripted,
  serveChild,
  sseData,
  startTestGateway,
  type TestGateway,
  tempDir,
  toConfig,
  waitFor,
} from './harness.ts';

const CHAT = '/v1/chat/completions';
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function tmp(): string {
  const d = tempDir();
  cleanups.push(d.remove);
  return d.dir;
}

const tcpServers = () => process.getActiveResourcesInfo().filter((r) => r === 'TCPServerWrap').length;

describe('at start', () => {
  it('a bad file fails startGateway with every error and its exact path and line', async () => {
    const dir = tmp();
    const path = join(dir, 'bad.yaml');
    writeFileSync(
      path,
      [
        'models: [m]',
        'backends:',
        '  - { name: b0, url: "http://127.0.0.1:1" }',
        'upstream:',
        '  retries: -1',
        '  first_token_timout_ms: 5',
        '',
      ].join('\n'),
    );
    const err = await startGateway({ configPath: path }).catch((e: unknown) => e);
    expect(isConfigError(err)).toBe(true);
    const message = (err as Error).message;
    expect(message).toMatch(/upstream\.retries: must be >= 0 .*bad\.yaml:5:3/);
    expect(message).toContain('upstream.first_token_timout_ms');
    expect(message).toContain(path);
  });

  it('a port already taken fails the start and stops the fleet it had started (a child process)', async () => {
    const first = await startTestGateway({ replicas: 1 });
    cleanups.push(() => first.close());
    const before = { servers: tcpServers(), children: new Set(childPids()) };
    const logPath = join(tmp(), 'a.log');
    const config = toConfig({
      models: [MODEL],
      simulate: { replicas: 2, time_scale: 0.1 },
      server: { port: Number(new URL(first.url).port) },
      logging: { level: 'silent', admission_log: logPath },
    });
    await expect(startGateway({ config, watch: false })).rejects.toThrow(/EADDRINUSE/);
    // Its admission log's file is closed too: no descriptor of this process still holds it.
    const held = readdirSync('/proc/self/fd').filter((fd) => {
      try {
        return readlinkSync(`/proc/self/fd/${fd}`) === logPath;
      } catch {
        return false;
      }
    });
    expect(held).toEqual([]);
    // A closed server releases its handle a moment after close() returns.
    await waitFor(() => tcpServers() === before.servers, 1000, 'the listener released');
    await waitFor(
      () => childPids().every((pid) => before.children.has(pid) || !alive(pid)),
      5000,
      'the fleet stopped',
    );
  });

  it('an admission log path that cannot be written fails the start cleanly, naming the key', async () => {
    const dir = tmp();
    // A file where the log's directory would have to be.
    writeFileSync(join(dir, 'not-a-dir'), '');
    const config = toConfig({
      models: [MODEL],
      backends: [{ name: 'b0', url: 'http://127.0.0.1:1' }],
      server: { port: 0 },
      logging: { level: 'silent', admission_log: join(dir, 'not-a-dir', 'admission.log') },
    });
    const before = tcpServers();
    await expect(startGateway({ config, watch: false })).rejects.toThrow(
      /logging\.admission_log: cannot write .*not-a-dir\/admission\.log \(E[A-Z]+: /,
    );
    // Nothing was started (a server still closing from the test before may release its handle now).
    expect(tcpServers()).toBeLessThanOrEqual(before);
  });
});

/**
 * Backends that answer at once, except a request whose id starts with "hold": that one waits in
 * `held` (by id) until the test releases it.
 */
function holding(): { held: Map<string, () => void>; script: Script } {
  const held = new Map<string, () => void>();
  const script: Script = (req, res) => {
    const id = String(req.headers['x-request-id']).split('.')[0]!;
    const answer = () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(chatStreamText(2));
    };
    if (id.startsWith('hold')) held.set(id, answer);
    else answer();
  };
  return { held, script };
}

/** Patient targets: a held request is not cut while a test arranges the next step. */
const PATIENT = {
  upstream: { first_token_timeout_ms: 30_000 },
  sla: {
    default_class: 'interactive',
    classes: { interactive: { ttft_p99_ms: 30_000, tpot_p99_ms: 1000, priority: 0 } },
  },
};

describe('on reload', () => {
  it('a bad file is refused and the running configuration kept; a good one is applied', async () => {
    const fleet = await startFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 0.1 });
    cleanups.push(() => fleet.close());
    const [u0, u1] = fleet.urls as [string, string];
    // Refusals are logged at error level; this test keeps its output quiet.
    const quiet = { logging: { level: 'fatal' } };
    const t = await startTestGateway({ backends: [{ name: 'r0', url: u0 }], viaFile: true, config: quiet });
    cleanups.push(() => t.close());
    const running = t.gw.runtime.config;
    const admissionLog = running.logging.admission_log;
    const file = (backends: { name: string; url: string }[], over: Record<string, unknown> = {}) =>
      stringify(merge(merge(baseConfig(backends, admissionLog), quiet), over));

    // Not YAML, then YAML that breaks the schema: both refused, the running configuration kept.
    // Each refusal is logged (at error level, even if this level prints nothing): the checks wait
    // for it, so they run after the file was read and judged, not merely some time after the write.
    const errors = vi.spyOn(t.gw.runtime.logger, 'error');
    const refusals = () =>
      errors.mock.calls.filter((c) => c[1] === 'config reload refused; the running configuration is kept');
    const bads: [string, RegExp][] = [
      [`${file([{ name: 'r0', url: u0 }])}\nnot yaml: [`, /YAML syntax/],
      [file([], { upstream: { retries: 'lots' } }), /upstream\.retries/],
    ];
    for (const [i, [bad, issue]] of bads.entries()) {
      writeFileSync(t.configPath, bad);
      await waitFor(() => refusals().length === i + 1, 3000, `refusal ${i + 1}`);
      expect(JSON.stringify(refusals()[i]![0])).toMatch(issue);
      expect(t.gw.runtime.config).toBe(running);
      expect(t.gw.runtime.backends.list().map((b) => b.name)).toEqual(['r0']);
      expect((await post(t.url, CHAT, chat())).status).toBe(200);
    }

    // A valid change: a second backend and a second served model.
    const both = [
      { name: 'r0', url: u0 },
      { name: 'r1', url: u1 },
    ];
    writeFileSync(t.configPath, file(both, { models: [MODEL, 'alias-model'] }));
    await waitFor(() => t.gw.runtime.backends.list().length === 2, 3000, 'r1 added');
    await waitFor(() => t.gw.runtime.models.has('alias-model'), 3000, 'models reloaded');
    const served = new Set<string>();
    for (let i = 0; i < 4; i++)
      served.add((await post(t.url, CHAT, chat())).headers['x-slagate-backend'] as string);
    expect(served).toEqual(new Set(['r0', 'r1']));
    const models = JSON.parse((await get(t.url, '/v1/models')).text) as { data: { id: string }[] };
    expect(models.data.map((m) => m.id)).toEqual([MODEL, 'alias-model']);
    // The context length is still known for the old name after the swap.
    expect(t.gw.runtime.models.maxModelLen(MODEL)).toBe(131072);
  });

  it('removing a backend lets its in-flight stream finish; new requests go elsewhere', async () => {
    const t = await startTestGateway({ replicas: 2, timeScale: 0.2 });
    cleanups.push(() => t.close());
    const [u0, u1] = t.fleet!.urls as [string, string];
    const s = await openStream(t.url, CHAT, chat({ stream: true, max_tokens: 200, ignore_eos: true }), {
      'x-request-id': 'survivor',
    }).response;
    await s.until((text) => sseData(text).length >= 2);
    const removed = s.headers['x-slagate-backend'] as string;
    const kept = removed === 'r0' ? { name: 'r1', url: u1 } : { name: 'r0', url: u0 };
    // Scraped once while both serve: each backend's current-state gauges exist.
    expect((await get(t.url, '/metrics')).text).toContain(`slagate_backend_healthy{backend="${removed}"}`);
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    const reloaded = t.gw.reload(toConfig(baseConfig([kept], admissionLog)));
    await waitFor(() => t.gw.runtime.backends.list().length === 1, 1000, 'backend removed');
    // While its stream drains, nothing updates the removed backend's current-state gauges: they
    // are gone, not frozen at their last values (its request counters stay until the drain ends).
    const draining = (await get(t.url, '/metrics')).text;
    expect(sseData(s.received()).at(-1)).not.toBe('[DONE]');
    expect(draining).not.toContain(`slagate_backend_healthy{backend="${removed}"}`);
    expect(draining).not.toContain(`slagate_backend_inflight{backend="${removed}"}`);
    expect(draining).toContain(`slagate_backend_healthy{backend="${kept.name}"}`);
    // /admin/state lists it while it drains, after the backends in service, with its one stream.
    const listed = async () =>
      (
        JSON.parse((await get(t.url, '/admin/state')).text) as { backends: Record<string, unknown>[] }
      ).backends.map((b) => ({
        name: b.name,
        state: b.state,
        available: b.available,
        local_inflight: b.local_inflight,
      }));
    expect(await listed()).toEqual([
      { name: kept.name, state: 'healthy', available: true, local_inflight: 0 },
      { name: removed, state: 'removed', available: false, local_inflight: 1 },
    ]);
    for (let i = 0; i < 3; i++) {
      expect((await post(t.url, CHAT, chat())).headers['x-slagate-backend']).toBe(kept.name);
    }
    expect(await s.ended).toEqual({ complete: true });
    expect(sseData(s.received()).at(-1)).toBe('[DONE]');
    await reloaded;
    // Drained: gone from the list.
    expect((await listed()).map((b) => b.name)).toEqual([kept.name]);
    expect(await t.recordOf('survivor')).toMatchObject({
      outcome: 'ok',
      backend: removed,
      completion_tokens: 200,
    });
    // The drained stream was counted, and then every series of the removed backend went away.
    const metrics = (await get(t.url, '/metrics')).text;
    expect(metrics).not.toContain(`backend="${removed}"`);
    expect(metrics).toContain(`backend="${kept.name}"`);
  });

  it("a name removed, brought back and removed again: the first removal's drain leaves the second's series alone", async () => {
    const { held, script } = holding();
    const [a, k] = await Promise.all([scripted(script), scripted(script)]);
    cleanups.push(a.close, k.close);
    const patient = PATIENT;
    const t = await startTestGateway({ backends: [{ name: 'a', url: a.url }], config: patient });
    cleanups.push(() => t.close());
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    const only = (name: string, url: string) =>
      toConfig(merge(baseConfig([{ name, url }], admissionLog), patient));
    const series = async () => (await get(t.url, '/metrics')).text.includes('backend="a"');
    const first = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'hold-1' });
    await waitFor(() => held.has('hold-1'), 2000, 'hold-1 on a');
    // R1 removes `a` while hold-1 runs there; R2 brings the name back (a new backend), which
    // serves one request; R3 removes it again while hold-2 runs on it.
    const r1 = t.gw.reload(only('k', k.url));
    await waitFor(() => t.gw.runtime.backends.list()[0]?.name === 'k', 2000, 'a removed');
    await t.gw.reload(only('a', a.url));
    // Back at the same URL while hold-1 still drains there: one entry, in service, whose counts
    // took hold-1 in (listed as draining as well, it would be counted twice).
    const listed = async () =>
      (
        JSON.parse((await get(t.url, '/admin/state')).text) as { backends: Record<string, unknown>[] }
      ).backends.map((b) => [b.name, b.state, b.local_inflight]);
    expect(await listed()).toEqual([['a', 'healthy', 1]]);
    expect((await post(t.url, CHAT, chat({ stream: true }))).status).toBe(200);
    const second = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'hold-2' });
    await waitFor(() => held.has('hold-2'), 2000, 'hold-2 on a again');
    const r3 = t.gw.reload(only('k', k.url));
    await waitFor(() => t.gw.runtime.backends.list()[0]?.name === 'k', 2000, 'a removed again');
    // R1's drain ends: R3's removal is the latest, and its requests still drain.
    held.get('hold-1')!();
    expect((await first).status).toBe(200);
    await r1;
    expect(await series()).toBe(true);
    // R3's drain ends: now the name's series go.
    held.get('hold-2')!();
    expect((await second).status).toBe(200);
    await r3;
    expect(await series()).toBe(false);
    expect(await t.recordOf('hold-2')).toMatchObject({ outcome: 'ok', backend: 'a' });
  });

  it('a backend moved to another URL and back while a stream drains at the first: its draining self is still listed', async () => {
    const { held, script } = holding();
    const [u1, u2, other] = await Promise.all([scripted(script), scripted(script), scripted(script)]);
    cleanups.push(u1.close, u2.close, other.close);
    const patient = PATIENT;
    const t = await startTestGateway({ backends: [{ name: 'a', url: u1.url }], config: patient });
    cleanups.push(() => t.close());
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    const with_ = (backends: { name: string; url: string }[]) =>
      toConfig(merge(baseConfig(backends, admissionLog), patient));
    const listed = async () =>
      (
        JSON.parse((await get(t.url, '/admin/state')).text) as { backends: Record<string, unknown>[] }
      ).backends.map((b) => [b.name, b.url, b.state, b.local_inflight]);
    const origin = new URL(u1.url).origin;
    const k = ['k', new URL(other.url).origin, 'healthy', 0];
    const first = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'hold-1' });
    await waitFor(() => held.has('hold-1'), 2000, 'hold-1 at U1');
    const moved = t.gw.reload(with_([{ name: 'a', url: u2.url }]));
    await waitFor(() => t.gw.runtime.backends.list()[0]?.url === new URL(u2.url).origin, 2000, 'moved');
    await t.gw.reload(with_([{ name: 'a', url: u1.url }]));
    // At U1 again, a new entry that took nothing: the stream still running there is the old one's.
    expect(await listed()).toEqual([
      ['a', origin, 'healthy', 0],
      ['a', origin, 'removed', 1],
    ]);
    // Then a stream on the new entry, the name removed and added back at U1: the new entry takes
    // that stream's counts (its drain is not listed), and still not the first's (listed).
    const third = post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'hold-3' });
    await waitFor(() => held.has('hold-3'), 2000, 'hold-3 at U1');
    const removed = t.gw.reload(with_([{ name: 'k', url: other.url }]));
    await waitFor(() => t.gw.runtime.backends.list()[0]?.name === 'k', 2000, 'a removed');
    await t.gw.reload(
      with_([
        { name: 'a', url: u1.url },
        { name: 'k', url: other.url },
      ]),
    );
    expect(await listed()).toEqual([k, ['a', origin, 'healthy', 1], ['a', origin, 'removed', 1]]);
    held.get('hold-1')!();
    expect((await first).status).toBe(200);
    await moved;
    held.get('hold-3')!();
    expect((await third).status).toBe(200);
    await removed;
    expect(await listed()).toEqual([k, ['a', origin, 'healthy', 0]]);
  });

  it("a reload's new class targets become bucket boundaries of the latency histograms, the old ones kept", async () => {
    const t = await startTestGateway({ replicas: 1, timeScale: 0.1 });
    cleanups.push(() => t.close());
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    const url = t.fleet!.urls[0] as string;
    const ttftLes = async () =>
      [
        ...(await get(t.url, '/metrics')).text.matchAll(
          /^slagate_ttft_seconds_bucket\{[^}]*class="interactive"[^}]*le="([^"]+)"/gm,
        ),
      ].map((m) => m[1]);
    expect((await post(t.url, CHAT, chat({ stream: true }))).status).toBe(200);
    expect(await ttftLes()).toContain('0.5');
    expect(await ttftLes()).not.toContain('0.35');
    await t.gw.reload(
      toConfig(
        merge(baseConfig([{ name: 'r0', url }], admissionLog), {
          sla: {
            default_class: 'interactive',
            classes: { interactive: { ttft_p99_ms: 350, tpot_p99_ms: 50, priority: 0 } },
          },
        }),
      ),
    );
    expect((await post(t.url, CHAT, chat({ stream: true }))).status).toBe(200);
    const les = await ttftLes();
    expect(les).toEqual(expect.arrayContaining(['0.35', '0.5']));
  });

  it("a reload that gives a backend's name another URL: the old server's stream finishes, and nothing of it is learnt for the new one", async () => {
    const t = await startTestGateway({ replicas: 3, timeScale: 0.2 });
    cleanups.push(() => t.close());
    const urls = t.fleet!.urls as [string, string, string];
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    // Two backends in service; the third replica is where one of the names will point.
    await t.gw.reload(
      toConfig(
        baseConfig(
          [
            { name: 'r0', url: urls[0] },
            { name: 'r1', url: urls[1] },
          ],
          admissionLog,
        ),
      ),
    );
    const s = await openStream(t.url, CHAT, chat({ stream: true, max_tokens: 200, ignore_eos: true }), {
      'x-request-id': 'old-server',
    }).response;
    await s.until((text) => sseData(text).length >= 2);
    const moved = s.headers['x-slagate-backend'] as 'r0' | 'r1';
    const other = moved === 'r0' ? 'r1' : 'r0';
    await t.gw.reload(
      toConfig(
        baseConfig(
          [
            { name: moved, url: urls[2] },
            { name: other, url: urls[moved === 'r0' ? 1 : 0] },
          ],
          admissionLog,
        ),
      ),
    );
    expect(await s.ended).toEqual({ complete: true });
    expect(await t.recordOf('old-server')).toMatchObject({ outcome: 'ok', backend: moved });
    // The server now under that name has served nothing: its live window is empty.
    const state = JSON.parse((await get(t.url, '/admin/state')).text) as {
      backends: { name: string; latency: { ttft: { count: number } } | null }[];
    };
    expect(state.backends.find((b) => b.name === moved)!.latency!.ttft.count).toBe(0);
  });

  it('a reload that adds backends while requests queue gives each new one no more than its limit, all counted', async () => {
    // Backends that hold every request: each keeps its slot until the test ends.
    const servers = await Promise.all([0, 1, 2].map(() => scripted(() => {})));
    cleanups.push(() => Promise.all(servers.map((b) => b.close())));
    const [b0, b1, b2] = servers.map((b, i) => ({ name: `b${i}`, url: b.url })) as [
      { name: string; url: string },
      { name: string; url: string },
      { name: string; url: string },
    ];
    const limits = { scheduler: { concurrency: { initial: 2, min: 1 } } };
    const t = await startTestGateway({
      backends: [b0],
      config: {
        ...limits,
        server: { shutdown_grace_ms: 0 },
        upstream: { first_token_timeout_ms: 30_000 },
        sla: {
          default_class: 'interactive',
          classes: { interactive: { ttft_p99_ms: 30_000, tpot_p99_ms: 1000, priority: 0 } },
        },
      },
    });
    cleanups.push(() => t.close());
    for (let i = 0; i < 10; i++) void post(t.url, CHAT, chat()).catch(() => {});
    await waitFor(
      () => servers[0]!.hits.length === 2 && t.gw.runtime.scheduler.view().queued === 8,
      5000,
      'queued',
    );
    const next = structuredClone(t.gw.runtime.config) as unknown as Record<string, unknown>;
    await t.gw.reload(toConfig({ ...next, backends: [b0, b1, b2] }));
    await waitFor(() => servers[1]!.hits.length + servers[2]!.hits.length >= 4, 5000, 'new backends served');
    const live = t.gw.runtime.live;
    expect(servers[1]!.hits.length).toBe(2);
    expect(servers[2]!.hits.length).toBe(2);
    // Every slot granted on them is counted where the scheduler reads its load.
    expect(live.load('b1')).toBe(2);
    expect(live.load('b2')).toBe(2);
    expect(t.gw.runtime.scheduler.view().queued).toBe(4);
  });

  it('a file moved from real backends to simulate is refused: simulate applies only at start', async () => {
    const fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.1 });
    cleanups.push(() => fleet.close());
    const t = await startTestGateway({ backends: [{ name: 'r0', url: fleet.urls[0]! }] });
    cleanups.push(() => t.close());
    const running = t.gw.runtime.config;
    const next = merge(baseConfig([], running.logging.admission_log as string), {
      simulate: { replicas: 1 },
    });
    const err = await t.gw.reload(toConfig(next)).catch((e: unknown) => e);
    expect(String(err)).toMatch(/simulate applies only after a restart/);
    expect(t.gw.runtime.config).toBe(running);
    expect(t.gw.runtime.backends.list().map((b) => b.name)).toEqual(['r0']);
    expect((await post(t.url, CHAT, chat())).status).toBe(200);
  });

  it('a concurrency cap above the running connection pools is refused (the pool size applies only at a restart)', async () => {
    const t = await startTestGateway({ replicas: 1 });
    cleanups.push(() => t.close());
    const running = t.gw.runtime.config;
    const backends = t.gw.runtime.backends.list().map((b) => ({ name: b.name, url: b.url }));
    const next = merge(baseConfig(backends, running.logging.admission_log), {
      scheduler: { concurrency: { max: running.upstream.max_connections_per_backend * 2 } },
      upstream: { max_connections_per_backend: running.upstream.max_connections_per_backend * 2 },
    });
    const err = await t.gw.reload(toConfig(next)).catch((e: unknown) => e);
    expect(String(err)).toMatch(/scheduler\.concurrency\.max: .* reload refused/);
    expect(t.gw.runtime.config).toBe(running);
  });

  it('a reload that raises body_limit_bytes changes no route: it applies only after a restart', async () => {
    const small = { server: { body_limit_bytes: 4096 } };
    const t = await startTestGateway({ replicas: 1, config: small });
    cleanups.push(() => t.close());
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    const bigger = merge(
      baseConfig(
        t.gw.runtime.backends.list().map((b) => ({ name: b.name, url: b.url })),
        admissionLog,
      ),
      {
        server: { body_limit_bytes: 1 << 20 },
      },
    );
    await t.gw.reload(toConfig(bigger));
    expect(t.gw.runtime.config.server.body_limit_bytes).toBe(1 << 20);
    const big = chat({ messages: [{ role: 'user', content: 'x'.repeat(8000) }] });
    expect((await post(t.url, CHAT, big)).status).toBe(413);
  });

  it('tenants added on reload apply to the next request', async () => {
    const t = await startTestGateway({ replicas: 1 });
    cleanups.push(() => t.close());
    expect((await post(t.url, CHAT, chat())).status).toBe(200);
    const admissionLog = t.gw.runtime.config.logging.admission_log;
    const sha = createHash('sha256').update('new-key').digest('hex');
    await t.gw.reload(
      toConfig(
        merge(baseConfig([{ name: 'r0', url: t.fleet!.urls[0]! }], admissionLog), {
          tenants: [{ name: 'newcomer', api_key_sha256: sha }],
        }),
      ),
    );
    expect((await post(t.url, CHAT, chat())).status).toBe(401);
    const ok = await post(t.url, CHAT, chat(), { authorization: 'Bearer new-key', 'x-request-id': 'keyed' });
    expect(ok.status).toBe(200);
    expect(await t.recordOf('keyed')).toMatchObject({ tenant: 'newcomer', outcome: 'ok' });
  });

  it('a restart-only key changed and changed back warns once; a SIGHUP with nothing new logs one line', async () => {
    const base = {
      models: [MODEL],
      simulate: { replicas: 1, time_scale: 0.2 },
      server: { host: '127.0.0.1', port: 0 },
      logging: { level: 'info' },
    };
    const s = await serveChild(base);
    cleanups.push(s.dispose);
    const rewrite = (over: Record<string, unknown>) => {
      const text = readFileSync(s.configPath, 'utf8');
      writeFileSync(s.configPath, stringify(merge(parse(text) as Record<string, unknown>, over)));
    };
    const lines = () =>
      s
        .stdout()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { msg: string; keys?: string[] });
    const count = (msg: string) => lines().filter((l) => l.msg === msg).length;
    const WARN = 'config reload: these settings apply only after a restart';

    rewrite({ server: { port: 18_999 }, upstream: { retries: 1 } });
    await waitFor(() => count('config reloaded') === 1, 5000, 'first reload');
    expect(lines().filter((l) => l.msg === WARN)).toMatchObject([{ keys: ['server.port'] }]);
    // Back to the port the process listens on: the restart-only keys match what is in force.
    rewrite({ server: { port: 0 }, upstream: { retries: 2 } });
    await waitFor(() => count('config reloaded') === 2, 5000, 'second reload');
    expect(count(WARN)).toBe(1);
    // SIGHUP, file unchanged: one line saying so, and no reload.
    s.child.kill('SIGHUP');
    await waitFor(() => count('config reload: file read, nothing changed') === 1, 5000, 'unchanged line');
    expect(count('config reloaded')).toBe(2);
    expect((await post(s.url, CHAT, chat())).status).toBe(200);
    // The warning names the key that changed, not its section's.
    rewrite({ upstream: { breaker: { volume_threshold: 7 } } });
    await waitFor(() => count('config reloaded') === 3, 5000, 'third reload');
    expect(lines().filter((l) => l.msg === WARN)).toMatchObject([
      { keys: ['server.port'] },
      { keys: ['upstream.breaker.volume_threshold'] },
    ]);
    // Models that no longer list the simulated fleet's (it keeps the one it started with): refused.
    rewrite({ models: ['another-model'] });
    const REFUSED = 'config reload refused; the running configuration is kept';
    await waitFor(() => count(REFUSED) === 1, 5000, 'refused');
    expect(JSON.stringify(lines().find((l) => l.msg === REFUSED))).toMatch(
      /models: the simulated fleet serves/,
    );
    expect(count('config reloaded')).toBe(3);
    expect((await post(s.url, CHAT, chat())).status).toBe(200);
  });

  it('a reload that drops every tenant is refused, on a file event and on SIGHUP alike (a half-written file would open the gateway)', async () => {
    const sha = createHash('sha256').update('the-key').digest('hex');
    const s = await serveChild({
      models: [MODEL],
      simulate: { replicas: 1, time_scale: 0.2 },
      server: { host: '127.0.0.1', port: 0 },
      logging: { level: 'info' },
      tenants: [{ name: 'only', api_key_sha256: sha }],
    });
    cleanups.push(s.dispose);
    const lines = () =>
      s
        .stdout()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { msg: string; issues?: string[] });
    const count = (msg: string) => lines().filter((l) => l.msg === msg).length;
    expect((await post(s.url, CHAT, chat())).status).toBe(401);
    // The file as a writer cut before its tenants leaves it: valid, with none.
    const text = readFileSync(s.configPath, 'utf8');
    const { tenants: _cut, ...rest } = parse(text) as Record<string, unknown>;
    writeFileSync(s.configPath, stringify(rest));
    await waitFor(
      () => count('config reload refused; the running configuration is kept') === 1,
      5000,
      'refused',
    );
    expect(
      lines()
        .find((l) => l.msg.startsWith('config reload refused'))!
        .issues!.join(),
    ).toMatch(/tenants: .*restart the gateway/);
    expect(count('config reloaded')).toBe(0);
    expect((await post(s.url, CHAT, chat())).status).toBe(401);
    expect((await post(s.url, CHAT, chat(), { authorization: 'Bearer the-key' })).status).toBe(200);
    // A SIGHUP (log rotation's) re-reads the same cut file: refused again.
    s.child.kill('SIGHUP');
    await waitFor(
      () => count('config reload refused; the running configuration is kept') === 2,
      5000,
      'refused again',
    );
    expect(count('config reloaded')).toBe(0);
    expect((await post(s.url, CHAT, chat())).status).toBe(401);
  });

  it("the file's server.port changed under serve's --port is no change a restart would apply: no warning", async () => {
    const s = await serveChild(
      {
        models: [MODEL],
        simulate: { replicas: 1, time_scale: 0.2 },
        server: { host: '127.0.0.1', port: 0 },
        logging: { level: 'info' },
      },
      { args: ['--port', '0', '--host', '127.0.0.1'] },
    );
    cleanups.push(s.dispose);
    const lines = () =>
      s
        .stdout()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { msg: string; keys?: string[] });
    const text = readFileSync(s.configPath, 'utf8');
    writeFileSync(
      s.configPath,
      stringify(
        merge(parse(text) as Record<string, unknown>, {
          server: { host: '127.0.0.2', port: 18_999 },
          upstream: { retries: 1 },
        }),
      ),
    );
    await waitFor(() => lines().some((l) => l.msg === 'config reloaded'), 5000, 'the reload');
    expect(
      lines().filter((l) => l.msg === 'config reload: these settings apply only after a restart'),
    ).toEqual([]);
    expect((await post(s.url, CHAT, chat())).status).toBe(200);
  });
});

/**
 * A backend serving `model`, whose /v1/models answer waits until `answer()` (`asked` resolves when
 * it is asked); its inference requests go to `onPost`, its health to 200.
 */
async function heldModelsBackend(
  model: string,
  onPost: (req: http.IncomingMessage, res: http.ServerResponse) => void,
  opts: { hold?: boolean } = {},
): Promise<{ url: string; asked: Promise<void>; answer(): void }> {
  const held: (() => void)[] = [];
  const { promise: asked, resolve: wasAsked } = deferred();
  const server = http.createServer((req, res) => {
    if (req.url === '/v1/models') {
      held.push(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          JSON.stringify({ object: 'list', data: [{ id: model, object: 'model', max_model_len: 4096 }] }),
        );
      });
      wasAsked();
      if (opts.hold === false) for (const a of held.splice(0)) a();
      return;
    }
    if (req.method === 'POST') {
      req.resume();
      onPost(req, res);
      return;
    }
    res.writeHead(req.url === '/health' ? 200 : 404);
    res.end();
  });
  const b = await listenLoopback(server);
  cleanups.push(() => b.close());
  const answer = () => {
    for (const a of held.splice(0)) a();
  };
  return { url: b.url, asked, answer };
}

describe('a backend a reload adds', () => {
  it('serves nothing until its /v1/models answer is in: no request for another model reaches it meanwhile', async () => {
    // A replica of another model only: its /v1/models answer waits for the test; a request sent
    // to it meanwhile is counted and answered as vLLM answers a model it lacks.
    const posts: string[] = [];
    const other = await heldModelsBackend('m2', (req, res) => {
      posts.push(req.url ?? '');
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({ error: { message: 'The model does not exist.', type: 'NotFoundError', code: 404 } }),
      );
    });
    const t = await startTestGateway({ replicas: 1 });
    cleanups.push(() => t.close());
    const next = toConfig(
      merge(
        baseConfig(
          [
            { name: 'r0', url: t.fleet!.urls[0]! },
            { name: 'other', url: other.url },
          ],
          t.gw.runtime.config.logging.admission_log,
        ),
        { models: [MODEL, 'm2'] },
      ),
    );
    const reloading = t.gw.reload(next);
    await other.asked;
    const added = t.gw.runtime.backends.get('other')!;
    expect(added.available).toBe(true);
    // Round robin would send every other request there; none goes while its models are unknown.
    for (let i = 0; i < 6; i++) expect((await post(t.url, CHAT, chat())).status).toBe(200);
    expect(posts).toEqual([]);
    expect(added.serves(MODEL)).toBe(false);
    other.answer();
    await reloading;
    expect([...(added.models ?? [])]).toEqual(['m2']);
    expect(added.serves('m2')).toBe(true);
    expect(added.serves(MODEL)).toBe(false);
  });
});

/** A backend's answer to an inference request: a whole three-token chat stream. */
function streamChat(_req: http.IncomingMessage, res: http.ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  res.end(chatStreamText(3));
}

/**
 * While `reloading` asks `moved` (a backend it re-points) for its models, a streamed request for
 * `model` is served whole; then `moved` answers and the reload ends.
 */
async function servedWhileAsked(
  t: TestGateway,
  moved: Awaited<ReturnType<typeof heldModelsBackend>>,
  reloading: Promise<void>,
  model: string,
): Promise<void> {
  await moved.asked;
  const res = await post(t.url, CHAT, chat({ model, stream: true }));
  expect(res.status).toBe(200);
  expect(sseData(res.text).at(-1)).toBe('[DONE]');
  moved.answer();
  await reloading;
}

describe('a backend a reload re-points under its name', () => {
  it("in a fleet of several models, keeps serving its model while the new server's /v1/models answer is on the way", async () => {
    const first = await heldModelsBackend('m2', streamChat, { hold: false });
    const moved = await heldModelsBackend('m2', streamChat);
    const t = await startTestGateway({ replicas: 1 });
    cleanups.push(() => t.close());
    const log = t.gw.runtime.config.logging.admission_log;
    const fleet = (url: string) =>
      toConfig(
        merge(
          baseConfig(
            [
              { name: 'r0', url: t.fleet!.urls[0]! },
              { name: 'q', url },
            ],
            log,
          ),
          { models: [MODEL, 'm2'] },
        ),
      );
    await t.gw.reload(fleet(first.url));
    expect((await post(t.url, CHAT, chat({ model: 'm2', stream: true }))).status).toBe(200);
    // q, the only server of m2, moves to another host.
    await servedWhileAsked(t, moved, t.gw.reload(fleet(moved.url)), 'm2');
  });

  it('in a fleet of one model, serves at once, its /v1/models answer still on the way', async () => {
    const moved = await heldModelsBackend(MODEL, streamChat);
    const t = await startTestGateway({ replicas: 1 });
    cleanups.push(() => t.close());
    // r0 moves to another server: the fleet's only backend.
    const next = toConfig(
      baseConfig([{ name: 'r0', url: moved.url }], t.gw.runtime.config.logging.admission_log),
    );
    await servedWhileAsked(t, moved, t.gw.reload(next), MODEL);
  });
});

describe('two reloads close together', () => {
  it("the second does not lose the first's new model list while the first waits for the backends", async () => {
    // A backend whose /v1/models answers only when the test lets it.
    let hold = false;
    const held: (() => void)[] = [];
    let asked = 0;
    const server = http.createServer((req, res) => {
      if (req.url === '/v1/models') asked++;
      const answer = () => {
        res.writeHead(req.url === '/health' ? 200 : req.url === '/v1/models' ? 200 : 404, {
          'content-type': 'application/json',
        });
        res.end(req.url === '/v1/models' ? '{"object":"list","data":[]}' : '');
      };
      if (req.url === '/v1/models' && hold) held.push(answer);
      else answer();
    });
    const b = await listenLoopback(server);
    cleanups.push(() => b.close());
    const t = await startTestGateway({ backends: [{ name: 'b', url: b.url }] });
    cleanups.push(() => t.close());
    // Asked at the start, and once more when its first health probe passes: both before the hold.
    await waitFor(() => asked >= 2, 3000, 'the questions of the start');
    const running = t.gw.runtime.config;
    const next = (over: Record<string, unknown>) =>
      toConfig(merge(baseConfig([{ name: 'b', url: b.url }], running.logging.admission_log), over));
    hold = true;
    // A adds a model and waits for the backends' context lengths; B, an unrelated edit, comes meanwhile.
    const a = t.gw.reload(next({ models: [MODEL, 'm2'] }));
    await waitFor(() => held.length === 1, 3000, "A's question to the backend");
    const bReload = t.gw.reload(next({ models: [MODEL, 'm2'], upstream: { retries: 1 } }));
    await waitFor(() => held.length === 2, 3000, "B's question to the backend");
    for (const answer of held.splice(0)) answer();
    await Promise.all([a, bReload]);
    expect(t.gw.runtime.config.upstream.retries).toBe(1);
    expect(t.gw.runtime.models.has('m2')).toBe(true);
  });
});
