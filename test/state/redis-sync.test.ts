// The exchange with Redis on its own (real redis-server), with scripted hosts: what one tick reads
// from the shared log is bounded in bytes as well as in entries; no entry is sent twice; an error
// Redis answers with keeps the connection; a broken log costs the log only; a silent sentinel is
// given up on.
import { connect, createServer, type Socket } from 'node:net';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { RedisStateConfig } from '../../src/config/index.ts';
import { LOG_READ_BYTES, RedisSync, type SyncHost } from '../../src/state/redis-sync.ts';
import { type RedisServer, startRedisSentinel, startRedisServer } from '../helpers/redis-server.ts';

/** A host that sends what is queued and records each batch of log entries it is given. */
function host(): SyncHost & { queue: string[]; batches: string[][] } {
  const queue: string[] = [];
  const batches: string[][] = [];
  return {
    queue,
    batches,
    snapshot: () => '{}',
    inflight: () => '{}',
    applyPeers: (_snapshots, inflight) => inflight.length,
    logEntry: () => queue.shift() ?? '',
    applyLog: (entries) => {
      batches.push(entries);
    },
    departing: () => '',
  };
}

describe('RedisSync', () => {
  let redis: RedisServer;
  const syncs: RedisSync[] = [];
  let n = 0;
  const cfg = (): RedisStateConfig => ({
    store: 'redis',
    redis_url: redis.url,
    key_prefix: `sync${n++}`,
    connect_timeout_ms: 500,
    command_timeout_ms: 2_000,
    // The timer ticks rarely: the test drives every exchange itself.
    refresh_interval_ms: 1_000,
    inflight_interval_ms: 1_000,
    topology: 'standalone',
    sentinels: [],
    sentinel_name: 'mymaster',
    cluster_nodes: [],
  });
  const start = (id: string, h: SyncHost, c: RedisStateConfig) => {
    const s = new RedisSync(c, { instanceId: id, host: h, now: () => performance.now() });
    syncs.push(s);
    return s;
  };

  beforeAll(async () => {
    redis = await startRedisServer();
  });
  afterAll(async () => {
    await redis.stop();
  });
  afterEach(async () => {
    await Promise.all(syncs.splice(0).map((s) => s.close()));
  });

  it('a late joiner reads a backlog of large entries a bounded number of bytes per tick, losing none', async () => {
    const c = cfg();
    const writer = host();
    const w = start('w', writer, c);
    await w.ready();
    // Three entries of 0.6 × the budget each: any two together are over it.
    const size = Math.ceil(LOG_READ_BYTES * 0.6);
    const entries = ['a', 'b', 'c'].map((ch) => ch.repeat(size));
    for (const e of entries) {
      writer.queue.push(e);
      await w.tick();
    }
    expect(writer.queue).toHaveLength(0);
    // Small entries after them still come many to a tick.
    const small = Array.from({ length: 20 }, (_, i) => `s${i}`);
    for (const e of small) {
      writer.queue.push(e);
      await w.tick();
    }

    const reader = host();
    const r = start('r', reader, c);
    await r.ready();
    for (let i = 0; i < 10 && reader.batches.flat().length < entries.length + small.length; i++)
      await r.tick();
    expect(reader.batches.flat()).toEqual([...entries, ...small]);
    for (const batch of reader.batches) {
      const bytes = batch.reduce((sum, e) => sum + e.length, 0);
      expect(batch.length === 1 || bytes <= LOG_READ_BYTES).toBe(true);
    }
    // One large entry a tick; the 20 small ones came with the last large one, in the same read.
    expect(reader.batches.map((b) => b.length)).toEqual([1, 1, 1 + small.length]);
  });

  it('a sentinel that accepts and never answers is given up on: the next one names the master', async () => {
    const held: Socket[] = [];
    const silent = createServer((sock) => {
      held.push(sock);
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const silentPort = (silent.address() as { port: number }).port;
    const sentinel = await startRedisSentinel(redis.port, 'mymaster');
    try {
      const c: RedisStateConfig = {
        ...cfg(),
        topology: 'sentinel',
        sentinels: [`127.0.0.1:${silentPort}`, `127.0.0.1:${sentinel.port}`],
        command_timeout_ms: 200,
      };
      const s = start('behind-sentinels', host(), c);
      const ready = new Promise<void>((resolve) => s.client.once('ready', () => resolve()));
      let bound: NodeJS.Timeout | undefined;
      const gaveUp = new Promise<never>((_, reject) => {
        bound = setTimeout(() => reject(new Error('never connected past the silent sentinel')), 5_000);
      });
      await Promise.race([ready, gaveUp]).finally(() => clearTimeout(bound));
      // The silent one was asked first, and held.
      expect(held.length).toBeGreaterThan(0);
      await s.tick();
      expect(s.status()).toMatchObject({ degraded: false, lastError: null });
    } finally {
      for (const sock of held) sock.destroy();
      silent.close();
      await sentinel.stop();
    }
  });

  /** The entries of the shared log, by payload. */
  const logged = async (c: RedisStateConfig) =>
    (await redis.cli('xrange', `{${c.key_prefix}}:log`, '-', '+'))
      .split('\n')
      .filter((l) => l.startsWith('e-'));

  it('an entry whose call timed out is not sent again: it may have run (a stalled Redis runs it on waking)', async () => {
    const c = { ...cfg(), command_timeout_ms: 150 };
    const writer = host();
    const w = start('w', writer, c);
    await w.ready();
    expect(w.status().degraded).toBe(false);
    writer.queue.push('e-stalled');
    redis.pause();
    try {
      // Sent, then no answer within the command timeout: the connection goes with it.
      await w.tick();
      expect(w.status().degraded).toBe(true);
    } finally {
      redis.resume();
    }
    // Redis finds the call on its socket when it wakes and runs it; the client reconnects.
    await new Promise<void>((resolve) => w.client.once('ready', () => resolve()));
    // The tick the reconnection starts (tick() joins it while it runs).
    await w.tick();
    writer.queue.push('e-after');
    await w.tick();
    expect(w.status().degraded).toBe(false);
    expect(await logged(c)).toEqual(['e-stalled', 'e-after']);
  });

  /** One instance, its first exchange done, and the id of the connection it holds now. */
  const oneInstance = async () => {
    const c = cfg();
    const w = start('w', host(), c);
    await w.ready();
    return { c, w, connection: () => (w.client as Redis).client('ID') };
  };

  it('an error the client reported between ticks is not shown once an exchange succeeds', async () => {
    const { w } = await oneInstance();
    await w.tick();
    expect(w.status()).toMatchObject({ degraded: false, lastError: null });
    // What ioredis emits for a connection reset it then recovers from on its own.
    w.client.emit('error', new Error('read ECONNRESET'));
    expect(w.status().lastError).toBe('read ECONNRESET');
    await w.tick();
    expect(w.status()).toMatchObject({ degraded: false, lastError: null });
  });

  it('a call whose connection closed under it times out without dropping the connection that replaced it', async () => {
    // A proxy in front of Redis that, once told, cuts the client's connection right after passing
    // on the sync call: the call is never answered, and the client reconnects at once.
    let accepted = 0;
    let cut = false;
    const sockets: Socket[] = [];
    const target = new URL(redis.url);
    const proxy = createServer((client) => {
      accepted++;
      const upstream = connect(Number(target.port), target.hostname);
      sockets.push(client, upstream);
      upstream.on('data', (d) => client.write(d));
      client.on('data', (d: Buffer) => {
        upstream.write(d);
        if (cut && /eval/i.test(d.toString('latin1'))) {
          cut = false;
          client.destroy();
          upstream.destroy();
        }
      });
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', close);
      upstream.on('error', close);
      client.on('close', close);
      upstream.on('close', close);
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    try {
      const port = (proxy.address() as { port: number }).port;
      // Longer than the client's first reconnect (100 ms): the fresh connection is up before the
      // call on the old one times out.
      const c = { ...cfg(), redis_url: `redis://127.0.0.1:${port}`, command_timeout_ms: 600 };
      const w = start('w', host(), c);
      await w.ready();
      expect(w.status().degraded).toBe(false);
      expect(accepted).toBe(1);
      const reconnected = new Promise((r) => w.client.once('ready', r));
      cut = true;
      const failed = w.tick();
      await reconnected;
      await failed;
      expect(w.status().lastError).toMatch(/timed out/);
      // The fresh connection stayed: the next exchange goes out on it.
      await w.tick();
      expect(w.status()).toMatchObject({ degraded: false, lastError: null });
      expect(accepted).toBe(2);
    } finally {
      for (const sock of sockets) sock.destroy();
      await new Promise((r) => proxy.close(r));
    }
  });

  it('an error Redis answers with keeps the connection, and sharing resumes once it is gone', async () => {
    const { c, w, connection } = await oneInstance();
    const before = await connection();
    // The in-flight parts' hash (written at every tick) is a string now: the script's HSET fails
    // with WRONGTYPE.
    await redis.cli('set', `{${c.key_prefix}}:inflight`, 'not a hash');
    for (let i = 0; i < 3; i++) await w.tick();
    expect(w.status()).toMatchObject({ degraded: true, lastError: expect.stringMatching(/WRONGTYPE/) });
    expect(await connection()).toBe(before);
    await redis.cli('del', `{${c.key_prefix}}:inflight`);
    await w.tick();
    // The degraded state ends with the first full exchange that passes: this tick, or the next when
    // the last failed call was a full one (in-flight-only ticks alternate with full ones then).
    if (w.status().degraded) await w.tick();
    expect(w.status()).toMatchObject({ degraded: false, lastError: null });
  });

  it('in-flight parts go at every tick, full snapshots half a refresh interval apart; a peer that leaves takes its full snapshot from the view at the next tick', async () => {
    // Ticks every 500 ms (the timer may add some), full snapshots every 500 ms, on a's own clock,
    // which only the test moves.
    const c = cfg();
    const a = host();
    const b = host();
    b.snapshot = () => 'b-full';
    b.inflight = () => 'b-counts';
    const seen: { full: string[] | null; counts: string[] }[] = [];
    a.applyPeers = (full, counts) => {
      seen.push({ full, counts });
      return counts.length;
    };
    let clock = 0;
    const sa = new RedisSync(c, { instanceId: 'a', host: a, now: () => clock });
    syncs.push(sa);
    const sb = start('b', b, c);
    await Promise.all([sa.ready(), sb.ready()]);
    // a's first exchange (full, before b had published) is behind it, at the same time.
    await sa.tick();
    expect(seen.at(-1)).toEqual({ full: null, counts: ['b-counts'] });
    // A tick drifts: one half a tick before the interval is up is due already, not one earlier.
    clock += 249;
    await sa.tick();
    expect(seen.at(-1)).toEqual({ full: null, counts: ['b-counts'] });
    clock += 1;
    await sa.tick();
    expect(seen.at(-1)).toEqual({ full: ['b-full'], counts: ['b-counts'] });
    await sa.tick();
    expect(seen.at(-1)).toEqual({ full: null, counts: ['b-counts'] });
    // b leaves: its counts are gone at a's next tick, and a full exchange, without b's snapshot,
    // follows at once, though the clock has not moved.
    const from = seen.length;
    await sb.close();
    for (let i = 0; i < 3 && !seen.slice(from).some((x) => x.full !== null); i++) await sa.tick();
    expect(seen.slice(from).find((x) => x.full !== null)).toEqual({ full: [], counts: [] });
  });

  /**
   * Instances a and b, ready, over a Redis whose `{prefix}:<key>` is a string (so Redis refuses
   * the commands on it); `peers()`: the in-flight parts a read last (b's is `{"from":"b"}`).
   */
  const twoOverBrokenKey = async (c: RedisStateConfig, key: string) => {
    await redis.cli('set', `{${c.key_prefix}}:${key}`, 'not of its type');
    const a = host();
    const b = host();
    let aPeers: string[] = [];
    // Each exchange a applied: whether it carried the full snapshots.
    const applied: boolean[] = [];
    a.applyPeers = (snapshots, inflight) => {
      aPeers = inflight;
      applied.push(snapshots !== null);
      return inflight.length;
    };
    b.inflight = () => '{"from":"b"}';
    const sa = start('a', a, c);
    const sb = start('b', b, c);
    await Promise.all([sa.ready(), sb.ready()]);
    return { a, sa, sb, peers: () => aPeers, applied };
  };

  it('a log Redis refuses costs the peers the prefix blocks, not the snapshots', async () => {
    const c = cfg();
    const { a, sa, sb, peers } = await twoOverBrokenKey(c, 'log');
    a.queue.push('e-lost');
    await sb.tick();
    await sa.tick();
    expect(peers()).toEqual(['{"from":"b"}']);
    expect(sa.status()).toMatchObject({ degraded: false, logError: expect.stringMatching(/WRONGTYPE/) });
    // Fixed: the log works again, and the error clears.
    await redis.cli('del', `{${c.key_prefix}}:log`);
    a.queue.push('e-kept');
    await sa.tick();
    expect(sa.status().logError).toBeNull();
    expect(await logged(c)).toEqual(['e-kept']);
  });

  it('a full exchange that keeps failing does not stop the in-flight counts: the tick after it sends them alone', async () => {
    // Redis refuses every full exchange (the snapshots key is not a hash); the in-flight part alone passes.
    const { sa, sb, peers, applied } = await twoOverBrokenKey(cfg(), 'snapshots');
    for (const s of [sb, sa, sb, sa]) await s.tick();
    expect(peers()).toEqual(['{"from":"b"}']);
    // The full exchange is tried again only after its backoff (refused again); the ticks between
    // pass with the in-flight parts alone; the store stays degraded, its error shown, until a full
    // one passes.
    // Each tick that passed (in-flight-only) leaves the store degraded all the same.
    let passed = 0;
    for (let i = 0; i < 4; i++) {
      const before = applied.length;
      await sa.tick();
      if (applied.length > before) passed++;
      expect(sa.status()).toMatchObject({ degraded: true, lastError: expect.stringMatching(/WRONGTYPE/) });
    }
    expect(passed).toBeGreaterThanOrEqual(1);
    expect(applied.every((full) => !full)).toBe(true);
  });

  it('a full exchange that keeps failing is tried again less and less often, the in-flight ticks passing between', async () => {
    // Full exchanges due every 50 ms (half the refresh interval), all refused.
    const { sa, applied } = await twoOverBrokenKey({ ...cfg(), refresh_interval_ms: 100 }, 'snapshots');
    const client = sa.client as unknown as { slagateSync: (...args: unknown[]) => Promise<unknown> };
    const original = client.slagateSync.bind(client);
    const fullAt: number[] = [];
    client.slagateSync = (...args: unknown[]) => {
      if (args[6] !== '') fullAt.push(performance.now());
      return original(...args);
    };
    const started = performance.now();
    while (performance.now() - started < 1_000) await sa.tick();
    // Tried again 50, 100, 200, 400 ms after each failure: five or six tries in the second, where
    // every other tick was one (hundreds at this pace); the in-flight parts passed in between.
    expect(fullAt.length).toBeGreaterThanOrEqual(3);
    expect(fullAt.length).toBeLessThanOrEqual(7);
    // Growing gaps (a stalled tick may stretch one, so the last against the first: 400 against 50).
    const gaps = fullAt.slice(1).map((t, i) => t - fullAt[i]!);
    expect(gaps.at(-1)!).toBeGreaterThan(2 * gaps[0]!);
    expect(applied.length).toBeGreaterThan(20);
    expect(applied.every((full) => !full)).toBe(true);
    expect(sa.status()).toMatchObject({ degraded: true, lastError: expect.stringMatching(/WRONGTYPE/) });
  });

  it("a heartbeat scored ahead of Redis' clock (a failover to a server whose clock is behind) ages from now: swept after the TTL", async () => {
    const c = { ...cfg(), refresh_interval_ms: 100 };
    const h = host();
    let counted: string[] = [];
    h.applyPeers = (_snapshots, inflight) => {
      counted = inflight;
      return inflight.length;
    };
    const w = start('w', h, c);
    await w.ready();
    // A peer that died just before the failover, its last heartbeat a minute ahead of this clock.
    const [secs, micros] = (await redis.cli('time')).trim().split('\n').map(Number);
    const now = secs! * 1000 + Math.floor(micros! / 1000);
    await redis.cli('zadd', `{${c.key_prefix}}:instances`, String(now + 60_000), 'ghost');
    await redis.cli('hset', `{${c.key_prefix}}:inflight`, 'ghost', '{"from":"ghost"}');
    // And an instance departed then, its tenants' tokens kept from a time ahead of this clock.
    const tokens = '{"b":{},"t":{"acme":[0,5]}}';
    await redis.cli('hset', `{${c.key_prefix}}:departed`, 'gone', `${now + 60_000}|${tokens}`);
    // The departed entry's time is set to now at a full exchange (one comes every 50 ms here; a
    // tick asked for while the timer's is out is that one, which may have begun before the writes).
    const departed = async () =>
      (await redis.cli('hget', `{${c.key_prefix}}:departed`, 'gone')).trim().split('|');
    const by = performance.now() + 2_000;
    while ((counted.length === 0 || Number((await departed())[0]) > now + 5_000) && performance.now() < by)
      await w.tick();
    expect(counted).toEqual(['{"from":"ghost"}']);
    const [at, kept] = await departed();
    expect(Number(at)).toBeLessThan(now + 5_000);
    expect(kept).toBe(tokens);
    const from = performance.now();
    while (counted.length > 0 && performance.now() - from < 5_000) await w.tick();
    // Gone after the liveness TTL (2.2 s here) from the tick that first saw it, not after a minute.
    expect(counted).toEqual([]);
    expect(performance.now() - from).toBeLessThan(w.ttlMs + 1_000);
    expect((await redis.cli('zrange', `{${c.key_prefix}}:instances`, '0', '-1')).split('\n')).not.toContain(
      'ghost',
    );
  });

  it('a crashed peer is swept, and the counts still pass, while the full exchange is refused', async () => {
    const c = cfg();
    const { sa, sb, applied } = await twoOverBrokenKey(c, 'snapshots');
    for (const s of [sb, sa]) await s.tick();
    // A peer that crashed: its heartbeat is past the TTL (on Redis' clock).
    const [secs, micros] = (await redis.cli('time')).trim().split('\n').map(Number);
    const now = secs! * 1000 + Math.floor(micros! / 1000);
    await redis.cli('zadd', `{${c.key_prefix}}:instances`, String(now - sa.ttlMs - 1_000), 'ghost');
    const before = applied.length;
    for (let i = 0; i < 4; i++) await sa.tick();
    expect(applied.length - before).toBeGreaterThanOrEqual(1);
    expect((await redis.cli('zrange', `{${c.key_prefix}}:instances`, '0', '-1')).split('\n')).not.toContain(
      'ghost',
    );
  });

  it('a full exchange Redis refuses keeps alternating with in-flight-only ones through a dropped connection', async () => {
    const c = cfg();
    const { sa, sb, peers, applied } = await twoOverBrokenKey(c, 'snapshots');
    for (const s of [sb, sa, sb, sa]) await s.tick();
    expect(peers()).toEqual(['{"from":"b"}']);
    // Redis drops every connection: a tick fails before its call until the client is back.
    const gone = new Promise<void>((resolve) => sa.client.once('close', () => resolve()));
    const back = new Promise<void>((resolve) => sa.client.once('ready', () => resolve()));
    await redis.cli('client', 'kill', 'type', 'normal');
    await gone;
    await sa.tick();
    // (Or a timeout: a call the interval's tick had out when the connection went is never answered.)
    expect(sa.status().lastError).toMatch(/connection|reconnecting|closed|timed out/i);
    await back;
    const before = applied.length;
    for (let i = 0; i < 4; i++) await sa.tick();
    // Not every tick full (and refused) from then on: the in-flight parts still pass, every other tick.
    expect(applied.length - before).toBeGreaterThanOrEqual(2);
    expect(applied.every((full) => !full)).toBe(true);
    expect(sa.status().degraded).toBe(true);
  });

  it('a full exchange whose reply cannot come back within the command timeout: the in-flight counts still travel', async () => {
    // Full exchanges due every 50 ms (half the refresh interval): the loops below meet one soon.
    const c = { ...cfg(), command_timeout_ms: 150, refresh_interval_ms: 100 };
    const a = host();
    const b = host();
    let aPeers: string[] = [];
    a.applyPeers = (_snapshots, inflight) => {
      aPeers = inflight;
      return inflight.length;
    };
    b.inflight = () => '{"from":"b"}';
    const sa = start('a', a, c);
    const sb = start('b', b, c);
    await Promise.all([sa.ready(), sb.ready()]);
    await sb.tick();
    // a's full replies come back after its command timeout, as a reply too big for it would; each
    // such call drops the connection, and the client reconnects.
    const client = sa.client as unknown as { slagateSync: (...args: unknown[]) => Promise<unknown> };
    const original = client.slagateSync.bind(client);
    let fullCalls = 0;
    client.slagateSync = async (...args: unknown[]) => {
      const full = args[6] !== '';
      if (full) fullCalls++;
      const reply = await original(...args);
      if (full) await new Promise((r) => setTimeout(r, 400));
      return reply;
    };
    const by = performance.now() + 2_000;
    while (fullCalls === 0 && performance.now() < by) await sa.tick();
    expect(fullCalls).toBe(1);
    expect(sa.status().degraded).toBe(true);
    // From that failure on: b's counts reach a all the same, in the ticks between the full ones.
    aPeers = [];
    const until = performance.now() + 3_000;
    while (aPeers.length === 0 && performance.now() < until) {
      await sb.tick();
      await sa.tick();
    }
    expect(aPeers).toEqual(['{"from":"b"}']);
    expect(sa.status().degraded).toBe(true);
  });

  /** Runs `body` with Redis over maxmemory (noeviction): it refuses every write that adds memory first. */
  const overMaxmemory = async (body: () => Promise<void>) => {
    await redis.cli('config', 'set', 'maxmemory', '1');
    try {
      await body();
    } finally {
      await redis.cli('config', 'set', 'maxmemory', '0');
    }
  };

  it('a Redis over maxmemory refuses the log alone: a crashed peer is swept, though its departed entry is the first write', async () => {
    const c = cfg();
    const b = host();
    const sb = start('b', b, c);
    await sb.ready();
    await sb.tick();
    // `a` crashed: what it left in Redis, its snapshot (a tenant's tokens) and a heartbeat past
    // the TTL (on Redis' clock), within the time its tenants' tokens still count, so the sweep keeps
    // them as a departed instance's. No log yet: the refused append trims nothing, so nothing is
    // written before the sweep.
    const [secs, micros] = (await redis.cli('time')).trim().split('\n').map(Number);
    const now = secs! * 1000 + Math.floor(micros! / 1000);
    const snapshot = JSON.stringify({ v: 3, b: {}, t: { teamA: [1, 5000] } });
    await redis.cli('hset', `{${c.key_prefix}}:snapshots`, 'a', snapshot);
    await redis.cli('zadd', `{${c.key_prefix}}:instances`, String(now - sb.ttlMs - 1_000), 'a');
    await overMaxmemory(async () => {
      b.queue.push('e-refused');
      await sb.tick();
      // The append is refused; the sweep and the exchange are not.
      expect(sb.status()).toMatchObject({ degraded: false, logError: expect.stringMatching(/OOM/) });
      expect((await redis.cli('zrange', `{${c.key_prefix}}:instances`, '0', '-1')).trim()).toBe('b');
      expect((await redis.cli('hkeys', `{${c.key_prefix}}:departed`)).trim()).toBe('a');
    });
  });

  it('a log whose append Redis over maxmemory refuses gives up its older half, and takes appends once there is room', async () => {
    const c = cfg();
    const b = host();
    const sb = start('b', b, c);
    await sb.ready();
    for (const e of ['e-1', 'e-2', 'e-3', 'e-4']) {
      b.queue.push(e);
      await sb.tick();
    }
    await overMaxmemory(async () => {
      b.queue.push('e-refused');
      await sb.tick();
      expect(sb.status()).toMatchObject({ degraded: false, logError: expect.stringMatching(/OOM/) });
      expect(await logged(c)).toEqual(['e-3', 'e-4']);
    });
    b.queue.push('e-5');
    await sb.tick();
    expect(sb.status().logError).toBeNull();
    expect(await logged(c)).toEqual(['e-3', 'e-4', 'e-5']);
  });

  it('a Redis turned replica (READONLY) is left for a new connection, which finds the primary once there is one', async () => {
    const { w, connection } = await oneInstance();
    const before = await connection();
    // A failover behind the same address: the server answers, read-only.
    await redis.cli('replicaof', '127.0.0.1', '1');
    try {
      const reconnected = new Promise<void>((resolve) => w.client.once('ready', () => resolve()));
      await w.tick();
      expect(w.status()).toMatchObject({ degraded: true, lastError: expect.stringMatching(/READONLY/) });
      await reconnected;
      expect(await connection()).not.toBe(before);
    } finally {
      await redis.cli('replicaof', 'no', 'one');
    }
    // Primary again: once connected (the ticks meanwhile may have dropped another connection),
    // exchanges succeed, and the store is sound again at the first full one (tried again a full
    // interval after the one refused: 500 ms here).
    if (w.client.status !== 'ready')
      await new Promise<void>((resolve) => w.client.once('ready', () => resolve()));
    const by = performance.now() + 3_000;
    while (w.status().degraded && performance.now() < by) await w.tick();
    expect(w.status()).toMatchObject({ degraded: false, lastError: null });
  });
});
