import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import {
  CONFIG_INVALID,
  CONFIG_UNREADABLE,
  type Config,
  ConfigError,
  loadConfigFile,
  parseConfig,
} from '../../src/config/index.ts';
import { livenessTtlMs } from '../../src/state/index.ts';

const root = (p: string) => fileURLToPath(new URL(`../../${p}`, import.meta.url));
const fixture = (name: string) => root(`test/fixtures/config/${name}`);

const HASH_A = 'a'.repeat(64);
const HASH_B = 'b'.repeat(64);

// biome-ignore lint/suspicious/noExplicitAny: each case reaches into a different part of a YAML document.
type Draft = Record<string, any>;

/** A valid configuration as a plain object; each case edits a copy and expects specific issues. */
function base(): Draft {
  return {
    models: ['m1'],
    backends: [
      { name: 'gpu-0', url: 'http://127.0.0.1:8000' },
      { name: 'gpu-1', url: 'http://127.0.0.1:8001' },
    ],
    sla: {
      default_class: 'interactive',
      classes: {
        interactive: { ttft_p99_ms: 500, tpot_p99_ms: 50, priority: 0 },
        batch: { ttft_p99_ms: 30000, tpot_p99_ms: 200, priority: 2, sheddable: true },
      },
    },
    tenants: [
      { name: 'team-a', api_key_sha256: HASH_A, class: 'interactive', allowed_classes: ['interactive'] },
    ],
  };
}

function issuesOf(text: string, source = 'test.yaml'): ConfigError['issues'] {
  try {
    parseConfig(text, source);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as ConfigError).issues;
  }
  throw new Error('expected the configuration to be rejected');
}

const issuesFor = (edit: (c: Draft) => void) => {
  const config = base();
  edit(config);
  return issuesOf(stringify(config));
};

function expectFrozenDeep(value: unknown, where = 'config'): void {
  if (typeof value !== 'object' || value === null) return;
  expect(Object.isFrozen(value), `${where} is frozen`).toBe(true);
  for (const [key, child] of Object.entries(value)) expectFrozenDeep(child, `${where}.${key}`);
}

describe('the default config/gateway.yaml', () => {
  it('validates and describes the simulated fleet npm start serves', () => {
    const config = loadConfigFile(root('config/gateway.yaml'));
    expect(config.server).toMatchObject({ host: '127.0.0.1', port: 8080 });
    expect(config.models).toEqual(['meta-llama/Llama-3.1-8B-Instruct']);
    expect(config.backends).toEqual([]);
    expect(config.simulate).toEqual({
      replicas: 4,
      profile: 'llama3-8b-h100',
      time_scale: 1,
      seed: 0,
      model: 'meta-llama/Llama-3.1-8B-Instruct',
    });
    expect(config.state).toEqual({ store: 'memory' });
    expect(config.sla.default_class).toBe('interactive');
    expect(config.sla.classes).toEqual({
      interactive: { ttft_p99_ms: 500, tpot_p99_ms: 50, priority: 0, sheddable: false },
      completion: { ttft_p99_ms: 200, tpot_p99_ms: 30, priority: 0, sheddable: false },
      batch: { ttft_p99_ms: 30000, tpot_p99_ms: 200, priority: 2, sheddable: true },
    });
    expect(config.tenants).toEqual([]);
  });
});

