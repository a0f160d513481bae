// Rules a JSON schema cannot state: references between sections, uniqueness, URL shapes and ordered
// bounds. They run on the defaulted value even when the schema found problems (so one run reports
// everything), hence every rule first checks the types it relies on.
import { PROFILES } from '../sim/profiles.ts';
import { isRecord, type Path, renderPath } from './path.ts';
import { ENV_NAME } from './schema.ts';
import { mayHoldSecret, type RawIssue, show } from './validate.ts';

const ENV_NAME_RE = new RegExp(ENV_NAME);

type Obj = Record<string, unknown>;

const list = (value: unknown): unknown[] => (Array.isArray(value) ? value : []);
const int = (value: unknown): value is number => Number.isInteger(value);

/**
 * `written`: whether the file holds the key at a path (one the loader did not fill with its
 * default): a rule between two keys is reported at the one the user wrote.
 */
export function crossFieldIssues(config: Obj, written: (path: Path) => boolean = () => true): RawIssue[] {
  const issues: RawIssue[] = [];
  const add = (path: Path, message: string) => issues.push({ path, message });

  duplicates(config.models, (m) => (typeof m === 'string' ? m : undefined), ['models'], 'model', add);
  checkServer(config, add);
  checkBackends(config, add);
  checkSla(config, add);
  checkTenants(config, add);
  checkOrdering(config, add, written);
  return issues;
}

/** A key as a message names another: its path and value, and whether that value is a default. */
function namedKey(path: Path, value: number, written: (path: Path) => boolean): string {
  return `${renderPath(path)} (${value}${written(path) ? '' : ', its default'})`;
}

/**
 * `low` ≤ `high` does not hold: reported at the side `at` names, unless only the other is in the
 * file (that side is a default the user never wrote, and a position at its section or nowhere
 * would not lead to the key to change), then at the other. A default compared with is named as one.
 */
function misordered(
  low: { path: Path; value: number },
  high: { path: Path; value: number },
  at: 'low' | 'high',
  add: Add,
  written: (path: Path) => boolean,
): void {
  const named = (side: { path: Path; value: number }) => namedKey(side.path, side.value, written);
  const preferred = at === 'low' ? low : high;
  const other = preferred === low ? high : low;
  const side = !written(preferred.path) && written(other.path) ? other : preferred;
  if (side === low) add(low.path, `must be <= ${named(high)} (got ${low.value})`);
  else add(high.path, `must be >= ${named(low)} (got ${high.value})`);
}

type Add = (path: Path, message: string) => void;

/** The metrics' label for "no backend" / "no class" (a refused request): no configured name may take it. */
const RESERVED_LABEL = 'none';
const RESERVED_MESSAGE = `"${RESERVED_LABEL}" is reserved: the metrics label requests that reached no backend or class with it`;

/** The address the server listens on is a host, as `listen` takes it: no scheme, port or path. */
function checkServer(config: Obj, add: Add): void {
  const server = config.server;
  // An empty host is the schema's to report (minLength).
  if (!isRecord(server) || typeof server.host !== 'string' || server.host === '') return;
  const problem = hostProblem(server.host);
  if (problem !== null) add(['server', 'host'], problem);
}

/**
 * What is wrong with `host` as an address to listen on (server.host, `serve --host`), or null. An
 * empty one is wrong: listen() reads it as every interface.
 */
export function hostProblem(host: string): string | null {
  if (host === '') return 'must not be empty (an empty host listens on every interface)';
  if (host.startsWith('[') && host.endsWith(']')) {
    return `must be an IPv6 address without its brackets (got ${show(host)})`;
  }
  if (/[/\s]/.test(host) || (host.includes(':') && !isIpv6(host))) {
    return `must be a host name or an IP address, with no scheme, port or path (got ${show(host)})`;
  }
  return null;
}

/** An IPv6 address as `listen` takes it: no brackets, an IPv4 tail or a zone (%eth0) allowed. */
function isIpv6(host: string): boolean {
  return /^[0-9A-Fa-f:.]+(%[\w.-]+)?$/.test(host) && host.split(':').length > 2;
}

/** `url` parsed, or null when it is no string or does not parse (its own check reports that). */
function parsedUrl(url: unknown): URL | null {
  if (typeof url !== 'string') return null;
  try {
    return new URL(url);
  } catch {
    return null;
  }
}

/** How environment variables are written by convention; a key seldom is. */
const CONVENTIONAL_ENV_NAME = /^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$/;

