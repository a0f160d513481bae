// `--report FILE.html` of `slagate bench` and `slagate bench compare`: one self-contained page
// (uPlot and the data inlined, nothing fetched) with charts of what the runs measured:
//   - per policy: TTFT and TPOT by percentile (1st to 100th), one line per rate;
//   - across rates (compare with several rates): P99 TTFT against the throughput achieved, one
//     line per policy with the SLA target (the curve a fleet lives on); P99 TTFT per policy with
//     the SLA target, throughput and goodput per policy, refused share per policy, each against
//     the offered rate;
//   - a table of every run's figures and its requests per backend.
// Pure: the page is a function of the runs; a figure that was not measured is null (a gap, "–").

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { RequestRecord } from './client.ts';
import { type RunFigures, rateText } from './compare-report.ts';
import { percentile, type Slo } from './metrics.ts';

export interface ReportRun {
  /** Policy label (ROUTER/SCHEDULER), or the target for a single bench run. */
  policy: string;
  rate: number;
  records: readonly RequestRecord[] | null;
  figures: RunFigures | null;
  /** Achieved request throughput, req/s; null when the run has no figures. */
  throughput: number | null;
  error: string | null;
}

export interface ReportInput {
  title: string;
  /** One line of settings under the title (workload, seed, fleet). */
  subtitle: string;
  slo: Slo | null;
  runs: readonly ReportRun[];
}

/**
 * Value at each percentile 1..100 of `values`, or null when there are none: numpy's linear
 * method, as the table's and the saved result's percentiles are (a chart's P99 is the table's).
 */
export function byPercentile(values: readonly number[]): number[] | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const out: number[] = [];
  for (let p = 1; p <= 100; p++) out.push(percentile(sorted, p));
  return out;
}

/**
 * P99 TTFT against the throughput each run achieved, one series per policy: the x axis is every
 * run's throughput, sorted, and a series has a value only at its own runs' (its line spans the
 * gaps). Every run with both figures counts, an unlimited rate's included.
 */
function latencyCurve(input: ReportInput, policies: readonly string[]) {
  const points = input.runs.flatMap((r) =>
    r.throughput !== null && r.figures?.ttftP99Ms != null
      ? [{ policy: r.policy, x: r.throughput, y: r.figures.ttftP99Ms }]
      : [],
  );
  const xs = [...new Set(points.map((p) => p.x))].sort((a, b) => a - b);
  const series = policies.map((policy) => ({
    label: policy,
    values: xs.map((x) => points.find((p) => p.policy === policy && p.x === x)?.y ?? null),
  }));
  return { xs, series };
}

function chartData(input: ReportInput) {
  const policies = [...new Set(input.runs.map((r) => r.policy))];
  const perPolicy = policies.map((policy) => {
    const runs = input.runs.filter((r) => r.policy === policy);
    const series = runs.map((r) => {
      const ok = r.records?.filter((x) => x.success) ?? [];
      const tpot = ok
        .filter((x) => x.outputLen > 1)
        .map((x) => ((x.latency - x.ttft) / (x.outputLen - 1)) * 1000);
      return {
        label: `rate ${rateText(r.rate)}`,
        ttft: byPercentile(ok.map((x) => x.ttft * 1000)),
        tpot: byPercentile(tpot),
      };
    });
    return { policy, series };
  });
  const rates = [...new Set(input.runs.map((r) => r.rate))]
    .filter((r) => Number.isFinite(r))
    .sort((a, b) => a - b);
  const across = (pick: (f: RunFigures, r: ReportRun) => number | null) =>
    policies.map((policy) => ({
      label: policy,
      values: rates.map((rate) => {
        const run = input.runs.find((r) => r.policy === policy && r.rate === rate);
        return run?.figures ? pick(run.figures, run) : null;
      }),
    }));
  return {
    perPolicy,
    rates,
    p99: across((f) => f.ttftP99Ms),
    throughput: across((_f, r) => r.throughput),
    goodput: across((f) => f.goodput),
    refused: across((f) => (f.refusedShare === null ? null : 100 * f.refusedShare)),
    curve: latencyCurve(input, policies),
    slo: input.slo,
  };
}

