// YAML text → defaults → validation (schema + cross-field) → deep-frozen Config, or a ConfigError
// listing every problem with its path and position. Nothing half-valid ever leaves this module.
import { readFileSync } from 'node:fs';
import { type Document, isMap, isScalar, isSeq, LineCounter, type Node, parseDocument } from 'yaml';
import { crossFieldIssues } from './checks.ts';
import { applyDerivedDefaults, applySchemaDefaults, orderKeys } from './defaults.ts';
import { CONFIG_INVALID, CONFIG_UNREADABLE, ConfigError, type ConfigIssue } from './errors.ts';
import { isRecord, type Path, renderPath } from './path.ts';
import { type Config, ConfigSchema } from './schema.ts';
import { type RawIssue, schemaIssues, show } from './validate.ts';

/** Reads, validates and freezes a configuration file. Throws ConfigError. */
export function loadConfigFile(path: string): Config {
  return parseConfig(readConfigText(path), path);
}

/** The file's text, or a ConfigError (SLAGATE_CONFIG_UNREADABLE) naming the reason. */
export function readConfigText(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
    throw new ConfigError(CONFIG_UNREADABLE, path, [
      { path: '', message: `cannot read the file (${reason})` },
    ]);
  }
}

/** Validates configuration text; `sourceName` names it in messages. Throws ConfigError. */
export function parseConfig(text: string, sourceName: string): Config {
  const lines = new LineCounter();
  // uniqueKeys: a repeated key is an error, not "last one wins".
  const doc = parseDocument(text, { lineCounter: lines, uniqueKeys: true, prettyErrors: false });
  const syntax = [...doc.errors, ...doc.warnings].map((e): ConfigIssue => {
    const { line, col } = lines.linePos(e.pos[0]);
    return { path: '', message: `YAML syntax: ${e.message.split('\n')[0]}`, line, column: col };
  });
  if (syntax.length > 0) throw new ConfigError(CONFIG_INVALID, sourceName, syntax);

  let value: unknown;
  try {
    value = doc.toJS({ maxAliasCount: 100 });
  } catch (err) {
    throw new ConfigError(CONFIG_INVALID, sourceName, [
      { path: '', message: `YAML: ${(err as Error).message}` },
    ]);
  }
  if (!isRecord(value)) {
    throw new ConfigError(CONFIG_INVALID, sourceName, [
      { path: '', message: `the configuration must be a mapping of sections (got ${show(value)})` },
    ]);
  }

  applySchemaDefaults(ConfigSchema, value);
  const derived = applyDerivedDefaults(value);
  const written = (path: Path) => doc.hasIn(path);
  const raw = [...schemaIssues(value), ...crossFieldIssues(value, written)].filter(
    (issue) => !isDerived(renderPath(issue.path), derived),
  );
  if (raw.length > 0) {
    const issues = raw.map((issue) => locate(issue, doc, lines));
    issues.sort((a, b) => (a.line ?? Number.MAX_SAFE_INTEGER) - (b.line ?? Number.MAX_SAFE_INTEGER));
    throw new ConfigError(CONFIG_INVALID, sourceName, issues);
  }
  return deepFreeze(orderKeys(ConfigSchema, value)) as Config;
}

/** An issue at a key the loader filled in is a consequence of an issue reported where the user wrote it. */
function isDerived(path: string, derived: Set<string>): boolean {
  for (const d of derived)
    if (path === d || path.startsWith(`${d}.`) || path.startsWith(`${d}[`)) return true;
  return false;
}

/** Position of the deepest part of the path present in the file: the key itself, else its parent. */
function locate(issue: RawIssue, doc: Document, lines: LineCounter): ConfigIssue {
  let node: unknown = doc.contents;
  let offset: number | undefined;
  for (const seg of issue.path as Path) {
    if (isMap(node)) {
      const pair = node.items.find((p) => String(isScalar(p.key) ? p.key.value : p.key) === String(seg));
      if (!pair) break;
      offset = (pair.key as Node | null)?.range?.[0] ?? offset;
      node = pair.value;
    } else if (isSeq(node) && typeof seg === 'number') {
      const item = node.items[seg] as Node | undefined;
      if (!item) break;
      offset = item.range?.[0] ?? offset;
      node = item;
    } else break;
  }
  const base = { path: renderPath(issue.path), message: issue.message };
  if (offset === undefined) return base;
  const { line, col } = lines.linePos(offset);
  return { ...base, line, column: col };
}

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}
