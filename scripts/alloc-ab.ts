// What the gateway allocates per request, by its own module: the gateway at HEAD (and, with
// `--base DIR`, the gateway of another checkout with its node_modules installed) in front of one
// fixed backend (scripts/lib/fixed-backend.ts), each under V8's sampling heap profiler.
//
//   npx tsx scripts/alloc-ab.ts [--base DIR] [--floor http|undici] [--streams 32] [--requests 2000]
//                               [--tokens 32] [--prompts short|long] [--warmup 2000] [--top 15]
//
// Allocation sets how often the young generation fills and a scavenge pauses the event loop; at
// 32 streams a pause lands in a few percent of the requests' first-token windows (docs/benchmarks.md,
// "Where the garbage comes from"). Unlike the latency of a shared two-core machine, what a request
// allocates hardly moves from run to run, so a change's effect on it can be read from one run.
//
// `--floor` profiles a reference floor of scripts/lib/floor-proxy.ts as well, in front of the same
// backend: what any Node proxy of that kind allocates per request.
// Each gateway (scripts/lib/checkout-gateway.ts's YAML: nothing queues or is refused) serves
// `--warmup` short requests at 32 streams unprofiled, then `--requests` unique prompts at
// `--streams` (closed loop) between two SIGUSR2 to scripts/lib/heap-sample.mjs, which samples
// every allocation, collected or not, every 1 KiB on average. Bytes go to the deepest `src/` file
// on the allocating stack, else to the library, else to Node's or V8's entry (as the CPU profile's
// summary does, scripts/lib/cpu-profile.ts). Sampling is an estimate: a few KB per request.
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, watch } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { stopChild } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';
import { startCheckoutGateway, undecidingGatewayYaml } from './lib/checkout-gateway.ts';
import { spawnFixedBackend, spawnFloor } from './lib/spawn-fixed-backend.ts';
import { uniqueWorkload } from './lib/unique-workload.ts';

const { values } = parseArgs({
  options: {
    base: { type: 'string' },
    streams: { type: 'string', default: '32' },
    requests: { type: 'string', default: '2000' },
    tokens: { type: 'string', default: '32' },
    prompts: { type: 'string', default: 'short' },
    warmup: { type: 'string', default: '2000' },
    top: { type: 'string', default: '15' },
    floor: { type: 'string' },
  },
});
if (values.prompts !== 'short' && values.prompts !== 'long') throw new Error('--prompts is short or long');
const streams = Number(values.streams);
const requests = Number(values.requests);
const PRELOAD = fileURLToPath(new URL('./lib/heap-sample.mjs', import.meta.url));
/** The checkout this script belongs to: HEAD, whatever the current directory. */
const HEAD = join(import.meta.dirname, '..');
/** How long a signal's file may take to appear (a profile of a few MB is written in well under it). */
const SIGNAL_TIMEOUT_MS = 60_000;

interface HeapNode {
  callFrame: { functionName: string; url: string; lineNumber: number };
  selfSize: number;
  children: HeapNode[];
}

/** Bytes by the deepest gateway file on each allocating stack, and by allocating function. */
function summarize(file: string, root: string) {
  const head = (JSON.parse(readFileSync(file, 'utf8')) as { head: HeapNode }).head;
  const byModule = new Map<string, number>();
  const byFunction = new Map<string, number>();
  let total = 0;
  const short = (url: string) => {
    const path = url.startsWith('file://') ? new URL(url).pathname : url;
    const nm = path.lastIndexOf('node_modules/');
    if (nm >= 0) return path.slice(nm + 'node_modules/'.length);
    return path.startsWith('/') ? relative(root, path) : path;
  };
  const walk = (n: HeapNode, own: string | null, lib: string | null) => {
    const url = n.callFrame.url;
    if (url.includes('node_modules/')) lib ??= `[${short(url).split('/')[0]}]`;
    else if (url.includes('/src/')) own = short(url);
    if (n.selfSize > 0) {
      total += n.selfSize;
      const name = n.callFrame.functionName || '(anonymous)';
      const key = own ?? lib ?? (name.startsWith('(') ? name : `(${name})`);
      byModule.set(key, (byModule.get(key) ?? 0) + n.selfSize);
      const fn = `${name}${url === '' ? '' : ` ${short(url)}:${n.callFrame.lineNumber + 1}`}`;
      byFunction.set(fn, (byFunction.get(fn) ?? 0) + n.selfSize);
    }
    for (const c of n.children) walk(c, own, lib);
  };
  walk(head, null, null);
  return { total, byModule, byFunction };
}

/**
 * Resolves once `file` exists (heap-sample.mjs writes each signal's file whole, by a rename);
 * rejects if `child` exits first (a crash, or a SIGUSR2 that found no handler and killed it) or
 * after SIGNAL_TIMEOUT_MS.
 */
