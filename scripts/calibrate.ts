// The simulator's calibration table: `slagate bench` against `slagate sim` (one replica, time
// scale 1, its own process) at fixed concurrency, beside the published reference points from the
// research notes. Prints a Markdown table for docs/simulator.md.
//
//   npx tsx scripts/calibrate.ts [--quick]

import { parseArgs } from 'node:util';
import { startChildFleet } from '../src/bench/processes.ts';
import { runBench } from '../src/bench/run.ts';

const { values } = parseArgs({ options: { quick: { type: 'boolean', default: false } } });

interface Point {
  concurrency: number;
  ref: { ttft?: number; tpot?: number; tput?: number };
}

interface Sweep {
  profile: string;
  source: string;
  workload: 'sharegpt';
  params: Record<string, number>;
  points: Point[];
}

const SWEEPS: Sweep[] = [
  {
    profile: 'llama3-8b-h100',
    source: 'InferenceBench concurrency sweep, 8B on H100-80GB, vLLM 0.21, short chat',
    workload: 'sharegpt',
    params: {},
    points: [
      { concurrency: 1, ref: { ttft: 14.0, tpot: 6.48, tput: 122 } },
      { concurrency: 4, ref: { ttft: 22.8, tpot: 6.59, tput: 580 } },
      { concurrency: 16, ref: { ttft: 41.7, tpot: 10.9, tput: 1384 } },
      { concurrency: 64, ref: { ttft: 86.9, tpot: 46.9, tput: 1312 } },
    ],
  },
  {
    profile: 'llama3-8b-a100',
    source: 'A100-40GB sweep, vLLM 0.23, 1024 in / 128 out (≈75 tok/s at 1, ×6.6 by 8)',
    workload: 'sharegpt',
    // Fixed lengths: σ ≈ 0 around 1000 in / 128 out.
    params: { inputMedian: 1000, inputSigma: 0.001, outputMedian: 128, outputSigma: 0.001 },
    points: [
      { concurrency: 1, ref: { tpot: 13.3, tput: 75 } },
      { concurrency: 8, ref: { tput: 75 * 6.6 } },
    ],
  },
];

const fmt = (v: number | undefined, d = 1) => (v === undefined ? '–' : v.toFixed(d));
function dev(sim: number, ref: number | undefined): string {
  if (ref === undefined) return '';
  const pct = ((sim - ref) / ref) * 100;
  return ` (${pct >= 0 ? '+' : ''}${pct.toFixed(0)}%)`;
}

const rows: string[] = [
  '| profile | concurrency | requests | TTFT p50 ms (ref) | TPOT p50 ms (ref) | output tok/s (ref) |',
  '|---|---|---|---|---|---|',
];
for (const sweep of SWEEPS) {
  console.error(`# ${sweep.profile}: ${sweep.source}`);
  for (const point of sweep.points) {
    const fleet = await startChildFleet({ replicas: 1, profile: sweep.profile });
    try {
      const requests = values.quick
        ? Math.max(8, point.concurrency * 2)
        : Math.max(48, point.concurrency * 8);
      const r = await runBench({
        target: fleet.urls[0]!,
        workload: sweep.workload,
        workloadParams: { sharegpt: sweep.params },
        concurrency: point.concurrency,
        requests,
        seed: 1,
        progress: false,
      });
      const m = r.metrics;
      // NaN (printed as such) when nothing was measured.
      const ttft = m.ttft.median ?? Number.NaN;
      const tpot = m.tpot.median ?? Number.NaN;
      const tput = m.outputThroughput;
      console.error(
        `  c=${point.concurrency}: ttft p50 ${ttft.toFixed(1)} ms, tpot p50 ${tpot.toFixed(2)} ms, ${tput.toFixed(0)} tok/s, failed ${m.failed}`,
      );
      rows.push(
        `| ${sweep.profile} | ${point.concurrency} | ${m.completed} | ${fmt(ttft)} (${fmt(point.ref.ttft)})${dev(ttft, point.ref.ttft)} | ${fmt(tpot, 2)} (${fmt(point.ref.tpot, 2)})${dev(tpot, point.ref.tpot)} | ${fmt(tput, 0)} (${fmt(point.ref.tput, 0)})${dev(tput, point.ref.tput)} |`,
      );
    } finally {
      await fleet.stop();
    }
  }
}
console.log(rows.join('\n'));