describe('defaults', () => {
  it('fill every optional key of a minimal file', () => {
    const config = loadConfigFile(fixture('minimal.yaml'));
    expect(config.server).toEqual({
      host: '127.0.0.1',
      port: 8080,
      body_limit_bytes: 4 * 1024 * 1024,
      keep_alive_timeout_ms: 72000,
      shutdown_grace_ms: 30000,
    });
    expect(config.backends).toEqual([{ name: 'gpu-0', url: 'http://127.0.0.1:8000', weight: 1 }]);
    expect(config.simulate).toBeUndefined();
    expect(config.state).toEqual({ store: 'memory' });
    expect(Object.keys(config.sla.classes)).toEqual(['interactive', 'completion', 'batch']);
    expect(config.scheduler).toEqual({
      policy: 'slagate',
      max_queue: 1024,
      aging_ms: 5000,
      seeds: true,
      concurrency: {
        min: 4,
        max: 256,
        initial: 16,
        interval_ms: 250,
        outer_periods: 20,
        ttft_share: 0.25,
        tpot_share: 0.8,
        prefill_tokens: 2048,
      },
    });
    expect(config.router).toEqual({
      policy: 'slagate',
      block_size_tokens: 64,
      explore_ratio: 0.01,
      session_header: 'x-session-id',
    });
    expect(config.upstream.outlier).toEqual({
      consecutive_failures: 5,
      base_ejection_ms: 30000,
      max_ejection_ms: 300000,
      max_ejection_percent: 50,
    });
    expect(config.upstream.breaker).toEqual({
      error_threshold_percentage: 50,
      volume_threshold: 10,
      reset_timeout_ms: 30000,
      rolling_window_ms: 10000,
    });
    expect(config.upstream.retries).toBe(2);
    expect(config.upstream.first_token_timeout_factor).toBe(4);
    expect(config.upstream.forward_priority).toBe(false);
    expect(config.logging).toEqual({ level: 'info', admission_log: 'stdout' });
  });

  it('keep every value a file sets', () => {
    const config = loadConfigFile(fixture('full.yaml'));
    expect(config.server.port).toBe(9090);
    expect(config.state).toEqual({
      store: 'redis',
      redis_url: 'redis://:s3cret@127.0.0.1:6379/0',
      key_prefix: 'slagate-test',
      connect_timeout_ms: 1000,
      command_timeout_ms: 50,
      refresh_interval_ms: 250,
      inflight_interval_ms: 40,
      topology: 'standalone',
      sentinels: [],
      sentinel_name: 'mymaster',
      cluster_nodes: [],
    });
    expect(config.scheduler.concurrency).toEqual({
      min: 2,
      max: 64,
      initial: 8,
      interval_ms: 250,
      outer_periods: 20,
      ttft_share: 0.3,
      tpot_share: 0.9,
      prefill_tokens: 4096,
    });
    expect(config.upstream).toMatchObject({ first_token_timeout_factor: 3, forward_priority: true });
    expect(config.router.policy).toBe('cache_aware');
    expect(config.upstream.outlier.max_ejection_percent).toBe(34);
    expect(config.tenants[0]).toMatchObject({
      max_concurrency: 64,
      tokens_per_minute: 2000000,
      isolate_prefix_cache: true,
    });
  });

  it('derive the keys that depend on others', () => {
    const config = loadConfigFile(fixture('full.yaml'));
    // team-b names neither class nor allowed_classes.
    expect(config.tenants[1]).toEqual({
      name: 'team-b',
      api_key_sha256: 'fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9',
      class: 'interactive',
      allowed_classes: ['interactive'],
      isolate_prefix_cache: false,
    });
    const sim = parseConfig('models: [a, b]\nsimulate: { replicas: 2 }\n', 'sim.yaml');
    expect(sim.simulate?.model).toBe('a');
    const low = parseConfig(
      'models: [a]\nsimulate: { replicas: 1 }\nscheduler: { concurrency: { max: 8 } }',
      'x',
    );
    expect(low.scheduler.concurrency).toMatchObject({ min: 4, max: 8, initial: 8 });
    const high = parseConfig(
      'models: [a]\nsimulate: { replicas: 1 }\nscheduler: { concurrency: { min: 32 } }',
      'x',
    );
    expect(high.scheduler.concurrency.initial).toBe(32);
  });

  it('list keys in schema order whatever order the file used', () => {
    const config = parseConfig(
      'logging: { admission_log: a.log, level: warn }\nsimulate: {replicas: 1}\nmodels: [m]',
      'x',
    );
    expect(Object.keys(config).slice(0, 4)).toEqual(['server', 'models', 'backends', 'simulate']);
    expect(Object.keys(config.logging)).toEqual(['level', 'admission_log']);
  });

  it('never show a secret written where a name or an address belongs', () => {
    const issues = issuesFor((c) => {
      c.backends[0].api_key_env = 'sk-live-9f8eSECRET1';
      // A key that is also a valid variable name (unset, as keys are): the check that it is set
      // must not repeat it either.
      c.backends[1].api_key_env = 'sk_live_4eC39HqLSECRET4';
      c.tenants[0].api_key_sha256 = 'sk-proj-SECRET2';
      c.tenants.push({ name: 'team-b', api_key_sha256: 'sk-proj-SECRET2', class: 'interactive' });
      c.state = {
        store: 'redis',
        topology: 'sentinel',
        redis_url: 'redis://h:6379',
        sentinels: ['redis://:S3CRET3@10.0.0.6:26379'],
      };
    });
    const paths = issues.map((i) => i.path);
    expect(paths).toEqual(
      expect.arrayContaining([
        'backends[0].api_key_env',
        'backends[1].api_key_env',
        'tenants[0].api_key_sha256',
        'tenants[1].api_key_sha256',
        'state.sentinels[0]',
      ]),
    );
    for (const i of issues) expect(i.message).not.toMatch(/SECRET/);
  });

  it('a listen address with a scheme or a port, and one server listed under two names', () => {
    for (const host of ['http://127.0.0.1', '127.0.0.1:8080', 'gw.local/x']) {
      const issues = issuesFor((c) => (c.server = { host }));
      expect(issues.map((i) => i.path)).toEqual(['server.host']);
    }
    expect(issuesFor((c) => (c.server = { host: '[::1]' }))[0]!.message).toMatch(/without its brackets/);
    for (const host of ['0.0.0.0', '::', '::1', 'gateway.internal', '::ffff:127.0.0.1', 'fe80::1%eth0']) {
      const c = base();
      c.server = { host };
      expect(parseConfig(stringify(c), 'x').server.host).toBe(host);
    }
    const issues = issuesFor((c) => c.backends.push({ name: 'gpu-0-again', url: 'http://127.0.0.1:8000/' }));
    expect(issues).toEqual([
      expect.objectContaining({
        path: 'backends[2].url',
        message: expect.stringMatching(/duplicate backend URL .* \(first at index 0\)/),
      }),
    ]);
  });

  it('concurrency min past max and initial past max, both in one run', () => {
    const issues = issuesFor((c) => (c.scheduler = { concurrency: { min: 5, max: 3, initial: 100 } }));
    expect(issues.map((i) => i.path)).toEqual(['scheduler.concurrency.min', 'scheduler.concurrency.initial']);
  });

  it('keep a class named like a property every object inherits', () => {
    const c = base();
    c.sla.default_class = 'constructor';
    c.sla.classes = {
      constructor: { ttft_p99_ms: 500, tpot_p99_ms: 50, priority: 0 },
      toString: { ttft_p99_ms: 800, tpot_p99_ms: 60, priority: 1 },
    };
    c.tenants[0].class = 'constructor';
    c.tenants[0].allowed_classes = ['constructor', 'toString'];
    const config = parseConfig(stringify(c), 'x');
    expect(Object.keys(config.sla.classes)).toEqual(['constructor', 'toString']);
    expect(config.sla.classes.constructor).toMatchObject({ ttft_p99_ms: 500, tpot_p99_ms: 50 });
  });
});

