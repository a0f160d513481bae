// Defaults are applied BEFORE validation (as Ajv's useDefaults does for fastify), so the validated
// value is the value the gateway runs with, and `check-config` prints exactly that.
//
// TypeBox's Value.Default does not descend into Record values (sla.classes) unless the record value
// itself carries a default, and fails on a closed Record; this walker reads the same `default`
// annotations and follows properties, patternProperties, items and discriminated anyOf.
import { isRecord, type Path, renderPath } from './path.ts';

interface SchemaNode {
  default?: unknown;
  properties?: Record<string, SchemaNode>;
  patternProperties?: Record<string, SchemaNode>;
  items?: SchemaNode;
  anyOf?: SchemaNode[];
  const?: unknown;
}

/** Fills absent keys from `default` annotations, in place; returns the (possibly new) value. */
export function applySchemaDefaults(jsonSchema: object, value: unknown): unknown {
  const schema = jsonSchema as SchemaNode;
  // An empty mapping where a union with a default is expected (`state: {}`) names no branch: it is
  // the default, as the section left out is.
  const absent =
    value === undefined || (schema.anyOf !== undefined && isRecord(value) && Object.keys(value).length === 0);
  const filled = absent && 'default' in schema ? structuredClone(schema.default) : value;
  if (Array.isArray(filled) && schema.items) {
    for (let i = 0; i < filled.length; i++) filled[i] = applySchemaDefaults(schema.items, filled[i]);
  }
  if (!isRecord(filled)) return filled;
  for (const [key, sub] of Object.entries(schema.properties ?? {})) {
    const next = applySchemaDefaults(sub, filled[key]);
    if (next !== undefined) filled[key] = next;
  }
  for (const [pattern, sub] of Object.entries(schema.patternProperties ?? {})) {
    const re = new RegExp(pattern);
    for (const key of Object.keys(filled))
      if (re.test(key)) filled[key] = applySchemaDefaults(sub, filled[key]);
  }
  const branch = schema.anyOf?.find((candidate) => matchesConsts(candidate, filled));
  return branch ? applySchemaDefaults(branch, filled) : filled;
}

/** A discriminated union branch is the one whose `const` properties all equal the value's. */
function matchesConsts(branch: SchemaNode, value: Record<string, unknown>): boolean {
  const consts = Object.entries(branch.properties ?? {}).filter(([, sub]) => 'const' in sub);
  return consts.length > 0 && consts.every(([key, sub]) => value[key] === sub.const);
}

/**
 * Defaults that depend on other keys. Each is filled only when the key it derives from has the
 * right type (`value` undefined otherwise); the returned paths, every derived key left out
 * whether filled or not, let callers drop issues found there: a key left out that could not be
 * filled is missing only because the key it derives from is wrong, which is reported where the
 * user wrote it (or left it out), once, not again at every key derived from it.
 */
export function applyDerivedDefaults(config: Record<string, unknown>): Set<string> {
  const derived = new Set<string>();
  const fill = (target: Record<string, unknown>, key: string, value: unknown, path: Path) => {
    if (target[key] !== undefined) return;
    derived.add(renderPath(path));
    if (value !== undefined) target[key] = value;
  };

  const { simulate, models, sla, tenants, scheduler } = config;
  if (isRecord(simulate)) {
    const first = Array.isArray(models) && typeof models[0] === 'string' ? models[0] : undefined;
    fill(simulate, 'model', first, ['simulate', 'model']);
  }

  const defaultClass = isRecord(sla) && typeof sla.default_class === 'string' ? sla.default_class : undefined;
  if (Array.isArray(tenants)) {
    tenants.forEach((tenant, i) => {
      if (!isRecord(tenant)) return;
      fill(tenant, 'class', defaultClass, ['tenants', i, 'class']);
      const own = typeof tenant.class === 'string' ? [tenant.class] : undefined;
      fill(tenant, 'allowed_classes', own, ['tenants', i, 'allowed_classes']);
    });
  }

  const concurrency = isRecord(scheduler) ? scheduler.concurrency : undefined;
  if (isRecord(concurrency)) {
    const { min, max } = concurrency;
    const initial =
      Number.isInteger(min) && Number.isInteger(max)
        ? Math.min(Math.max(16, min as number), max as number)
        : undefined;
    fill(concurrency, 'initial', initial, ['scheduler', 'concurrency', 'initial']);
  }
  return derived;
}

/**
 * A copy with each object's keys in schema order, so the effective configuration reads in the same
 * order as the documentation whatever order the file used. Map keys of records keep the file's order.
 */
export function orderKeys(jsonSchema: object, value: unknown): unknown {
  const schema = jsonSchema as SchemaNode;
  if (Array.isArray(value)) return schema.items ? value.map((item) => orderKeys(schema.items!, item)) : value;
  if (!isRecord(value)) return value;
  const branch = schema.anyOf?.find((candidate) => matchesConsts(candidate, value));
  if (branch) return orderKeys(branch, value);
  const ordered: Record<string, unknown> = {};
  for (const [key, sub] of Object.entries(schema.properties ?? {})) {
    // Own keys only: `in` also finds what every object inherits (a class named `constructor`).
    if (Object.hasOwn(value, key)) ordered[key] = orderKeys(sub, value[key]);
  }
  const patterns = Object.entries(schema.patternProperties ?? {}).map(
    ([p, sub]) => [new RegExp(p), sub] as const,
  );
  for (const key of Object.keys(value)) {
    if (Object.hasOwn(ordered, key)) continue;
    const sub = patterns.find(([re]) => re.test(key))?.[1];
    ordered[key] = sub ? orderKeys(sub, value[key]) : value[key];
  }
  return ordered;
}
