// Where the gateway's added TTFT goes, stage by stage, at one stream (nothing queues): the gateway
// of this checkout, optionally the gateway of another (`--base DIR`), and the undici floor
// (scripts/lib/floor-proxy.ts), each in its own process in front of the fixed backend (first
// token after 20 ms, then one every 5 ms), with scripts/lib/stage-probe.mjs preloaded.
//
//   npx tsx scripts/stages.ts [--base DIR] [--requests 400] [--rounds 3] [--warmup 1500]
//                             [--prompts short|long] [--tokens 8]
//
// Each path serves `--warmup` requests first (its request path compiled), then the paths take
// turns for `--rounds` rounds of `--requests` requests each, in an order that rotates. Every
// figure is the median over the pooled requests of one interval between two marks taken in the
// proxy process (node:http's, undici's and the gateway's own diagnostics channels,
// src/telemetry/stages.ts); "client TTFT" is the client's own. A gateway that publishes no stages
// (a checkout from before them) shows only the intervals every proxy has.
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { stopChild } from '../src/bench/processes.ts';
import { startCheckoutGateway, undecidingGatewayYaml } from './lib/checkout-gateway.ts';
import { spawnFixedBackend, spawnFloor } from './lib/spawn-fixed-backend.ts';
import { percentile } from './lib/stats.ts';
import { uniqueWorkload } from './lib/unique-workload.ts';

const { values } = parseArgs({
  options: {
    base: { type: 'string' },
    requests: { type: 'string', default: '400' },
    rounds: { type: 'string', default: '3' },
    warmup: { type: 'string', default: '1500' },
    prompts: { type: 'string', default: 'short' },
    tokens: { type: 'string', default: '8' },
  },
});
const requests = Number(values.requests);
const rounds = Number(values.rounds);
const warmup = Number(values.warmup);
const tokens = Number(values.tokens);
const kind = values.prompts as 'short' | 'long';
if (kind !== 'short' && kind !== 'long') throw new Error('--prompts is short or long');
const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';
const PROBE = new URL('./lib/stage-probe.mjs', import.meta.url).pathname;

type Marks = Record<string, number | undefined>;
interface Path {
  name: string;
  url: string;
  pid: number;
  stop: () => Promise<void>;
  out: string;
  ttft: number[];
  /** Requests served before the measured ones (the warm-up), whose marks are skipped. */
  skip: number;
}

const backend = await spawnFixedBackend(20, 5);
const paths: Path[] = [];
let n = 0;
const probeEnv = () => {
  const out = join(tmpdir(), `slagate-stages-${process.pid}-${n++}.json`);
  return { out, env: { ...process.env, NODE_OPTIONS: `--import ${PROBE}`, STAGE_PROBE_OUT: out } };
};
try {
  {
    const { out, env } = probeEnv();
    const floor = await spawnFloor('undici', backend.url, env);
    paths.push(pathOf('undici floor', floor.url, floor.child.pid!, () => stopChild(floor.child), out));
  }
  const checkouts: [string, string][] = [];
  if (values.base !== undefined) checkouts.push(['slagate (base)', values.base]);
  checkouts.push([values.base === undefined ? 'slagate' : 'slagate (this checkout)', process.cwd()]);
  for (const [name, dir] of checkouts) {
    const { out, env } = probeEnv();
    const gw = await startCheckoutGateway(dir, (d) => undecidingGatewayYaml(backend.url, d), env);
    paths.push(pathOf(name, gw.url, gw.child.pid!, () => stopChild(gw.child), out));
  }

  let seed = 1;
  for (const p of paths) {
    await drive(p, warmup, seed++, false);
    p.skip = warmup;
  }
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < paths.length; i++) {
      const p = paths[(i + r) % paths.length]!;
      await drive(p, requests, seed++, true);
    }
  }
  print(await Promise.all(paths.map(collect)));
} finally {
  for (const p of paths) {
    await p.stop();
    rmSync(p.out, { force: true });
  }
  backend.stop();
}

function pathOf(name: string, url: string, pid: number, stop: () => Promise<void>, out: string): Path {
  return { name, url, pid, stop, out, ttft: [], skip: 0 };
}

/** `count` requests one after another; with `measure`, each one's client TTFT. */
async function drive(p: Path, count: number, seed: number, measure: boolean): Promise<void> {
  const w = uniqueWorkload(kind, count, tokens, seed);
  for (let i = 0; i < count; i++) {
    const r = w.next();
    const body = JSON.stringify({ model: MODEL, messages: r.messages, max_tokens: tokens, stream: true });
    const t0 = performance.now();
    const res = await fetch(`${p.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body,
    });
    if (res.status !== 200 || res.body === null) throw new Error(`${p.name}: status ${res.status}`);
    const reader = res.body.getReader();
    let first = true;
    for (;;) {
      const { done } = await reader.read();
      if (first && measure) p.ttft.push(performance.now() - t0);
      first = false;
      if (done) break;
    }
  }
}

/** The proxy's marks of the measured requests (it writes them on SIGUSR2). */
async function collect(p: Path): Promise<Marks[]> {
  rmSync(p.out, { force: true });
  process.kill(p.pid, 'SIGUSR2');
  for (let i = 0; i < 200; i++) {
    try {
      const rows = JSON.parse(readFileSync(p.out, 'utf8')) as Marks[];
      return rows.slice(p.skip);
    } catch {
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }
  throw new Error(`${p.name}: no marks written`);
}

function print(rows: Marks[][]): void {
  // [label, from, to]: one interval between two marks of the same request.
  const intervals: [string, string, string][] = [
    ['arrival → record begun (fastify, to the onRequest hook)', 'arrival', 'received'],
    ['record begun → handler (body read and parsed)', 'received', 'parsed'],
    ['handler → admitted (intake, admission)', 'parsed', 'admitted'],
    ['admitted → slot granted (proxy, scheduler, router)', 'admitted', 'granted'],
    ['slot granted → dispatched (attempt, breaker)', 'granted', 'dispatched'],
    ['dispatched → upstream head sent (undici)', 'dispatched', 'upstreamSent'],
    ['**arrival → upstream head sent**', 'arrival', 'upstreamSent'],
    ['upstream first chunk → committed (events read, head written)', 'upstreamFirstChunk', 'committed'],
    ['committed → client socket write', 'committed', 'clientFirstWrite'],
    ['**upstream first chunk → client socket write**', 'upstreamFirstChunk', 'clientFirstWrite'],
    ['response finished → next request arrives', 'finish', 'nextArrival'],
  ];
  const header = `| interval (ms, median) | ${paths.map((p) => p.name).join(' | ')} |`;
  console.log(
    `${requests * rounds} requests per path (${rounds} rounds), ${kind} prompts, ${tokens}-token outputs, one stream\n`,
  );
  console.log(header);
  console.log(`|---|${paths.map(() => '---|').join('')}`);
  for (const [label, from, to] of intervals) {
    const cells = rows.map((marks) => {
      const v = marks
        .map((m) => (m[to] ?? Number.NaN) - (m[from] ?? Number.NaN))
        .filter(Number.isFinite)
        .sort((a, b) => a - b);
      return v.length < marks.length / 2 ? '—' : percentile(v, 50).toFixed(3);
    });
    console.log(`| ${label} | ${cells.join(' | ')} |`);
  }
  const ttft = paths.map((p) =>
    percentile(
      [...p.ttft].sort((a, b) => a - b),
      50,
    ).toFixed(3),
  );
  console.log(`| client TTFT | ${ttft.join(' | ')} |`);
}
