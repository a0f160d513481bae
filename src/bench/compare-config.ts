// How `bench compare` describes a run's gateway: the policy items of --policies and the YAML
// each run's gateway starts with. The generated keys (server, models, backends, both policies,
// the memory store and the admission log's file) always win over --gateway-yaml, and its tenants
// are dropped, so a user file (a copy of a production one, say) can tune a gateway but never
// point it at anything other than the run's own fresh fleet: not a shared Redis (the production
// one, or a host name this machine cannot resolve, whose outage every run would measure), not
// stdout for the log the report reads, not API keys the benchmark's client does not send.
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';

/** router.policy values the YAML accepts, plus `oracle`; the gateway judges what is implemented. */
export const ROUTER_NAMES = [
  'slagate',
  'round_robin',
  'least_loaded',
  'prefix_only',
  'cache_aware',
  'oracle',
];
export const SCHEDULER_NAMES = ['slagate', 'fcfs'];

export interface PolicyItem {
  /** The item as written, e.g. "least_loaded/fcfs". */
  label: string;
  router: string;
  scheduler: string;
}

/** `ROUTER[/SCHEDULER]`, the scheduler defaulting to `slagate`. Throws a one-line error. */
export function parsePolicyItem(raw: string): PolicyItem {
  const label = raw.trim();
  const parts = label.split('/');
  if (label === '' || parts.length > 2) {
    throw new Error(`bad policy "${raw}" (want ROUTER or ROUTER/SCHEDULER)`);
  }
  const router = parts[0]!.trim();
  const scheduler = parts[1]?.trim() ?? 'slagate';
  if (!ROUTER_NAMES.includes(router)) {
    throw new Error(`unknown router "${router}" in "${label}" (${ROUTER_NAMES.join(', ')})`);
  }
  if (!SCHEDULER_NAMES.includes(scheduler)) {
    throw new Error(`unknown scheduler "${scheduler}" in "${label}" (${SCHEDULER_NAMES.join(', ')})`);
  }
  return { label, router, scheduler };
}

/** A comma-separated list of items; labels must be distinct (results are keyed by them). */
export function parsePolicies(raw: string): PolicyItem[] {
  const items = raw.split(',').map(parsePolicyItem);
  const seen = new Set<string>();
  for (const item of items) {
    if (seen.has(item.label)) throw new Error(`policy "${item.label}" is listed twice`);
    seen.add(item.label);
  }
  return items;
}

export type Yaml = Record<string, unknown>;
export const isMap = (v: unknown): v is Yaml => typeof v === 'object' && v !== null && !Array.isArray(v);

/** `over` wins key by key; maps merge recursively, anything else (lists included) is replaced. */
export function deepMerge(base: Yaml, over: Yaml): Yaml {
  const out: Yaml = { ...base };
  for (const [k, v] of Object.entries(over)) out[k] = isMap(v) && isMap(out[k]) ? deepMerge(out[k], v) : v;
  return out;
}

/** Reads --gateway-yaml; throws when it is not a YAML mapping. */
export async function readGatewayYaml(path: string): Promise<Yaml> {
  const doc: unknown = parseYaml(await readFile(path, 'utf8'));
  if (doc == null) return {};
  if (!isMap(doc)) throw new Error(`${path}: the gateway YAML must be a mapping`);
  return doc;
}

/**
 * One run's gateway config: the generated keys, then the user's file on top, then what always
 * comes from the run (server, models, backends, both policies). `simulate:` is dropped: the
 * fleet is the run's own.
 */
/** The name the generated config gives the i-th replica of the run's fleet (its URLs in order). */
export function backendName(i: number): string {
  return `r${i}`;
}

export function gatewayConfig(
  user: Yaml,
  args: {
    dir: string;
    model: string;
    urls: readonly string[];
    item: PolicyItem;
    /** The replicas of the fleet to list as backends, by index (default all); each keeps its name. */
    only?: readonly number[] | undefined;
  },
): Yaml {
  const generated: Yaml = {
    server: { host: '127.0.0.1', port: 0 },
    models: [args.model],
    backends: args.urls
      .map((url, i) => ({ name: backendName(i), url }))
      .filter((_, i) => args.only === undefined || args.only.includes(i)),
    router: { policy: args.item.router },
    scheduler: { policy: args.item.scheduler },
    logging: { level: 'warn', admission_log: `${args.dir}/admission.log` },
  };
  const merged = deepMerge(generated, user);
  delete merged.simulate;
  delete merged.tenants;
  merged.server = generated.server;
  merged.models = generated.models;
  merged.backends = generated.backends;
  merged.state = { store: 'memory' };
  merged.logging = {
    ...(isMap(merged.logging) ? merged.logging : {}),
    admission_log: (generated.logging as Yaml).admission_log,
  };
  merged.router = { ...(isMap(merged.router) ? merged.router : {}), policy: args.item.router };
  merged.scheduler = { ...(isMap(merged.scheduler) ? merged.scheduler : {}), policy: args.item.scheduler };
  return merged;
}

/** The admission log file a config names (relative to the gateway's working directory, ours), or null for stdout. */
export function admissionLogPath(config: Yaml): string | null {
  const path = isMap(config.logging) ? config.logging.admission_log : undefined;
  return typeof path === 'string' && path !== 'stdout' ? resolve(path) : null;
}
