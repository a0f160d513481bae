// What `slagate logs` needs to summarise a long admission log: its peak resident memory and its
// wall time on a synthetic log of `--records` lines, for this checkout and (with `--base DIR`, a
// checkout with its node_modules installed) another, one after the other on the same file.
//
//   npx tsx scripts/logs-memory.ts [--records 1000000] [--base DIR]
//
// The lines are admission records as the gateway writes them (every key present): three classes,
// eight backends, a tenth refused, latencies drawn from fixed ranges with a seeded generator, one
// record per 10 ms of log time (about 650 bytes a record, in a temporary directory removed after).
// Peak memory is the process's own maximum resident set size as it exits
// (process.resourceUsage().maxRSS, printed by a preloaded exit hook); the summary goes nowhere.
import { spawn } from 'node:child_process';
import { createWriteStream, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Rng } from '../src/sim/rng.ts';

const { values } = parseArgs({
  options: { records: { type: 'string', default: '1000000' }, base: { type: 'string' } },
});
const records = Number(values.records);
const HEAD = join(import.meta.dirname, '..');

async function writeLog(path: string): Promise<void> {
  const out = createWriteStream(path);
  // A write that fails (a full disk) rejects the wait for 'drain' as well as the end.
  let failed: Error | null = null;
  out.on('error', (err) => {
    failed = err;
  });
  const rng = new Rng(1);
  const classes = ['interactive', 'completion', 'batch'];
  for (let i = 0; i < records; i++) {
    const refused = rng.next() < 0.1;
    const line = JSON.stringify({
      level: 30,
      time: 1_764_979_200_000 + i * 10,
      kind: 'admission',
      req_id: `req-${i}`,
      tenant: null,
      class: classes[i % 3],
      model: 'm',
      stream: true,
      prompt_tokens_est: 500,
      prompt_tokens: 500,
      completion_tokens: 100,
      max_tokens: 256,
      prefix_blocks: 8,
      prefix_hit_est: 0.5,
      decision: refused ? 'refused' : 'admitted',
      reason: refused ? 'sla_unattainable' : 'ok',
      outcome: refused ? 'refused' : 'ok',
      backend: refused ? null : `gpu-${i % 8}`,
      attempts: refused ? 0 : 1,
      predicted_ttft_ms: 100 + 400 * rng.next(),
      runner_up: null,
      runner_up_predicted_ttft_ms: null,
      failed_attempts: [],
      queue_ms: 50 * rng.next(),
      ttft_ms: refused ? null : 50 + 900 * rng.next(),
      tpot_ms: refused ? null : 10 + 60 * rng.next(),
      e2e_ms: refused ? null : 1000 + 5000 * rng.next(),
      ttft_target_ms: 500,
      tpot_target_ms: 50,
      sla_met: refused ? null : rng.next() < 0.8,
      error: null,
      msg: 'admission',
    });
    if (failed !== null) throw failed;
    if (!out.write(`${line}\n`))
      await new Promise<void>((r, j) => {
        out.once('drain', () => r());
        out.once('error', j);
      });
  }
  await new Promise<void>((r, j) => {
    if (failed !== null) j(failed);
    out.once('error', j);
    out.end(() => r());
  });
}

/** Preloaded into the measured process: its peak resident set size (KiB), on stderr as it exits. */
const EXIT_HOOK = `data:text/javascript,process.on('exit',()=>process.stderr.write('maxrss '+process.resourceUsage().maxRSS+'\\n'))`;

/** `slagate logs FILE` of `checkout`: its peak resident memory (MB) and wall time (s). */
async function measure(checkout: string, file: string): Promise<{ peakMb: number; wallS: number }> {
  const t0 = performance.now();
  const child = spawn(
    process.execPath,
    ['--import', EXIT_HOOK, join(checkout, 'bin/slagate.js'), 'logs', file],
    {
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let err = '';
  child.stderr!.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const code = await new Promise<number | null>((r) => child.once('close', r));
  if (code !== 0) throw new Error(`slagate logs of ${checkout} exited with ${code}: ${err}`);
  const m = /maxrss (\d+)/.exec(err);
  if (m === null) throw new Error(`slagate logs of ${checkout} did not report its peak memory: ${err}`);
  return { peakMb: Number(m[1]) / 1024, wallS: (performance.now() - t0) / 1000 };
}

const dir = mkdtempSync(join(tmpdir(), 'slagate-logs-memory-'));
// The log is large (about 2 GB for three million records): not left behind by an interrupt either.
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    rmSync(dir, { recursive: true, force: true });
    process.exit(130);
  });
}
try {
  const file = join(dir, 'admission.log');
  await writeLog(file);
  const sides: [string, string][] = [];
  if (values.base !== undefined) sides.push(['base', resolve(values.base)]);
  sides.push(['head', HEAD]);
  console.log(`| checkout | records | peak resident MB | wall s |`);
  console.log(`|---|---|---|---|`);
  for (const [name, checkout] of sides) {
    const m = await measure(checkout, file);
    console.log(`| ${name} | ${records} | ${m.peakMb.toFixed(0)} | ${m.wallS.toFixed(2)} |`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
