// Paths into the configuration, as segments (numbers index arrays, strings name keys) and in the
// readable form every issue uses: `sla.classes.interactive.ttft_p99_ms`, `backends[1].url`.
import { isDeepStrictEqual } from 'node:util';

export type Segment = string | number;
export type Path = readonly Segment[];

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_-]*$/;

export function renderPath(path: Path): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (IDENTIFIER.test(seg)) out += out === '' ? seg : `.${seg}`;
    else out += `[${JSON.stringify(seg)}]`;
  }
  return out;
}

/**
 * A JSON pointer (`/backends/1/url`) as segments. A segment becomes a number only where the value
 * it indexes is an array, so a map key that looks like a number stays a key.
 */
export function pointerToPath(pointer: string, root: unknown): Segment[] {
  if (pointer === '') return [];
  const path: Segment[] = [];
  let node: unknown = root;
  for (const raw of pointer.slice(1).split('/')) {
    const key = raw.replaceAll('~1', '/').replaceAll('~0', '~');
    const seg: Segment = Array.isArray(node) && /^\d+$/.test(key) ? Number(key) : key;
    path.push(seg);
    node = isRecord(node) || Array.isArray(node) ? (node as Record<string, unknown>)[key] : undefined;
  }
  return path;
}

/**
 * The paths at which `a` and `b` differ: mappings are walked key by key, anything else (a list, a
 * value, a section on one side only) is one leaf.
 */
export function changedPaths(a: unknown, b: unknown, at: Path = []): Segment[][] {
  if (isDeepStrictEqual(a, b)) return [];
  if (!isRecord(a) || !isRecord(b)) return [[...at]];
  return [...new Set([...Object.keys(a), ...Object.keys(b)])].flatMap((key) =>
    changedPaths(a[key], b[key], [...at, key]),
  );
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