const esc = (s: string) =>
  s.replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]!);
const cell = (v: number | null | undefined, digits = 1) =>
  v === null || v === undefined ? '–' : v.toFixed(digits);

function runTable(input: ReportInput): string {
  const rows = input.runs.map((r) => {
    const f = r.figures;
    const backends = f
      ? Object.entries(f.backendRequests)
          .sort(([a], [b]) => a.localeCompare(b))
          .map(([b, n]) => `${esc(b)} ${n}`)
          .join(', ')
      : '';
    return `<tr><td>${esc(r.policy)}</td><td>${rateText(r.rate)}</td><td>${f?.requests ?? '–'}</td><td>${f?.ok ?? '–'}</td><td>${f?.refused ?? '–'}</td><td>${f?.failed ?? '–'}</td><td>${cell(r.throughput, 2)}</td><td>${cell(f?.goodput ?? null, 2)}</td><td>${cell(f?.ttftP50Ms ?? null)}</td><td>${cell(f?.ttftP99Ms ?? null)}</td><td>${cell(f?.tpotP99Ms ?? null)}</td><td>${f?.prefixHitRate === null || f === null ? '–' : `${(100 * f.prefixHitRate).toFixed(1)}%`}</td><td>${backends || '–'}</td><td>${r.error === null ? '' : esc(r.error)}</td></tr>`;
  });
  return `<table class="runs"><thead><tr><th>policy</th><th>rate</th><th>requests</th><th>ok</th><th>refused</th><th>failed</th><th>req/s</th><th>goodput req/s</th><th>TTFT p50 ms</th><th>TTFT p99 ms</th><th>TPOT p99 ms</th><th>prefix hit</th><th>requests per backend</th><th>error</th></tr></thead><tbody>${rows.join('')}</tbody></table>`;
}

// The page's own script: draws what DATA holds with uPlot. Kept as a string, inlined.
const PAGE_SCRIPT = `
const PALETTE = ['#3b6fd8', '#d84b3b', '#2f9e44', '#b06000', '#7b3fd8', '#0b8a8a', '#c2255c', '#868e96'];
const charts = [];
function chart(el, title, xs, series, opts = {}) {
  const fig = document.createElement('figure');
  if (opts.policy) fig.dataset.policy = opts.policy;
  fig.className = 'chart';
  const cap = document.createElement('figcaption');
  cap.textContent = title;
  fig.append(cap);
  el.append(fig);
  const plot = new uPlot({
    width: 560, height: 260,
    scales: { x: { time: false }, y: opts.log ? { distr: 3 } : {} },
    axes: [{ label: opts.xLabel }, { label: opts.yLabel, size: 70 }],
    series: [{ label: opts.xLabel }, ...series.map((s, i) => ({
      label: s.label, stroke: s.dash ? '#1d2330' : PALETTE[i % PALETTE.length], dash: s.dash ? [6, 4] : undefined,
      width: s.dash ? 1 : 1.5, spanGaps: opts.spanGaps === true, points: { show: opts.points === true },
    }))],
  }, [xs, ...series.map((s) => s.values)], fig);
  charts.push({ title, policy: opts.policy ?? null, plot });
}
const pct = Array.from({ length: 100 }, (_, i) => i + 1);
const dist = document.getElementById('distributions');
for (const p of DATA.perPolicy) {
  const ttft = p.series.filter((s) => s.ttft !== null).map((s) => ({ label: s.label, values: s.ttft }));
  if (DATA.slo && DATA.slo.ttft !== undefined) ttft.push({ label: 'TTFT target', values: pct.map(() => DATA.slo.ttft), dash: true });
  chart(dist, p.policy + ': TTFT by percentile (ms, log scale)', pct, ttft, { policy: p.policy, xLabel: 'percentile', yLabel: 'ms', log: true });
  const tpot = p.series.filter((s) => s.tpot !== null).map((s) => ({ label: s.label, values: s.tpot }));
  if (DATA.slo && DATA.slo.tpot !== undefined) tpot.push({ label: 'TPOT target', values: pct.map(() => DATA.slo.tpot), dash: true });
  chart(dist, p.policy + ': TPOT by percentile (ms)', pct, tpot, { policy: p.policy, xLabel: 'percentile', yLabel: 'ms' });
}
const across = document.getElementById('across');
if (DATA.curve.xs.length > 1) {
  const curve = [...DATA.curve.series];
  if (DATA.slo && DATA.slo.ttft !== undefined) curve.push({ label: 'TTFT target', values: DATA.curve.xs.map(() => DATA.slo.ttft), dash: true });
  chart(across, 'P99 TTFT against throughput achieved (ms, log scale)', DATA.curve.xs, curve, { xLabel: 'req/s achieved', yLabel: 'ms', log: true, points: true, spanGaps: true });
}
if (DATA.rates.length > 1) {
  const p99 = [...DATA.p99];
  if (DATA.slo && DATA.slo.ttft !== undefined) p99.push({ label: 'TTFT target', values: DATA.rates.map(() => DATA.slo.ttft), dash: true });
  chart(across, 'P99 TTFT against offered rate (ms, log scale)', DATA.rates, p99, { xLabel: 'offered req/s', yLabel: 'ms', log: true, points: true });
  chart(across, 'Throughput and goodput against offered rate (req/s)', DATA.rates,
    [...DATA.throughput.map((s) => ({ label: s.label + ' throughput', values: s.values })),
     ...DATA.goodput.filter((s) => s.values.some((v) => v !== null)).map((s) => ({ label: s.label + ' goodput', values: s.values }))],
    { xLabel: 'offered req/s', yLabel: 'req/s', points: true });
  chart(across, 'Refused share against offered rate (%)', DATA.rates, DATA.refused, { xLabel: 'offered req/s', yLabel: '%', points: true });
} else if (DATA.curve.xs.length <= 1) {
  across.textContent = 'One rate only: run bench compare with --rates R1,R2,... for the charts across rates.';
}
window.slagateReport = { charts };
`;