function checkBackends(config: Obj, add: Add): void {
  const backends = list(config.backends);
  duplicates(backends, (b) => (isRecord(b) ? b.name : undefined), ['backends'], 'backend name', add, 'name');
  // One server under two names would get two pools and two concurrency limits, and its own
  // counts twice in every figure the gateway reads from it.
  duplicates(
    backends,
    (b) => (isRecord(b) ? parsedUrl(b.url)?.origin : undefined),
    ['backends'],
    'backend URL',
    add,
    'url',
  );
  backends.forEach((backend, i) => {
    if (isRecord(backend) && backend.name === RESERVED_LABEL) add(['backends', i, 'name'], RESERVED_MESSAGE);
    // A value that is no variable name (the schema reports it) may be the key itself: not named here.
    if (
      isRecord(backend) &&
      typeof backend.api_key_env === 'string' &&
      ENV_NAME_RE.test(backend.api_key_env)
    ) {
      const problem = apiKeyProblem(envValue(backend.api_key_env));
      // The variable's value, a secret, is never named. Nor is the field's own value unless it is
      // written as variables are (upper case): a key pasted here by mistake (`sk_live_4eC3...`, a
      // hex key) is often a valid variable name too, and this message reaches stderr and the
      // operations log.
      if (problem) {
        const named = CONVENTIONAL_ENV_NAME.test(backend.api_key_env)
          ? `environment variable ${backend.api_key_env}`
          : 'the environment variable this names (not repeated: it may be a key pasted in by mistake)';
        add(['backends', i, 'api_key_env'], `${named} ${problem}`);
      }
    }
    if (!isRecord(backend) || typeof backend.url !== 'string') return;
    const problem = urlProblem(backend.url, ['http:', 'https:']);
    if (problem) add(['backends', i, 'url'], problem);
  });

  const { simulate, models } = config;
  if (backends.length === 0 && simulate === undefined) {
    add(['backends'], 'no backends: list at least one, or add a simulate section for a simulated fleet');
  }
  if (backends.length > 0 && simulate !== undefined) {
    add(['simulate'], 'cannot be combined with backends: the simulated fleet replaces the backends list');
  }
  if (
    isRecord(simulate) &&
    typeof simulate.profile === 'string' &&
    !Object.hasOwn(PROFILES, simulate.profile)
  ) {
    const known = Object.keys(PROFILES).join(', ');
    add(['simulate', 'profile'], `unknown GPU profile ${show(simulate.profile)} (profiles: ${known})`);
  }
  if (isRecord(simulate) && typeof simulate.model === 'string' && Array.isArray(models)) {
    if (!models.includes(simulate.model)) {
      add(
        ['simulate', 'model'],
        `must be one of models (${models.join(', ')}) (got ${show(simulate.model)})`,
      );
    }
  }

  const state = config.state;
  if (isRecord(state) && state.store === 'redis') {
    if (typeof state.redis_url === 'string') {
      const problem = urlProblem(state.redis_url, ['redis:', 'rediss:']);
      if (problem) add(['state', 'redis_url'], problem);
    }
    if (typeof state.redis_url === 'string') {
      const db = (parsedUrl(state.redis_url)?.pathname ?? '').replace(/^\//, '');
      const shown = show(maskedUrl(state.redis_url));
      // ioredis reads the path as a database number; anything else silently meant database 0, and
      // so does any path for a cluster, which has only database 0.
      const u = parsedUrl(state.redis_url);
      if (u !== null && !(decodes(u.username) && decodes(u.password))) {
        // The client decodes them (decodeURIComponent), and a '%' that starts no escape throws at
        // start, naming no key: refused here, as serve would fail.
        add(
          ['state', 'redis_url'],
          `its user name or password has a '%' that is not a valid escape; write a '%' as %25 (got ${shown})`,
        );
      }
      if (!/^\d*$/.test(db)) {
        add(['state', 'redis_url'], `its path must be a database number (got ${shown})`);
      } else if (state.topology === 'cluster' && db !== '' && Number(db) !== 0) {
        add(
          ['state', 'redis_url'],
          `must name no database but 0 with topology 'cluster': a cluster has only database 0 (got ${shown})`,
        );
      }
    }
    // Reported whatever is wrong with redis_url: every problem at once.
    if (state.topology === 'sentinel' && Array.isArray(state.sentinels) && state.sentinels.length === 0) {
      add(['state', 'sentinels'], "must list at least one sentinel (host:port) when topology is 'sentinel'");
    }
    // Given for another topology they would be ignored without a word.
    if (state.topology !== 'sentinel' && Array.isArray(state.sentinels) && state.sentinels.length > 0) {
      add(['state', 'sentinels'], "is used only when topology is 'sentinel'");
    }
    if (
      state.topology !== 'cluster' &&
      Array.isArray(state.cluster_nodes) &&
      state.cluster_nodes.length > 0
    ) {
      add(['state', 'cluster_nodes'], "is used only when topology is 'cluster'");
    }
  }
}

function checkSla(config: Obj, add: Add): void {
  const { sla } = config;
  if (isRecord(sla) && isRecord(sla.classes) && Object.hasOwn(sla.classes, RESERVED_LABEL)) {
    add(['sla', 'classes', RESERVED_LABEL], RESERVED_MESSAGE);
  }
  if (!isRecord(sla) || !isRecord(sla.classes) || typeof sla.default_class !== 'string') return;
  if (!Object.hasOwn(sla.classes, sla.default_class)) {
    add(['sla', 'default_class'], classMessage(sla.default_class, sla.classes));
  }
}

function checkTenants(config: Obj, add: Add): void {
  const tenants = list(config.tenants);
  duplicates(tenants, (t) => (isRecord(t) ? t.name : undefined), ['tenants'], 'tenant name', add, 'name');
  duplicates(
    tenants,
    (t) => (isRecord(t) ? t.api_key_sha256 : undefined),
    ['tenants'],
    'API key hash',
    add,
    'api_key_sha256',
  );
  const { sla } = config;
  const classes = isRecord(sla) && isRecord(sla.classes) ? sla.classes : undefined;
  tenants.forEach((tenant, i) => {
    if (!isRecord(tenant)) return;
    const allowed = Array.isArray(tenant.allowed_classes) ? tenant.allowed_classes : undefined;
    if (classes && typeof tenant.class === 'string' && !Object.hasOwn(classes, tenant.class)) {
      add(['tenants', i, 'class'], classMessage(tenant.class, classes));
    }
    // An unknown class is reported above; also asking to allow it would point at the wrong fix.
    const knownClass = typeof tenant.class === 'string' && (!classes || Object.hasOwn(classes, tenant.class));
    if (allowed && knownClass && !allowed.includes(tenant.class)) {
      add(['tenants', i, 'allowed_classes'], `must include the tenant's class ${show(tenant.class)}`);
    }
    allowed?.forEach((name, j) => {
      if (classes && typeof name === 'string' && !Object.hasOwn(classes, name)) {
        add(['tenants', i, 'allowed_classes', j], classMessage(name, classes));
      }
    });
    if (allowed) duplicates(allowed, (n) => n, ['tenants', i, 'allowed_classes'], 'class', add);
  });
}

function checkOrdering(config: Obj, add: Add, written: (path: Path) => boolean): void {
  const scheduler = isRecord(config.scheduler) ? config.scheduler : {};
  const c = isRecord(scheduler.concurrency) ? scheduler.concurrency : {};
  const path = ['scheduler', 'concurrency'];
  const minAt = [...path, 'min'];
  const maxAt = [...path, 'max'];
  const initialAt = [...path, 'initial'];
  if (int(c.min) && int(c.max) && c.min > c.max) {
    misordered({ path: minAt, value: c.min }, { path: maxAt, value: c.max }, 'low', add, written);
  }
  // Judged against max alone when min is past max too, so that one run reports both.
  const low = int(c.min) && int(c.max) && c.min <= c.max ? c.min : null;
  // Only a written initial can be out: one the file leaves out is derived within min and max
  // (defaults.ts), and an issue at a derived key is not reported.
  if (int(c.max) && int(c.initial) && (c.initial > c.max || (low !== null && c.initial < low))) {
    const max = namedKey(maxAt, c.max, written);
    add(
      initialAt,
      low === null
        ? `must be <= ${max} (got ${c.initial})`
        : `must be between ${namedKey(minAt, low, written)} and ${max} (got ${c.initial})`,
    );
  }

  const upstream = isRecord(config.upstream) ? config.upstream : {};
  const outlier = isRecord(upstream.outlier) ? upstream.outlier : {};
  if (int(outlier.base_ejection_ms) && int(outlier.max_ejection_ms)) {
    if (outlier.base_ejection_ms > outlier.max_ejection_ms) {
      misordered(
        { path: ['upstream', 'outlier', 'base_ejection_ms'], value: outlier.base_ejection_ms },
        { path: ['upstream', 'outlier', 'max_ejection_ms'], value: outlier.max_ejection_ms },
        'low',
        add,
        written,
      );
    }
  }
  // Each in-flight request holds one HTTP/1.1 connection while it streams, so a connection pool
  // smaller than the concurrency cap would queue requests inside undici, out of the scheduler's sight.
  const connections = upstream.max_connections_per_backend;
  if (int(connections) && int(c.max) && connections < c.max) {
    misordered(
      { path: maxAt, value: c.max },
      { path: ['upstream', 'max_connections_per_backend'], value: connections },
      'high',
      add,
      written,
    );
  }
}

function duplicates(
  items: unknown,
  keyOf: (item: unknown) => unknown,
  path: Path,
  what: string,
  add: Add,
  field?: string,
): void {
  const first = new Map<unknown, number>();
  list(items).forEach((item, i) => {
    const key = keyOf(item);
    if (typeof key !== 'string') return;
    const seen = first.get(key);
    if (seen !== undefined) {
      const at = field ? [...path, i, field] : [...path, i];
      // A key's hash may be the key itself, pasted in the wrong field: shown as schema issues are.
      const shown = mayHoldSecret(at) ? '' : ` ${show(key)}`;
      add(at, `duplicate ${what}${shown} (first at index ${seen})`);
    } else first.set(key, i);
  });
}

function classMessage(name: string, classes: Obj): string {
  return `unknown SLA class ${show(name)} (sla.classes defines: ${Object.keys(classes).join(', ')})`;
}

/**
 * The URL as a message may show it: a password (`:secret@`, in a Redis URL) as `***`, so that
 * check-config's output and the log line of a refused reload never carry it.
 *
 * Invariant: everything between the scheme and the last `@` is treated as credentials, whatever
 * it holds, and so is a query. The text shown is often one `new URL` refused, so it cannot be parsed to find them:
 * a base64 password holds `/` and `+`, and a hand-written one may hold `:` or a raw `@`.
 */
export function maskedUrl(text: string): string {
  const scheme = text.indexOf('://');
  const start = scheme === -1 ? 0 : scheme + 3;
  const at = text.lastIndexOf('@');
  let shown = text;
  let host = start;
  if (at >= start) {
    const colon = text.indexOf(':', start);
    const user = colon !== -1 && colon < at ? text.slice(start, colon) : null;
    const masked = `${text.slice(0, start)}${user === null ? '***' : `${user}:***`}`;
    shown = masked + text.slice(at);
    host = masked.length;
  }
  // A query may carry one too (ioredis reads `?password=`): it is never shown.
  const query = shown.indexOf('?', host);
  return query === -1 ? shown : `${shown.slice(0, query)}?***`;
}

function urlProblem(text: string, protocols: string[]): string | undefined {
  const shown = show(maskedUrl(text));
  // A Redis URL without `://` may be a password alone, or `user:password`, written in the wrong
  // place: no part of it can be told apart from a secret, so none is shown (one with a scheme is
  // shown masked).
  if (!protocols.includes('http:') && !text.includes('://')) {
    return 'must be a redis:// or rediss:// URL (got a value not shown here)';
  }
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return `must be an absolute URL (got ${shown})`;
  }
  const schemes = protocols.map((p) => p.slice(0, -1)).join(' or ');
  if (!protocols.includes(url.protocol)) return `must be a URL with scheme ${schemes} (got ${shown})`;
  if (url.hostname === '') return `must name a host (got ${shown})`;
  const backend = protocols.includes('http:');
  // Redis URLs may carry a password; backend URLs are logged and exposed on /admin/state, so they may not.
  if (backend && (url.username !== '' || url.password !== '')) {
    return 'must not carry credentials';
  }
  // WHATWG URLs take port 0, which no connection can use: the store would stay degraded, the
  // backend down, for good.
  if (url.port === '0') return `must not name port 0 (got ${shown})`;
  if (url.search !== '' || url.hash !== '') return `must not have a query or fragment (got ${shown})`;
  // The gateway sends the OpenAI paths (/v1/...) and its probes (/health, /metrics) from the
  // server's root: a path here would be dropped, not prefixed.
  if (backend && url.pathname !== '/') return `must not have a path; give the server's root (got ${shown})`;
  return undefined;
}

/**
 * An environment variable's value, or undefined: its own, never one process.env inherits (a
 * variable named `constructor` is not set unless it is).
 */
export function envValue(name: string): string | undefined {
  return Object.hasOwn(process.env, name) ? process.env[name] : undefined;
}

/**
 * What is wrong with a backend key's value as a bearer token (it is sent with surrounding
 * whitespace trimmed, as a secret file's trailing newline), or undefined.
 */
function apiKeyProblem(value: string | undefined): string | undefined {
  const key = value?.trim();
  if (!key) return 'is not set (or empty)';
  if (!/^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/.test(key)) {
    return 'holds characters a header cannot carry (control characters or non-ASCII)';
  }
  return undefined;
}

/** Whether a URL's user name or password (percent-encoded as written) decodes. */
function decodes(part: string): boolean {
  try {
    decodeURIComponent(part);
    return true;
  } catch {
    return false;
  }
}
