// The background exchange with Redis: every refresh interval, ONE script call (one round trip)
// publishes this instance's snapshot with a heartbeat, drops instances whose heartbeat is older
// than the liveness TTL, and returns the live peers' snapshots.
//
// Invariants:
// - nothing on the request path waits for this: the tick runs on a timer and only ever replaces
//   the peers' view when it succeeds;
// - at most one tick is in flight, and every await in it is bounded (command or connect timeout),
//   so a hung Redis delays the view, never the process;
// - every key is hash-tagged `{prefix}` (one Cluster slot), declared in KEYS, bounded in size by
//   the live instances and expired by PEXPIRE when no instance is left to refresh it;
// - liveness is judged on Redis' own clock (TIME), so gateway clocks need not agree.

import type { RedisStateConfig } from '../config/index.ts';
import { createRedisClient, type StateRedisClient } from './redis-client.ts';

/** Live instances kept at most; the oldest heartbeats go first (a bound, not a limit in practice). */
const MAX_INSTANCES = 256;

const SYNC_SCRIPT = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local max = tonumber(ARGV[4])
local cutoff = '(' .. (now - ttl)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
for i = 1, #dead do redis.call('HDEL', KEYS[2], dead[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local n = redis.call('ZCARD', KEYS[1])
if n > max then
  local extra = redis.call('ZRANGE', KEYS[1], 0, n - max - 1)
  for i = 1, #extra do redis.call('HDEL', KEYS[2], extra[i]) end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - max - 1)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for i = 1, #live do
  if live[i] ~= ARGV[1] then
    local s = redis.call('HGET', KEYS[2], live[i])
    if s then
      out[#out + 1] = live[i]
      out[#out + 1] = s
    end
  end
end
return out
`;

interface SyncCommand {
  slagateSync(
    instances: string,
    snapshots: string,
    id: string,
    snapshot: string,
    ttlMs: number,
    max: number,
  ): Promise<unknown>;
}

export interface StateLogger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}

export interface StoreStatus {
  store: 'memory' | 'redis';
  /** True while the shared store is unreachable (or not reached yet): local state is serving. */
  degraded: boolean;
  lastError: string | null;
  /** Time since the last successful exchange; null if none yet (or with the memory store). */
  lastSyncAgeMs: number | null;
  /** How long the last exchange took (success or failure). */
  lastSyncDurationMs: number | null;
  /** Live peer instances whose snapshots are in the view. */
  peers: number;
}

export interface SyncHost {
  /** This instance's snapshot as of `now` (called once per tick). */
  snapshot(now: number): string;
  /** Replaces the peers' part of the view with these snapshots. */
  applyPeers(snapshots: string[], now: number): void;
}

export interface RedisSyncOptions {
  instanceId: string;
  host: SyncHost;
  now: () => number;
  logger?: StateLogger | undefined;
}

/** The sync period: half the configured refresh interval (see the constructor). */
export function tickIntervalMs(cfg: RedisStateConfig): number {
  return Math.max(5, Math.floor(cfg.refresh_interval_ms / 2));
}

/**
 * How long a silent instance still counts: a few refresh intervals (a slow tick or a GC pause is not
 * a death), at least 1 s, at most 4 s, so that with refresh intervals up to ~1 s a killed gateway
 * stops counting everywhere within 5 s (TTL + the reader's own refresh).
 */

export function livenessTtlMs(cfg: RedisStateConfig): number {
  const clamped = Math.min(4_000, Math.max(1_000, 4 * cfg.refresh_interval_ms));
  return Math.max(clamped, 2 * cfg.refresh_interval_ms + cfg.command_timeout_ms);
}

export class RedisSync {
  readonly ttlMs: number;
  readonly keys: { instances: string; snapshots: string };
  readonly client: StateRedisClient;
  readonly #cfg: RedisStateConfig;
  readonly #opts: RedisSyncOptions;
  readonly #timer: NodeJS.Timeout;
  #busy: Promise<void> | null = null;
  #closed = false;
  #degraded = true;
  #lastError: string | null = 'not connected yet';
  #lastOkAt: number | null = null;
  #lastDurationMs: number | null = null;
  #peers = 0;
  #resolveReady!: () => void;
  readonly #ready = new Promise<void>((resolve) => {
    this.#resolveReady = resolve;
  });

  constructor(cfg: RedisStateConfig, opts: RedisSyncOptions) {
    this.#cfg = cfg;
    this.#opts = opts;
    this.ttlMs = livenessTtlMs(cfg);
    const tag = `{${cfg.key_prefix}}`;
    this.keys = { instances: `${tag}:instances`, snapshots: `${tag}:snapshots` };
    this.client = createRedisClient(cfg);
    this.client.defineCommand('slagateSync', { numberOfKeys: 2, lua: SYNC_SCRIPT });
    // Without a listener ioredis reports every failed reconnect as an unhandled error.
    this.client.on('error', (e: Error) => {
      this.#lastError = e.message;
    });
    // Reconnected: publish at once rather than at the next interval.
    this.client.on('ready', () => void this.tick());
    // Every exchange both publishes and reads, so a change waits at most one tick here and one on
    // the peer: ticking at half the refresh interval keeps that within refresh_interval_ms.
    this.#timer = setInterval(() => void this.tick(), tickIntervalMs(cfg));
    this.#timer.unref();
    void this.tick();
  }

  /** Resolves once the first exchange has succeeded or failed. */
  ready(): Promise<void> {
    return this.#ready;
  }

  status(): StoreStatus {
    return {
      store: 'redis',
      degraded: this.#degraded,
      lastError: this.#lastError,
      lastSyncAgeMs: this.#lastOkAt === null ? null : Math.max(0, this.#opts.now() - this.#lastOkAt),
      lastSyncDurationMs: this.#lastDurationMs,
      peers: this.#degraded ? 0 : this.#peers,
    };
  }

  /** One exchange; a no-op while another is in flight. */
  tick(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    if (this.#busy === null) {
      this.#busy = this.#exchange().finally(() => {
        this.#busy = null;
        this.#resolveReady();
      });
    }
    return this.#busy;
  }

  async #exchange(): Promise<void> {
    const { now } = this.#opts;
    const started = performance.now();
    try {
      const client = this.client;
      if (client.status === 'wait') {
        await bounded(
          client.connect(),
          this.#cfg.connect_timeout_ms + this.#cfg.command_timeout_ms,
          'connect',
        );
      }
      if (client.status !== 'ready') throw new Error(`redis connection ${client.status}`);
      const at = now();
      const reply = await bounded(
        (client as unknown as SyncCommand).slagateSync(
          this.keys.instances,
          this.keys.snapshots,
          this.#opts.instanceId,
          this.#opts.host.snapshot(at),
          this.ttlMs,
          MAX_INSTANCES,
        ),
        this.#cfg.command_timeout_ms,
        'sync',
      );
      const peers = parseReply(reply);
      if (this.#closed) return;
      this.#opts.host.applyPeers(peers, now());
      this.#peers = peers.length;
      this.#lastOkAt = now();
      if (this.#degraded) {
        this.#degraded = false;
        this.#lastError = null;
        this.#opts.logger?.info({ peers: peers.length }, 'state store reachable: sharing state');
      }
    } catch (e) {
      this.#lastError = e instanceof Error ? e.message : String(e);
      if (!this.#degraded) {
        this.#degraded = true;
        this.#opts.logger?.warn({ err: this.#lastError }, 'state store unreachable: serving on local state');
      }
    } finally {
      this.#lastDurationMs = performance.now() - started;
    }
  }

  /** Stops the timer, withdraws this instance (best effort, bounded) and disconnects. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    await this.#busy;
    if (this.client.status === 'ready') {
      const leave = this.client
        .pipeline()
        .zrem(this.keys.instances, this.#opts.instanceId)
        .hdel(this.keys.snapshots, this.#opts.instanceId)
        .exec();
      await bounded(leave, this.#cfg.command_timeout_ms, 'leave').catch(() => {});
    }
    this.client.disconnect();
    this.#resolveReady();
  }
}

/** The script returns [id, snapshot, id, snapshot, ...]; only the snapshots are needed. */
function parseReply(reply: unknown): string[] {
  if (!Array.isArray(reply)) throw new Error('unexpected reply from the sync script');
  const out: string[] = [];
  for (let i = 1; i < reply.length; i += 2) {
    const s = reply[i];
    if (typeof s === 'string') out.push(s);
  }
  return out;
}

/** Rejects after `ms` whatever `p` does; a late rejection of `p` is swallowed. */
function bounded<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`redis ${what} timed out after ${ms} ms`)), ms);
  });
  p.catch(() => {});
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}