const STYLE = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem 1.5rem 2rem; color: #1d2330; background: #fafbfc; }
h1 { font-size: 1.3rem; margin: 0.2rem 0; } h2 { font-size: 1.05rem; margin: 1.4rem 0 0.5rem; }
.sub { color: #5b6577; margin: 0 0 1rem; }
.grid { display: flex; flex-wrap: wrap; gap: 1rem; }
figure.chart { margin: 0; background: #fff; border: 1px solid #e1e5ec; border-radius: 6px; padding: 0.5rem; }
figcaption { font-weight: 600; margin-bottom: 0.3rem; }
table { border-collapse: collapse; background: #fff; }
th, td { text-align: left; padding: 0.3rem 0.6rem; border-bottom: 1px solid #eef0f4; white-space: nowrap; }
th { font-size: 0.8rem; color: #5b6577; }
`;

function asset(file: string): string {
  const require = createRequire(import.meta.url);
  return readFileSync(require.resolve(`uplot/dist/${file}`), 'utf8');
}

/**
 * The whole page. Data and scripts are inlined; `</` in them is escaped so none ends a tag, and
 * every `<` of the data (a label is a target URL the operator typed), so no `<!--` opens a comment
 * that would swallow the closing tag.
 */
export function htmlReport(input: ReportInput): string {
  const data = JSON.stringify(chartData(input)).replaceAll('<', '\\u003c');
  const uplotJs = asset('uPlot.iife.min.js').replaceAll('</script', '<\\/script');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${esc(input.title)}</title>
<link rel="icon" href="data:,">
<style>${asset('uPlot.min.css')}${STYLE}</style></head>
<body>
<h1>${esc(input.title)}</h1>
<p class="sub">${esc(input.subtitle)}</p>
<h2>Latency distributions per policy</h2>
<div id="distributions" class="grid"></div>
<h2>Across rates</h2>
<div id="across" class="grid"></div>
<h2>Runs</h2>
${runTable(input)}
<script>${uplotJs}</script>
<script>const DATA = ${data};${PAGE_SCRIPT}</script>
</body></html>
`;
}
