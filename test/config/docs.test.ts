import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../../src/config/index.ts';

interface Node {
  properties?: Record<string, Node>;
  patternProperties?: Record<string, Node>;
  items?: Node;
  anyOf?: Node[];
}

/**
 * Every key path the schema accepts, except mappings whose keys are listed themselves, written as the
 * docs write them: `backends[].url`, `sla.classes.<name>.priority`.
 */
function keyPaths(node: Node, prefix: string): string[] {
  const out: string[] = [];
  for (const [key, sub] of Object.entries(node.properties ?? {})) {
    const path = prefix === '' ? key : `${prefix}.${key}`;
    if (!sub.properties && !sub.patternProperties) out.push(path);
    out.push(...keyPaths(sub, path));
  }
  for (const sub of Object.values(node.patternProperties ?? {}))
    out.push(...keyPaths(sub, `${prefix}.<name>`));
  if (node.items) out.push(...keyPaths(node.items, `${prefix}[]`));
  for (const branch of node.anyOf ?? []) out.push(...keyPaths(branch, prefix));
  return [...new Set(out)];
}

describe('docs/configuration.md', () => {
  it('documents every key of the schema', () => {
    const docs = readFileSync(fileURLToPath(new URL('../../docs/configuration.md', import.meta.url)), 'utf8');
    const paths = keyPaths(ConfigSchema as Node, '');
    expect(paths).toContain('upstream.breaker.volume_threshold');
    const missing = paths.filter((path) => !docs.includes(`| \`${path}\` |`));
    expect(missing).toEqual([]);
  });
});
