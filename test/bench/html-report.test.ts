// The HTML report of `bench compare --report`: a real comparison (two policies, two rates, on
// simulated fleets and gateways in child processes) written by the CLI, opened in Debian's
// headless Chromium with playwright-core: no page errors, and one chart per policy for each
// latency distribution plus the charts across rates.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { RequestRecord } from '../../src/bench/client.ts';
import { runFigures } from '../../src/bench/compare-report.ts';
import { byPercentile, htmlReport } from '../../src/bench/html-report.ts';
import { computeMetrics } from '../../src/bench/metrics.ts';
import { launchChromium } from '../helpers/chromium.ts';
import { runSlagate, SMALL_SWEEP } from '../helpers/cli.ts';

let dir: string;
let browser: BrowserContext;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'slagate-report-'));
  browser = await launchChromium();
});
afterAll(async () => {
  await browser?.close();
  await rm(dir, { recursive: true, force: true });
});

const compare = (args: string[]) => runSlagate(['bench', 'compare', ...args]);

it("byPercentile takes numpy's linear percentiles, as the table does", () => {
  expect(byPercentile([])).toBeNull();
  const xs = byPercentile([5, 1, 4, 2, 3])!;
  expect(xs).toHaveLength(100);
  // Between the sorted values 1..5, at 1 + 4p/100: the chart's P99 is the table's, not the maximum.
  expect(xs[0]).toBeCloseTo(1.04, 9);
  expect(xs[49]).toBe(3);
  expect(xs[98]).toBeCloseTo(4.96, 9);
  expect(xs[99]).toBe(5);
});

it('bench compare --report writes a page that opens without errors, one chart per policy', async () => {
  const file = join(dir, 'report.html');
  const r = await compare([
    '--policies',
    'round_robin,least_loaded/fcfs',
    ...SMALL_SWEEP,
    '--quiet',
    '--report',
    file,
  ]);
  expect(r.code, r.err).toBe(0);
  const html = await readFile(file, 'utf8');
  // Self-contained: no script or stylesheet from anywhere.
  expect(html).not.toMatch(/<script[^>]+src=|<link[^>]+stylesheet/);

  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') errors.push(msg.text());
  });
  page.on('request', (req) => {
    if (!req.url().startsWith('file:') && !req.url().startsWith('data:')) errors.push(`fetched ${req.url()}`);
  });
  await page.goto(pathToFileURL(file).href);
  await page.waitForFunction(
    () => (globalThis as unknown as { slagateReport?: unknown }).slagateReport !== undefined,
  );
  const charts = await page.evaluate(() =>
    (
      globalThis as unknown as {
        slagateReport: {
          charts: { title: string; policy: string | null; plot: { data: (number | null)[][] } }[];
        };
      }
    ).slagateReport.charts.map((c) => ({
      title: c.title,
      policy: c.policy,
      // series with at least one measured point
      measured: c.plot.data.slice(1).filter((s) => s.some((v) => v !== null)).length,
    })),
  );
  const perPolicy = (p: string) => charts.filter((c) => c.policy === p).map((c) => c.title);
  expect(perPolicy('round_robin')).toEqual([
    'round_robin: TTFT by percentile (ms, log scale)',
    'round_robin: TPOT by percentile (ms)',
  ]);
  expect(perPolicy('least_loaded/fcfs')).toHaveLength(2);
  // Each distribution chart: both rates measured, plus the target line.
  for (const c of charts.filter((c) => c.policy !== null)) expect(c.measured).toBe(3);
  expect(charts.filter((c) => c.policy === null).map((c) => c.title)).toEqual([
    'P99 TTFT against throughput achieved (ms, log scale)',
    'P99 TTFT against offered rate (ms, log scale)',
    'Throughput and goodput against offered rate (req/s)',
    'Refused share against offered rate (%)',
  ]);
  // The latency curve: each policy's runs, and the target line.
  expect(charts.find((c) => c.title.startsWith('P99 TTFT against throughput'))?.measured).toBe(3);
  expect(await page.locator('.uplot').count()).toBe(8);
  expect(await page.locator('table.runs tbody tr').count()).toBe(4);
  expect(errors).toEqual([]);
}, 120_000);

it('a label holding "<!--" (a target URL the operator typed) neither opens a comment nor stops the charts', async () => {
  const target = 'http://127.0.0.1:1/#<!--<script>';
  const records: RequestRecord[] = Array.from({ length: 5 }, (_, i) => ({
    index: i,
    requestId: `r${i}`,
    startTime: i * 0.1,
    queueTime: 0,
    ttft: 0.1 + i * 0.01,
    itl: new Array(9).fill(0.01),
    latency: 0.19 + i * 0.01,
    promptLen: 10,
    outputLen: 10,
    success: true,
    error: '',
    status: 200,
    headers: {},
  }));
  const metrics = computeMetrics(records, 1, { percentiles: [99] });
  const file = join(dir, 'label.html');
  await writeFile(
    file,
    htmlReport({
      title: `slagate bench: ${target}`,
      subtitle: 'five requests',
      slo: null,
      runs: [
        {
          policy: target,
          rate: 10,
          records,
          figures: runFigures(records, metrics, 1, undefined, null),
          throughput: metrics.requestThroughput,
          error: null,
        },
      ],
    }),
  );
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  await page.goto(pathToFileURL(file).href);
  await page.waitForFunction(
    () => (globalThis as unknown as { slagateReport?: unknown }).slagateReport !== undefined,
  );
  const charts = await page.evaluate(
    () => (globalThis as unknown as { slagateReport: { charts: unknown[] } }).slagateReport.charts.length,
  );
  expect(charts).toBeGreaterThan(0);
  expect(errors).toEqual([]);
  await page.close();
});
