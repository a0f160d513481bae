// Reads a V8 .cpuprofile (node --cpu-prof) and sums self time per function (name, file, line):
// the time samples landed in that function itself, not in what it called. Lines for a table.
import { readFileSync } from 'node:fs';
import { relative } from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

export function summarizeProfile(file: string, top: number): string[] {
  const prof = JSON.parse(readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const self = new Map<string, number>();
  let total = 0;
  // timeDeltas[i] is the gap before sample i: it belongs to the sample before it.
  for (let i = 0; i < prof.samples.length - 1; i++) {
    const us = prof.timeDeltas[i + 1] ?? 0;
    const node = byId.get(prof.samples[i]!)!;
    const { functionName, url, lineNumber } = node.callFrame;
    const where = url === '' ? '' : `${shorten(url)}:${lineNumber + 1}`;
    const key = `${functionName || '(anonymous)'} ${where}`.trim();
    self.set(key, (self.get(key) ?? 0) + us);
    total += us;
  }
  const idle = self.get('(idle)') ?? 0;
  const busy = total - idle;
  const rows = [...self.entries()].filter(([k]) => k !== '(idle)').sort((a, b) => b[1] - a[1]);
  const lines = [
    `busy ${(busy / 1e6).toFixed(2)} s of ${(total / 1e6).toFixed(2)} s sampled`,
    '',
    '| self ms | share of busy | function |',
    '|---|---|---|',
  ];
  for (const [k, us] of rows.slice(0, top)) {
    lines.push(`| ${(us / 1000).toFixed(0)} | ${((100 * us) / busy).toFixed(1)}% | \`${k}\` |`);
  }
  return lines;
}

function shorten(url: string): string {
  const path = url.startsWith('file://') ? new URL(url).pathname : url;
  const nm = path.lastIndexOf('node_modules/');
  if (nm >= 0) return path.slice(nm + 'node_modules/'.length);
  return path.startsWith('/') ? relative(process.cwd(), path) : path;
}