function appeared(file: string, child: ChildProcess): Promise<void> {
  return new Promise((ok, fail) => {
    let timer: NodeJS.Timeout | undefined;
    const done = (err?: Error) => {
      watcher.close();
      clearTimeout(timer);
      child.off('exit', onExit);
      if (err) fail(err);
      else ok();
    };
    const onExit = (code: number | null, signal: string | null) =>
      done(new Error(`the process exited (${signal ?? code}) before writing ${file}`));
    const watcher = watch(dirname(file), () => {
      if (existsSync(file)) done();
    });
    timer = setTimeout(
      () => done(new Error(`${file} did not appear in ${SIGNAL_TIMEOUT_MS} ms`)),
      SIGNAL_TIMEOUT_MS,
    );
    child.once('exit', onExit);
    if (existsSync(file)) done();
  });
}

interface Side {
  name: string;
  /** Where its source files are, to name them relative to it. */
  root: string;
  /** Starts it with `env`; resolves with its URL, its process, how to stop it and what to remove then. */
  start(
    env: NodeJS.ProcessEnv,
  ): Promise<{ url: string; child: ChildProcess; stop(): Promise<void>; dir?: string }>;
}

async function profiled(side: Side) {
  const scratch = mkdtempSync(join(tmpdir(), 'slagate-alloc-'));
  const out = join(scratch, 'heap.heapprofile');
  const env = {
    ...process.env,
    NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${JSON.stringify(PRELOAD)}`.trim(),
    SLAGATE_HEAP_OUT: out,
  };
  const proc = await side.start(env);
  try {
    const warm = Number(values.warmup);
    await runBench({
      target: proc.url,
      workload: uniqueWorkload('short', warm, 32, 98),
      concurrency: 32,
      requests: warm,
      seed: 98,
      progress: false,
    });
    const started = appeared(`${out}.started`, proc.child);
    proc.child.kill('SIGUSR2');
    await started;
    const res = await runBench({
      target: proc.url,
      workload: uniqueWorkload(values.prompts as 'short' | 'long', requests, Number(values.tokens), 7),
      concurrency: streams,
      requests,
      seed: 7,
      progress: false,
    });
    const written = appeared(out, proc.child);
    proc.child.kill('SIGUSR2');
    await written;
    if (res.metrics.failed > 0) console.error(`${side.name}: ${res.metrics.failed} requests failed`);
    if (statSync(out).size === 0) throw new Error(`${side.name}: the heap profile was not taken`);
    return { name: side.name, ...summarize(out, side.root) };
  } finally {
    await proc.stop();
    rmSync(scratch, { recursive: true, force: true });
    if (proc.dir !== undefined) rmSync(proc.dir, { recursive: true, force: true });
  }
}

const backend = await spawnFixedBackend(20, 5);
const gateway = (name: string, checkout: string): Side => ({
  name,
  root: checkout,
  async start(env) {
    const gw = await startCheckoutGateway(checkout, (dir) => undecidingGatewayYaml(backend.url, dir), env);
    return { url: gw.url, child: gw.child, stop: () => stopChild(gw.child), dir: gw.dir };
  },
});
const sides: Side[] = [];
if (values.floor !== undefined) {
  const kind = values.floor;
  if (kind !== 'http' && kind !== 'undici') throw new Error('--floor is http or undici');
  sides.push({
    name: `${kind} floor`,
    root: HEAD,
    async start(env) {
      const floor = await spawnFloor(kind, backend.url, env);
      return { url: floor.url, child: floor.child, stop: () => stopChild(floor.child) };
    },
  });
}
if (values.base !== undefined) sides.push(gateway('base', resolve(values.base)));
sides.push(gateway('head', HEAD));
const results = [];
try {
  for (const side of sides) results.push(await profiled(side));
} finally {
  backend.stop();
}
const kb = (b: number) => (b / requests / 1024).toFixed(1);
const top = Number(values.top);
console.log(
  `${requests} requests of unique ${values.prompts} prompts at ${streams} streams, ${values.tokens}-token outputs (after ${values.warmup} short to warm each gateway)`,
);
console.log('');
console.log(`| where | ${results.map((r) => `KB per request, ${r.name}`).join(' | ')} |`);
console.log(`|---|${results.map(() => '---|').join('')}`);
console.log(`| **all** | ${results.map((r) => `**${kb(r.total)}**`).join(' | ')} |`);
const keys = [...results.at(-1)!.byModule.entries()].sort((a, b) => b[1] - a[1]).map(([k]) => k);
for (const r of results) for (const k of r.byModule.keys()) if (!keys.includes(k)) keys.push(k);
for (const k of keys.slice(0, top)) {
  console.log(`| \`${k}\` | ${results.map((r) => kb(r.byModule.get(k) ?? 0)).join(' | ')} |`);
}
const last = results.at(-1)!;
console.log('');
console.log(`Top allocating functions, ${last.name}:`);
console.log('');
console.log('| KB per request | function |');
console.log('|---|---|');
const ranked = [...last.byFunction.entries()].sort((a, b) => b[1] - a[1]);
for (const [k, b] of ranked.slice(0, top)) console.log(`| ${kb(b)} | \`${k}\` |`);
console.log('');
console.log(`The gateway's own functions, ${last.name}:`);
console.log('');
console.log('| KB per request | function |');
console.log('|---|---|');
for (const [k, b] of ranked.filter(([k]) => / src\//.test(k)).slice(0, top)) {
  console.log(`| ${kb(b)} | \`${k}\` |`);
}
