// Reads a V8 .cpuprofile (node --cpu-prof) and sums self time per function (name, file, line):
// the time samples landed in that function itself, not in what it called. Lines for a table.
import { readFileSync } from 'node:fs';
import { relative } from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  /** µs on the machine's monotonic clock (CLOCK_MONOTONIC on Linux: process.hrtime's, in any process). */
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** A stretch of a profile, in µs of process.hrtime (which V8's profile clock is on Linux). */
export interface ProfileWindow {
  fromUs?: number;
  toUs?: number;
}

/** The samples within `w` (all, without one): each sample's index and its self time (the gap after it). */
function* samplesIn(prof: Profile, w: ProfileWindow): Generator<{ i: number; us: number }> {
  let at = prof.startTime;
  for (let i = 0; i < prof.samples.length - 1; i++) {
    at += prof.timeDeltas[i] ?? 0;
    if (w.fromUs !== undefined && at < w.fromUs) continue;
    if (w.toUs !== undefined && at > w.toUs) break;
    yield { i, us: prof.timeDeltas[i + 1] ?? 0 };
  }
}

/** A profile with its nodes by id (and, for walking a sample's stack, each node's parent). */
function loadProfile(file: string) {
  const prof = JSON.parse(readFileSync(file, 'utf8')) as Profile;
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  return { prof, byId, parent };
}

/** Self time per function, of the samples within `w` (the measured requests). */
export function summarizeProfile(file: string, top: number, w: ProfileWindow = {}): string[] {
  const { prof, byId } = loadProfile(file);
  const self = new Map<string, number>();
  let total = 0;
  // timeDeltas[i] is the gap before sample i: it belongs to the sample before it.
  for (const { i, us } of samplesIn(prof, w)) {
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

/**
 * CPU per request by the gateway's own module: each sample goes to the deepest `src/` file on its
 * stack (so Node's and the libraries' work counts for the gateway code that called it; samples
 * with none of it on the stack go to the library, or to the V8/Node entry, they ran in). Within `w`
 * (from `w.fromUs`: the measured requests, after a warm-up); without a start, from the
 * first one inside `startAt` on (start-up excluded, the first requests' cold path included).
 */
export function summarizeByModule(
  file: string,
  requests: number,
  w: ProfileWindow = {},
  startAt = 'handleInference',
): string[] {
  const { prof, byId, parent } = loadProfile(file);
  const sums = new Map<string, number>();
  let started = w.fromUs !== undefined;
  let busy = 0;
  for (const { i, us } of samplesIn(prof, w)) {
    const stack: ProfileNode[] = [];
    for (let id: number | undefined = prof.samples[i]; id !== undefined; id = parent.get(id)) {
      stack.push(byId.get(id)!);
    }
    if (!started) {
      if (!stack.some((n) => n.callFrame.functionName === startAt)) continue;
      started = true;
    }
    const leaf = stack[0]!.callFrame;
    if (leaf.functionName === '(idle)') continue;
    busy += us;
    const own = stack.find(
      (n) => n.callFrame.url.includes('/src/') && !n.callFrame.url.includes('node_modules'),
    );
    let key: string;
    if (own !== undefined) key = shorten(own.callFrame.url);
    else {
      const lib = stack.find((n) => n.callFrame.url.includes('node_modules/'));
      key =
        lib === undefined ? entryName(leaf.functionName) : `[${shorten(lib.callFrame.url).split('/')[0]}]`;
    }
    sums.set(key, (sums.get(key) ?? 0) + us);
  }
  const lines = [
    `${w.fromUs === undefined ? 'from the first request' : 'after the warm-up'}: busy ${(busy / 1e6).toFixed(2)} s, ${(busy / 1000 / requests).toFixed(2)} ms per request over ${requests} requests`,
    '',
    '| µs per request | share of busy | where (deepest gateway file on the stack, else library or entry) |',
    '|---|---|---|',
  ];
  const rows = [...sums.entries()].sort((a, b) => b[1] - a[1]);
  for (const [k, us] of rows.slice(0, 30)) {
    lines.push(`| ${(us / requests).toFixed(0)} | ${((100 * us) / busy).toFixed(1)}% | \`${k}\` |`);
  }
  return lines;
}

/** V8's own entries are already parenthesised: `(garbage collector)`, `(program)`. */
function entryName(name: string): string {
  if (name === '') return '(anonymous)';
  return name.startsWith('(') ? name : `(${name})`;
}

// `npx tsx scripts/lib/cpu-profile.ts FILE.cpuprofile REQUESTS`: both summaries of a saved profile.
if (import.meta.url === `file://${process.argv[1]}`) {
  const [file, requests] = process.argv.slice(2);
  if (file === undefined || requests === undefined) throw new Error('usage: cpu-profile.ts FILE REQUESTS');
  for (const l of summarizeProfile(file, 25)) console.log(l);
  console.log('');
  for (const l of summarizeByModule(file, Number(requests))) console.log(l);
}