describe('the loaded configuration', () => {
  it('is deep-frozen', () => {
    const config: Config = loadConfigFile(fixture('full.yaml'));
    expectFrozenDeep(config);
    expect(() => {
      (config.sla.classes.interactive as { ttft_p99_ms: number }).ttft_p99_ms = 1;
    }).toThrow(TypeError);
    expect(() => (config.backends as unknown[]).push({})).toThrow(TypeError);
  });
});

describe('violations are reported with the path of the key to fix', () => {
  const cases: [string, (c: Draft) => void, string, RegExp][] = [
    ['unknown top-level key', (c) => (c.routing = {}), 'routing', /unknown key/],
    ['misspelt nested key', (c) => (c.server = { prot: 80 }), 'server.prot', /did you mean 'port'/],
    [
      'unknown key in a class',
      (c) => (c.sla.classes.batch.deadline = 1),
      'sla.classes.batch.deadline',
      /unknown key \(allowed: ttft_p99_ms/,
    ],
    [
      'unknown key in a list item',
      (c) => (c.backends[1].wieght = 2),
      'backends[1].wieght',
      /did you mean 'weight'/,
    ],
    ['wrong type', (c) => (c.server = { port: '80a' }), 'server.port', /must be an integer \(got "80a"\)/],
    ['out of range', (c) => (c.server = { port: 70000 }), 'server.port', /must be <= 65535/],
    ['missing required key', (c) => delete c.backends[0].url, 'backends[0].url', /is required/],
    [
      'not in an enum',
      (c) => (c.router = { policy: 'random' }),
      'router.policy',
      /one of: slagate, round_robin/,
    ],
    ['empty models', (c) => (c.models = []), 'models', /at least 1 item/],
    ['no classes', (c) => (c.sla.classes = {}), 'sla.classes', /at least 1 entry/],
    [
      'bad backend URL',
      (c) => (c.backends[1].url = 'localhost:8000'),
      'backends[1].url',
      /scheme http or https/,
    ],
    ['URL with credentials', (c) => (c.backends[0].url = 'http://u:p@h:1'), 'backends[0].url', /credentials/],
    [
      'backend URL with a path (it would be dropped)',
      (c) => (c.backends[0].url = 'http://lb:8000/replica-1'),
      'backends[0].url',
      /must not have a path.*"http:\/\/lb:8000\/replica-1"/,
    ],
    [
      'duplicate backend',
      (c) => (c.backends[1].name = 'gpu-0'),
      'backends[1].name',
      /duplicate backend name/,
    ],
    ['duplicate model', (c) => (c.models = ['m1', 'm1']), 'models[1]', /duplicate model "m1"/],
    [
      'unknown default class',
      (c) => (c.sla.default_class = 'chat'),
      'sla.default_class',
      /unknown SLA class "chat"/,
    ],
    ['bad class name', (c) => (c.sla.classes['gold tier'] = {}), 'sla.classes["gold tier"]', /invalid name/],
    [
      'non-positive target',
      (c) => (c.sla.classes.batch.tpot_p99_ms = 0),
      'sla.classes.batch.tpot_p99_ms',
      /> 0/,
    ],
    [
      'tenant with unknown class',
      (c) => (c.tenants[0].class = 'gold'),
      'tenants[0].class',
      /unknown SLA class/,
    ],
    [
      'tenant allowed class unknown',
      (c) => (c.tenants[0].allowed_classes = ['interactive', 'gold']),
      'tenants[0].allowed_classes[1]',
      /unknown SLA class "gold"/,
    ],
    [
      'tenant class not allowed',
      (c) => (c.tenants[0].allowed_classes = ['batch']),
      'tenants[0].allowed_classes',
      /must include the tenant's class "interactive"/,
    ],
    ['unsafe tenant name', (c) => (c.tenants[0].name = 'a:b'), 'tenants[0].name', /letters, digits/],
    ['seeds not a boolean', (c) => (c.scheduler = { seeds: 1 }), 'scheduler.seeds', /boolean/],
    [
      'isolation not a boolean',
      (c) => (c.tenants[0].isolate_prefix_cache = 'yes'),
      'tenants[0].isolate_prefix_cache',
      /boolean/,
    ],
    [
      'bad key hash',
      (c) => (c.tenants[0].api_key_sha256 = 'ABC'),
      'tenants[0].api_key_sha256',
      /64 lowercase hex/,
    ],
    [
      'duplicate tenant',
      (c) => c.tenants.push({ name: 'team-a', api_key_sha256: HASH_B }),
      'tenants[1].name',
      /duplicate tenant name "team-a"/,
    ],
    [
      'shared API key',
      (c) => c.tenants.push({ name: 'team-b', api_key_sha256: HASH_A }),
      'tenants[1].api_key_sha256',
      /duplicate API key hash/,
    ],
    [
      'concurrency min above max',
      (c) => (c.scheduler = { concurrency: { min: 9, max: 8 } }),
      'scheduler.concurrency.min',
      /<= scheduler.concurrency.max \(8\)/,
    ],
    [
      'initial outside min..max',
      (c) => (c.scheduler = { concurrency: { min: 2, max: 8, initial: 9 } }),
      'scheduler.concurrency.initial',
      /between scheduler.concurrency.min \(2\) and scheduler.concurrency.max \(8\)/,
    ],
    [
      'initial below the default min: the default named',
      (c) => (c.scheduler = { concurrency: { initial: 2 } }),
      'scheduler.concurrency.initial',
      /between scheduler.concurrency.min \(4, its default\) and scheduler.concurrency.max \(256, its default\) \(got 2\)/,
    ],
    [
      'ejection base above cap',
      (c) => (c.upstream = { outlier: { base_ejection_ms: 5000, max_ejection_ms: 1000 } }),
      'upstream.outlier.base_ejection_ms',
      /<= upstream.outlier.max_ejection_ms/,
    ],
    [
      'a backend named "none", the metrics\' label for no backend',
      (c) => c.backends.push({ name: 'none', url: 'http://127.0.0.1:9' }),
      'backends[2].name',
      /"none" is reserved/,
    ],
    [
      "a backend's key in a variable that is not set",
      (c) =>
        c.backends.push({ name: 'keyed', url: 'http://127.0.0.1:9', api_key_env: 'SLAGATE_TEST_UNSET_KEY' }),
      'backends[2].api_key_env',
      /environment variable SLAGATE_TEST_UNSET_KEY is not set/,
    ],
    [
      "a backend's key with a character no header carries (the value is never printed)",
      (c) => {
        process.env.SLAGATE_TEST_BAD_KEY = 'sk-ab\ncd';
        c.backends.push({ name: 'keyed', url: 'http://127.0.0.1:9', api_key_env: 'SLAGATE_TEST_BAD_KEY' });
      },
      'backends[2].api_key_env',
      /^environment variable SLAGATE_TEST_BAD_KEY holds characters a header cannot carry \(control characters or non-ASCII\)$/,
    ],
    [
      "a backend's key in a variable named like a method of every object, which is not set",
      (c) => c.backends.push({ name: 'keyed', url: 'http://127.0.0.1:9', api_key_env: 'constructor' }),
      'backends[2].api_key_env',
      /is not set/,
    ],
    [
      'a backend on port 0, which no connection can use',
      (c) => c.backends.push({ name: 'zero', url: 'http://127.0.0.1:0' }),
      'backends[2].url',
      /port 0/,
    ],
    [
      'a Redis URL on port 0',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://127.0.0.1:0' }),
      'state.redis_url',
      /port 0/,
    ],
    [
      "a backend's key variable that is no variable name",
      (c) => c.backends.push({ name: 'keyed', url: 'http://127.0.0.1:9', api_key_env: '1-KEY' }),
      'backends[2].api_key_env',
      /environment variable's name/,
    ],
    [
      'connection pool below the concurrency cap',
      (c) => (c.upstream = { max_connections_per_backend: 100 }),
      'upstream.max_connections_per_backend',
      />= scheduler.concurrency.max \(256, its default\) \(got 100\)/,
    ],
    [
      'concurrency cap above the default connection pool: at the key written',
      (c) => (c.scheduler = { concurrency: { max: 1024 } }),
      'scheduler.concurrency.max',
      /<= upstream.max_connections_per_backend \(512, its default\) \(got 1024\)/,
    ],
    [
      'concurrency max below the default min: at the key written',
      (c) => (c.scheduler = { concurrency: { max: 2 } }),
      'scheduler.concurrency.max',
      />= scheduler.concurrency.min \(4, its default\) \(got 2\)/,
    ],
    [
      'base ejection above the default max: at the key written',
      (c) => (c.upstream = { outlier: { base_ejection_ms: 999_999 } }),
      'upstream.outlier.base_ejection_ms',
      /<= upstream.outlier.max_ejection_ms \(\d+, its default\)/,
    ],
    ['unknown store', (c) => (c.state = { store: 'etcd' }), 'state.store', /one of: memory, redis/],
    ['redis without URL', (c) => (c.state = { store: 'redis' }), 'state.redis_url', /is required/],
    [
      'sentinel with no sentinels, reported beside a missing URL',
      (c) => (c.state = { store: 'redis', topology: 'sentinel' }),
      'state.sentinels',
      /at least one sentinel/,
    ],
    [
      'sentinels listed for a standalone Redis (they would be ignored)',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://h:6379', sentinels: ['s1:26379'] }),
      'state.sentinels',
      /only when topology is 'sentinel'/,
    ],
    [
      'cluster nodes listed for a sentinel Redis',
      (c) =>
        (c.state = {
          store: 'redis',
          topology: 'sentinel',
          redis_url: 'redis://h:6379',
          sentinels: ['s1:26379'],
          cluster_nodes: ['n1:6379'],
        }),
      'state.cluster_nodes',
      /only when topology is 'cluster'/,
    ],
    [
      'a redis URL whose path is no database number (it silently meant database 0)',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://:pw@h:6379/abc' }),
      'state.redis_url',
      /^its path must be a database number \(got "redis:\/\/:\*\*\*@h:6379\/abc"\)$/,
    ],
    [
      "a Redis password with a '%' that starts no escape (the client would throw at start, naming no key)",
      (c) => (c.state = { store: 'redis', redis_url: 'redis://:pa%zzss@h:6379' }),
      'state.redis_url',
      /^its user name or password has a '%' that is not a valid escape; write a '%' as %25 \(got "redis:\/\/:\*\*\*@h:6379"\)$/,
    ],
    [
      'a Redis URL that is no URL at all, perhaps the password alone: not shown',
      (c) => (c.state = { store: 'redis', redis_url: 'hunter2' }),
      'state.redis_url',
      /^must be a redis:\/\/ or rediss:\/\/ URL \(got a value not shown here\)$/,
    ],
    [
      'a Redis user and password pasted without the scheme (it parses as a URL of scheme "default:"): not shown',
      (c) => (c.state = { store: 'redis', redis_url: 'default:hunter2' }),
      'state.redis_url',
      /^must be a redis:\/\/ or rediss:\/\/ URL \(got a value not shown here\)$/,
    ],
    [
      'a database other than 0 for a Redis cluster (it has only database 0)',
      (c) => (c.state = { store: 'redis', topology: 'cluster', redis_url: 'redis://h:6379/3' }),
      'state.redis_url',
      /a cluster has only database 0/,
    ],
    [
      'redis key typo',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://h:6379', key_prefx: 'x' }),
      'state.key_prefx',
      /did you mean 'key_prefix'/,
    ],
    [
      'redis URL scheme',
      (c) => (c.state = { store: 'redis', redis_url: 'http://h:6379' }),
      'state.redis_url',
      /scheme redis or rediss/,
    ],
    [
      'a duration past what a timer can wait (it would fire after 1 ms)',
      (c) => (c.upstream = { first_token_timeout_ms: 2 ** 31 }),
      'upstream.first_token_timeout_ms',
      /2147483647/,
    ],
    [
      'a class target past what a timer can wait',
      (c) => (c.sla = { classes: { interactive: { ttft_p99_ms: 1e12, tpot_p99_ms: 50, priority: 0 } } }),
      'sla.classes.interactive.ttft_p99_ms',
      /2147483647/,
    ],
    [
      'a bad redis URL does not show its password',
      (c) => (c.state = { store: 'redis', redis_url: 'http://:hunter2@h:6379' }),
      'state.redis_url',
      /scheme redis or rediss \(got "http:\/\/:\*\*\*@h:6379"\)/,
    ],
    [
      'a redis URL that does not parse does not show its password (a base64 one holds "/")',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://:Zk3q/9Xa+Pw2mN8s@h:6379/0' }),
      'state.redis_url',
      /^must be an absolute URL \(got "redis:\/\/:\*\*\*@h:6379\/0"\)$/,
    ],
    [
      'a redis URL with a query does not show a password holding ":" and "@"',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://app:pa:ss@word@h:6379/0?db=1' }),
      'state.redis_url',
      /^must not have a query or fragment \(got "redis:\/\/app:\*\*\*@h:6379\/0\?\*\*\*"\)$/,
    ],
    [
      'a redis URL that does not parse, with "?" in its password, shows none of it',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://user:se?cret@h:6379/0' }),
      'state.redis_url',
      /^must be an absolute URL \(got "redis:\/\/user:\*\*\*@h:6379\/0"\)$|^must not have a query or fragment \(got "redis:\/\/user:\*\*\*@h:6379\/0"\)$/,
    ],
    [
      'a redis URL with a password in its query does not show it',
      (c) => (c.state = { store: 'redis', redis_url: 'redis://h:6379?password=s3cr3t' }),
      'state.redis_url',
      /^must not have a query or fragment \(got "redis:\/\/h:6379\?\*\*\*"\)$/,
    ],
    [
      'memory store with redis keys',
      (c) => (c.state = { store: 'memory', redis_url: 'redis://h' }),
      'state.redis_url',
      /unknown key/,
    ],
    ['no backends and no simulate', (c) => (c.backends = []), 'backends', /no backends/],
    ['simulate beside backends', (c) => (c.simulate = { replicas: 2 }), 'simulate', /cannot be combined/],
    [
      'simulate model not served',
      (c) => {
        c.backends = [];
        c.simulate = { replicas: 2, model: 'other' };
      },
      'simulate.model',
      /must be one of models/,
    ],
    [
      'unknown simulator profile',
      (c) => {
        c.backends = [];
        c.simulate = { replicas: 2, profile: 'llama3-8b-h10' };
      },
      'simulate.profile',
      /unknown GPU profile "llama3-8b-h10" \(profiles: llama3-8b-h100/,
    ],
    ['bad log level', (c) => (c.logging = { level: 'verbose' }), 'logging.level', /one of: trace, debug/],
    [
      'bad session header',
      (c) => (c.router = { session_header: 'X Session' }),
      'router.session_header',
      /header name/,
    ],
  ];

  it.each(cases)('%s', (_name, edit, path, message) => {
    const issues = issuesFor(edit);
    const found = issues.find((issue) => issue.path === path);
    expect(found, `issue at ${path} among ${JSON.stringify(issues)}`).toBeDefined();
    expect(found!.message).toMatch(message);
  });

  it('an issue at a defaulted key is not reported twice', () => {
    // team-b has no class: it inherits the unknown default class, reported once at sla.default_class.
    const issues = issuesFor((c) => {
      c.sla.default_class = 'chat';
      c.tenants = [{ name: 'team-b', api_key_sha256: HASH_B }];
    });
    expect(issues.map((i) => i.path)).toEqual(['sla.default_class']);
  });

  it('an empty state section is the memory store, as the section left out is; one with other keys names its store', () => {
    const config = base();
    config.state = {};
    expect(parseConfig(stringify(config), 'test.yaml').state).toEqual({ store: 'memory' });
    const noStore = issuesFor((c) => {
      c.state = { redis_url: 'redis://h:6379' };
    });
    expect(noStore.map((i) => i.path)).toEqual(['state.store']);
    // Written but empty (null), or not a mapping: one issue, not a second as matching no store.
    for (const value of [null, 5, 'redis']) {
      const issues = issuesFor((c) => {
        c.state = value as never;
      });
      expect(issues).toEqual([
        expect.objectContaining({ path: 'state', message: expect.stringMatching(/must be a mapping/) }),
      ]);
    }
  });

  it('a key left out that derives from a wrong or missing one is not reported: the one it derives from is', () => {
    // Two tenants without a class or allowed_classes, and no default class to take them from.
    const noDefault = issuesFor((c) => {
      delete c.sla.default_class;
      c.tenants = [
        { name: 'team-b', api_key_sha256: HASH_B },
        { name: 'team-c', api_key_sha256: 'c'.repeat(64) },
      ];
    });
    expect(noDefault.map((i) => i.path)).toEqual(['sla.default_class']);
    // concurrency.initial comes from min and max; simulate.model from the first model.
    const badMin = issuesFor((c) => {
      c.scheduler = { concurrency: { min: 2.5 } };
    });
    expect(badMin.map((i) => i.path)).toEqual(['scheduler.concurrency.min']);
    const badModel = issuesFor((c) => {
      c.models = [1];
      c.simulate = { replicas: 2 };
      delete c.backends;
    });
    expect(badModel.map((i) => i.path)).toEqual(['models[0]']);
  });

  it('a root that is not a mapping', () => {
    expect(issuesOf('- a\n- b\n')).toEqual([
      { path: '', message: expect.stringMatching(/must be a mapping/) },
    ]);
    expect(issuesOf('')[0]?.message).toMatch(/got null/);
  });
});

describe('all violations come together', () => {
  it('with their paths and positions', () => {
    let error: ConfigError | undefined;
    try {
      loadConfigFile(fixture('many-errors.yaml'));
    } catch (err) {
      error = err as ConfigError;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect(error!.code).toBe(CONFIG_INVALID);
    expect(error!.issues.map((i) => [i.path, i.line])).toEqual([
      ['server.prot', 2],
      ['backends[1].name', 6],
      ['backends[1].url', 6],
      ['sla.default_class', 8],
      ['sla.classes.interactive.ttft_p99_ms', 10],
      ['tenants[0].api_key_sha256', 12],
      ['tenants[0].allowed_classes[1]', 12],
      ['scheduler.policy', 13],
      ['scheduler.concurrency.min', 13],
      ['upstream.retries', 14],
    ]);
    // The column points at the key: `  - { name: gpu-0, url: ...` has `url` at column 20.
    expect(error!.issues.find((i) => i.path === 'backends[1].url')?.column).toBe(20);
    // The message alone is enough for a log line: every path appears in it.
    for (const issue of error!.issues) expect(error!.message).toContain(issue.path);
  });
});

describe('YAML errors', () => {
  it('a syntax error is reported with its line and column', () => {
    const issues = (() => {
      try {
        loadConfigFile(fixture('syntax-error.yaml'));
      } catch (err) {
        return (err as ConfigError).issues;
      }
      return [];
    })();
    expect(issues).toHaveLength(1);
    expect(issues[0]).toMatchObject({ path: '', line: 4, column: 1 });
    expect(issues[0]!.message).toMatch(/^YAML syntax: Flow sequence/);
  });

  it('a repeated key is an error, not last-one-wins', () => {
    const issues = issuesOf('models: [a]\nsimulate: { replicas: 1 }\nmodels: [b]\n');
    expect(issues).toEqual([{ path: '', message: expect.stringMatching(/unique/), line: 3, column: 1 }]);
  });

  it('an unreadable file has its own code', () => {
    expect(() => loadConfigFile(fixture('does-not-exist.yaml'))).toThrow(
      expect.objectContaining({
        code: CONFIG_UNREADABLE,
        issues: [expect.objectContaining({ message: expect.stringMatching(/ENOENT/) })],
      }),
    );
  });
});

describe('state.topology', () => {
  const base = 'models: [m]\nbackends: [{ name: a, url: "http://127.0.0.1:8000" }]\n';
  it('requires sentinels with topology sentinel, and host:port entries', () => {
    let issues: readonly { path: string }[] = [];
    try {
      parseConfig(
        `${base}state: { store: redis, redis_url: "redis://127.0.0.1:6379", topology: sentinel }\n`,
        't',
      );
    } catch (err) {
      issues = (err as ConfigError).issues;
    }
    expect(issues.map((i) => i.path)).toContain('state.sentinels');
    try {
      parseConfig(`${base}state: { store: redis, redis_url: "redis://x:1", sentinels: [nope] }\n`, 't');
      issues = [];
    } catch (err) {
      issues = (err as ConfigError).issues;
    }
    expect(issues.map((i) => i.path)).toContain('state.sentinels[0]');
  });

  it('refuses a sentinel or cluster node whose port no connection can use, by path', () => {
    const issuesOf = (state: string): { path: string; message: string }[] => {
      try {
        parseConfig(`${base}state: ${state}\n`, 't');
        return [];
      } catch (err) {
        return [...(err as ConfigError).issues];
      }
    };
    const sentinel = (port: string) =>
      issuesOf(
        `{ store: redis, redis_url: "redis://x", topology: sentinel, sentinels: ["h:26379", "h:${port}"] }`,
      );
    for (const port of ['99999', '65536', '0', '080']) {
      const issues = sentinel(port);
      expect(issues.map((i) => i.path)).toEqual(['state.sentinels[1]']);
      expect(issues[0]!.message).toMatch(/port from 1 to 65535/);
    }
    for (const port of ['1', '6379', '65535']) expect(sentinel(port)).toEqual([]);
    const cluster = issuesOf(
      '{ store: redis, redis_url: "redis://x", topology: cluster, cluster_nodes: ["[::1]:70000"] }',
    );
    expect(cluster.map((i) => i.path)).toEqual(['state.cluster_nodes[0]']);
  });

  it('caps refresh_interval_ms at 1000 so dead instances vanish within 5 s', () => {
    expect(() =>
      parseConfig(
        `${base}state: { store: redis, redis_url: "redis://x:1", refresh_interval_ms: 2000 }\n`,
        't',
      ),
    ).toThrow(/state\.refresh_interval_ms/);
  });

  it('caps command_timeout_ms at 2000: the liveness TTL outlasts 2 refreshes and one command, and a dead instance must vanish within 5 s', () => {
    const state = (ms: number) =>
      `${base}state: { store: redis, redis_url: "redis://x:1", refresh_interval_ms: 1000, command_timeout_ms: ${ms} }\n`;
    expect(() => parseConfig(state(2001), 't')).toThrow(/state\.command_timeout_ms/);
    const c = parseConfig(state(2000), 't').state;
    if (c.store !== 'redis') throw new Error('a redis store was configured');
    expect(livenessTtlMs(c)).toBe(4000);
  });
});
