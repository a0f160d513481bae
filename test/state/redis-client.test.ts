// What the Redis client is built with for each topology, without connecting (the clients are
// lazy), and which error replies mean the server has turned replica.
import type { Cluster, Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import type { RedisStateConfig } from '../../src/config/index.ts';
import { createRedisClient } from '../../src/state/redis-client.ts';
import { READONLY } from '../../src/state/redis-sync.ts';

const clients: { disconnect(): void }[] = [];
afterEach(() => {
  for (const c of clients.splice(0)) c.disconnect();
});

function config(over: Partial<RedisStateConfig>): RedisStateConfig {
  return {
    store: 'redis',
    redis_url: 'redis://127.0.0.1:6379',
    key_prefix: 'slagate',
    connect_timeout_ms: 500,
    command_timeout_ms: 500,
    refresh_interval_ms: 250,
    inflight_interval_ms: 50,
    topology: 'standalone',
    sentinels: [],
    sentinel_name: 'mymaster',
    cluster_nodes: [],
    ...over,
  };
}

describe('createRedisClient', () => {
  it('speaks TLS to the primary a sentinel names when the URL is rediss:, plain text for redis:', () => {
    const sentinel = (url: string) => {
      const c = createRedisClient(
        config({ topology: 'sentinel', redis_url: url, sentinels: ['127.0.0.1:26379'] }),
      ) as Redis;
      clients.push(c);
      return c.options;
    };
    expect(sentinel('rediss://:pw@primary:6380')).toMatchObject({
      enableTLSForSentinelMode: true,
      tls: true,
    });
    expect(sentinel('redis://:pw@primary:6379').enableTLSForSentinelMode).toBe(false);
  });

  it('seeds a cluster from an IPv6 redis_url without its brackets', () => {
    const c = createRedisClient(config({ topology: 'cluster', redis_url: 'redis://[::1]:7000' })) as Cluster;
    clients.push(c);
    expect((c as unknown as { startupNodes: unknown[] }).startupNodes).toEqual([{ host: '::1', port: 7000 }]);
  });
});

describe('READONLY', () => {
  it("matches a replica's refusal, bare (Redis 7) or inside a script's error (Redis 6 and earlier)", () => {
    expect(READONLY.test("READONLY You can't write against a read only replica. script: abc")).toBe(true);
    expect(
      READONLY.test(
        "ERR Error running script (call to f_abc): @user_script:3: @user_script: 3: -READONLY You can't write against a read only replica.",
      ),
    ).toBe(true);
    expect(READONLY.test('WRONGTYPE Operation against a key holding the wrong kind of value')).toBe(false);
    expect(READONLY.test('ERR unknown command, with args beginning with: READONLYX')).toBe(false);
  });
});
