// The ioredis client for the shared state, built so that Redis can never hold a request or the
// process back (research/reliability.md §4):
// - enableOfflineQueue false: while disconnected a command fails at once instead of queueing
//   without bound (ioredis #76) and being replayed on reconnect;
// - autoResendUnfulfilledCommands false: a command sent just before the connection dropped is not
//   resent either; RedisSync drops the connection when a call times out, so a Redis that stalls
//   finds at most that one call on its socket when it wakes, never a backlog of ticks;
// - commandTimeout and connectTimeout from the config (a sentinel's commands too); maxRetriesPerRequest 1;
// - lazyConnect: constructing the client never throws and never blocks startup;
// - reconnect forever, backing off to 1 s, so recovery is noticed within about a second.
// The caller must attach an 'error' listener (RedisSync does) or ioredis logs unhandled errors.

import { Cluster, Redis, type RedisOptions } from 'ioredis';
import type { RedisStateConfig } from '../config/index.ts';

export type StateRedisClient = Redis | Cluster;

const RECONNECT_CAP_MS = 1_000;

function safeOptions(cfg: RedisStateConfig): RedisOptions {
  return {
    lazyConnect: true,
    enableOfflineQueue: false,
    autoResendUnfulfilledCommands: false,
    enableAutoPipelining: false,
    maxRetriesPerRequest: 1,
    commandTimeout: cfg.command_timeout_ms,
    connectTimeout: cfg.connect_timeout_ms,
    // A dropped connection whose peer does not close it (a frozen Redis, a lost route) is
    // destroyed after this, so the client reconnects instead of holding a half-closed socket.
    disconnectTimeout: cfg.command_timeout_ms,
    retryStrategy: (times: number) => Math.min(100 * times, RECONNECT_CAP_MS),
  };
}

/** An IPv6 address as a URL writes it, `[fd00::5]`, without its brackets, as sockets take it. */
const unbracketed = (host: string): string => host.replace(/^\[|\]$/g, '');

/** host:port (IPv6 hosts in brackets) as ioredis wants it. */
function node(hostPort: string): { host: string; port: number } {
  const i = hostPort.lastIndexOf(':');
  return { host: unbracketed(hostPort.slice(0, i)), port: Number(hostPort.slice(i + 1)) };
}

/** The config's `topology` picks the client: standalone, through sentinels, or a cluster. */
export function createRedisClient(cfg: RedisStateConfig): StateRedisClient {
  const options = safeOptions(cfg);
  if (cfg.topology === 'standalone') return new Redis(cfg.redis_url, options);
  if (cfg.topology === 'sentinel') {
    // ioredis takes credentials and db from the URL and, given `sentinels`, ignores its host.
    return new Redis(cfg.redis_url, {
      ...options,
      sentinels: cfg.sentinels.map(node),
      name: cfg.sentinel_name,
      sentinelRetryStrategy: (times: number) => Math.min(100 * times, RECONNECT_CAP_MS),
      // A sentinel that accepts and never answers is given up on after this and the next one is
      // asked; without it the client waited on that one for good, and its socket kept the process
      // alive after close().
      sentinelCommandTimeout: cfg.command_timeout_ms,
      // ioredis reads `rediss:` into `tls` but, with sentinels, uses it for the primary only when
      // told to: without this the primary was spoken to in plain text (the sentinels are asked
      // in plain text either way, as ioredis does unless given sentinelTLS).
      enableTLSForSentinelMode: new URL(cfg.redis_url).protocol === 'rediss:',
    });
  }
  const url = new URL(cfg.redis_url);
  const seed =
    cfg.cluster_nodes.length > 0
      ? cfg.cluster_nodes.map(node)
      : [{ host: unbracketed(url.hostname), port: Number(url.port || 6379) }];
  const { lazyConnect, enableOfflineQueue, retryStrategy, ...nodeOptions } = options;
  return new Cluster(seed, {
    lazyConnect,
    enableOfflineQueue,
    clusterRetryStrategy: retryStrategy,
    redisOptions: {
      ...nodeOptions,
      ...(url.username ? { username: decodeURIComponent(url.username) } : {}),
      ...(url.password ? { password: decodeURIComponent(url.password) } : {}),
      ...(url.protocol === 'rediss:' ? { tls: {} } : {}),
    },
  });
}
