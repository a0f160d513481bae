// Schema validation that reports every violation, each at the path of the key the user must edit.
// TypeBox's raw errors are reshaped: an unknown key is reported at that key (with a suggestion), a
// missing key at the missing key, and the discriminated `state` union is validated against the
// branch its `store` names, so a Redis typo is not buried under "must be memory".
import type { TSchema } from 'typebox';
import type { TLocalizedValidationError } from 'typebox/error';
import { Settings } from 'typebox/system';
import { Value } from 'typebox/value';
import { isRecord, type Path, pointerToPath, renderPath } from './path.ts';
import { ConfigSchema, PATTERN_HINTS, STATE_BRANCHES } from './schema.ts';

export interface RawIssue {
  path: Path;
  message: string;
}

/** Upper bound on collected errors: a config file is small, but a hostile one stays bounded. */
const MAX_ERRORS = 500;

export function schemaIssues(config: unknown): RawIssue[] {
  const state = isRecord(config) ? config.state : undefined;
  // `state` is a union by its store: a mapping is judged by its store's branch (stateIssues), and
  // anything else by the first issue the schema finds there (not a mapping), not again as
  // matching no branch of the union.
  let stateSeen = false;
  const issues = collect(ConfigSchema, config, []).filter((issue) => {
    if (issue.path[0] !== 'state') return true;
    if (isRecord(state) || stateSeen) return false;
    stateSeen = true;
    return true;
  });
  if (isRecord(state)) issues.push(...stateIssues(state));
  return dedupe(issues);
}

function stateIssues(state: Record<string, unknown>): RawIssue[] {
  const stores = Object.keys(STATE_BRANCHES);
  const store = state.store;
  if (store === undefined)
    return [{ path: ['state', 'store'], message: `is required (${stores.join(' or ')})` }];
  if (typeof store !== 'string' || !Object.hasOwn(STATE_BRANCHES, store)) {
    return [
      { path: ['state', 'store'], message: `must be one of: ${stores.join(', ')} (got ${show(store)})` },
    ];
  }
  return collect(STATE_BRANCHES[store as keyof typeof STATE_BRANCHES], state, ['state']);
}

function collect(schema: TSchema, value: unknown, prefix: Path): RawIssue[] {
  const previous = Settings.Get().maxErrors;
  let errors: TLocalizedValidationError[];
  try {
    Settings.Set({ maxErrors: MAX_ERRORS });
    errors = Value.Errors(schema, value);
  } finally {
    Settings.Set({ maxErrors: previous });
  }
  return errors.flatMap((error) =>
    translate(error, schema, value).map((issue) => ({ ...issue, path: [...prefix, ...issue.path] })),
  );
}

/**
 * Keys whose value may be a secret written in the wrong place (a key where its variable's name
 * belongs, a password in a sentinel's address): an issue there never shows the value it got.
 */
const SECRET_KEY = /api_key|password|secret|token|sentinels|cluster_nodes|redis_url/i;

/** The value at `path` may be a secret (SECRET_KEY): an issue never shows it. */
export function mayHoldSecret(path: Path): boolean {
  return path.some((p) => typeof p === 'string' && SECRET_KEY.test(p));
}

function translate(error: TLocalizedValidationError, root: TSchema, value: unknown): RawIssue[] {
  const path = pointerToPath(error.instancePath, value);
  const raw = valueAt(value, path);
  // `show` of a stand-in: a string at such a key is never echoed, its type still is.
  const actual = mayHoldSecret(path) && typeof raw === 'string' ? SECRET_SHOWN : raw;
  const at = (message: string): RawIssue[] => [{ path, message }];
  switch (error.keyword) {
    case 'boolean':
      // `additionalProperties: false` reports each unknown key twice; the keyword below keeps one.
      return error.schemaPath.endsWith('/additionalProperties') ? [] : at(error.message);
    case 'additionalProperties': {
      const parent = schemaAt(root, error.schemaPath);
      return error.params.additionalProperties.map((key) => ({
        path: [...path, key],
        message: unknownKeyMessage(key, parent),
      }));
    }
    case 'required':
      return error.params.requiredProperties.map((key: string) => ({
        path: [...path, key],
        message: 'is required',
      }));
    case 'type':
      return at(`must be ${withArticle(String(error.params.type))} (got ${show(actual)})`);
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum':
      return at(`must be ${error.params.comparison} ${error.params.limit} (got ${show(actual)})`);
    case 'enum':
      return at(`must be one of: ${error.params.allowedValues.join(', ')} (got ${show(actual)})`);
    case 'const':
      return at(`must be ${show(error.params.allowedValue)} (got ${show(actual)})`);
    case 'pattern': {
      const pattern = String(error.params.pattern);
      return at(`${PATTERN_HINTS[pattern] ?? `must match ${pattern}`} (got ${show(actual)})`);
    }
    case 'minLength':
      return at(
        error.params.limit === 1
          ? 'must not be empty'
          : `must have at least ${error.params.limit} characters`,
      );
    case 'minItems':
      return at(`must list at least ${plural(error.params.limit, 'item')}`);
    case 'minProperties':
      return at(`must define at least ${plural(error.params.limit, 'entry', 'entries')}`);
    default:
      return at(error.message);
  }
}

function unknownKeyMessage(key: string, parent: unknown): string {
  if (!isRecord(parent)) return 'unknown key';
  const patterns = isRecord(parent.patternProperties) ? Object.keys(parent.patternProperties) : [];
  const [pattern] = patterns;
  if (pattern !== undefined) return `invalid name: ${PATTERN_HINTS[pattern] ?? `must match ${pattern}`}`;
  const allowed = isRecord(parent.properties) ? Object.keys(parent.properties) : [];
  const near = allowed.find((candidate) => editDistance(candidate, key) <= 2);
  return near === undefined
    ? `unknown key (allowed: ${allowed.join(', ')})`
    : `unknown key (did you mean '${near}'?)`;
}

/** Resolves `#/properties/a/patternProperties/^x/y$/...`; a segment may itself contain '/'. */
function schemaAt(root: TSchema, schemaPath: string): unknown {
  const parts = schemaPath.replace(/^#\/?/, '').split('/').filter(Boolean);
  let node: unknown = root;
  for (let i = 0; i < parts.length; i++) {
    let key = parts[i]!;
    while (isRecord(node) && !(key in node) && i + 1 < parts.length) key += `/${parts[++i]}`;
    node = isRecord(node) ? node[key] : undefined;
  }
  return node;
}

function valueAt(root: unknown, path: Path): unknown {
  let node = root;
  for (const seg of path) node = isRecord(node) || Array.isArray(node) ? (node as never)[seg] : undefined;
  return node;
}

function dedupe(issues: RawIssue[]): RawIssue[] {
  const seen = new Set<string>();
  return issues.filter((issue) => {
    const key = `${renderPath(issue.path)}\0${issue.message}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** What an issue shows in place of a string that may be a secret. */
const SECRET_SHOWN = Symbol('secret');

export function show(value: unknown): string {
  if (value === SECRET_SHOWN) return 'a value not shown here';
  if (value === undefined) return 'nothing';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  if (typeof value === 'string')
    return JSON.stringify(value.length > 60 ? `${value.slice(0, 57)}...` : value);
  return String(value);
}

function withArticle(type: string): string {
  const names: Record<string, string> = { object: 'mapping', array: 'list' };
  const name = names[type] ?? type;
  return /^[aeiou]/.test(name) ? `an ${name}` : `a ${name}`;
}

function plural(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      next.push(Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + cost));
    }
    row = next;
  }
  return row[b.length]!;
}
