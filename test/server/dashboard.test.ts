// /dashboard in a real browser (Debian's headless Chromium driven by playwright-core) in front of
// a running simulated fleet: the page loads without errors, its backend table lists every backend,
// and its charts gain data while a bench run sends load. A screenshot is kept in test-results/.
import { mkdirSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { runBench } from '../../src/bench/run.ts';
import {
  chat,
  get,
  METHOD_NAMED_CLASSES,
  post,
  startTestGateway,
  type TestGateway,
  waitFor,
} from '../gateway/harness.ts';
import { launchChromium } from '../helpers/chromium.ts';
import { chartNow } from '../helpers/dashboard.ts';
import { listenLoopback } from '../helpers/http.ts';

const ARTIFACTS = join(import.meta.dirname, '..', '..', 'test-results');

let t: TestGateway;
let browser: BrowserContext;
beforeAll(async () => {
  t = await startTestGateway({ replicas: 3, timeScale: 0.2 });
  browser = await launchChromium({ width: 1400, height: 1100 });
});
afterAll(async () => {
  await browser?.close();
  await t?.close();
});

/** Non-null values of one chart's series whose names do not end in " target". */
function measured(page: Page, chart: string): Promise<number> {
  return page.evaluate((key) => {
    const c = (
      globalThis as unknown as {
        slagateDashboard: {
          charts: Record<string, { plot: { data: (number | null)[][] }; names: string[] }>;
        };
      }
    ).slagateDashboard.charts[key];
    if (c === undefined) return 0;
    let n = 0;
    c.names.forEach((name, i) => {
      if (name.endsWith(' target')) return;
      for (const v of c.plot.data[i + 1] ?? []) if (v !== null && v > 0) n++;
    });
    return n;
  }, chart);
}

it('loads, lists every backend, and its charts change under load', async () => {
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  page.on('console', (msg) => {
    if (msg.type() === 'error') errors.push(msg.text());
  });
  const res = await page.goto(`${t.url}/dashboard`);
  expect(res?.status()).toBe(200);
  await page.waitForFunction(
    () =>
      ((globalThis as unknown as { slagateDashboard?: { polls: number } }).slagateDashboard?.polls ?? 0) >= 1,
  );

  const rows = await page.$$eval('#backends tbody tr', (trs) =>
    trs.map((tr) => (tr as unknown as { dataset: Record<string, string> }).dataset.backend),
  );
  expect(rows).toEqual(['r0', 'r1', 'r2']);
  expect(
    await page.$$eval('#backends tbody tr td:nth-child(2)', (tds) => tds.map((td) => td.textContent)),
  ).toEqual(['healthy', 'healthy', 'healthy']);
  // Six charts drawn, and before any request no backend has a latency to show.
  expect(await page.locator('.uplot').count()).toBe(6);
  expect(await measured(page, 'ttft')).toBe(0);
  expect(await measured(page, 'decisions')).toBe(0);

  const stop = new AbortController();
  const bench = runBench({
    target: t.url,
    workload: 'sharegpt',
    rate: 20,
    durationS: 60,
    seed: 5,
    progress: false,
    signal: stop.signal,
  });
  try {
    // The page's own polls pick up what the gateway measured: latencies per backend, and the
    // admitted rate from the difference of two polls' counters.
    await page.waitForFunction(
      () => {
        const d = (
          globalThis as unknown as {
            slagateDashboard: {
              charts: Record<string, { plot: { data: (number | null)[][] }; names: string[] }>;
            };
          }
        ).slagateDashboard;
        // At least three polls' worth of points: a line, not one dot.
        const some = (key: string) =>
          d.charts[key]?.names.some(
            (n, i) =>
              !n.endsWith(' target') &&
              (d.charts[key]!.plot.data[i + 1] ?? []).filter((v) => v !== null && v > 0).length >= 3,
          );
        return some('ttft') && some('tpot') && some('decisions') && some('inflight');
      },
      undefined,
      { timeout: 20_000 },
    );
  } finally {
    stop.abort();
    await bench;
  }
  expect(await measured(page, 'ttft')).toBeGreaterThanOrEqual(3);
  expect(await measured(page, 'decisions')).toBeGreaterThanOrEqual(3);
  const served = await page.$$eval('#backends tbody tr td:nth-child(7)', (tds) =>
    tds.map((td) => Number(td.textContent)),
  );
  expect(served.reduce((a, b) => a + b, 0)).toBeGreaterThan(0);

  mkdirSync(ARTIFACTS, { recursive: true });
  await page.screenshot({ path: join(ARTIFACTS, 'dashboard.png'), fullPage: true });
  expect(errors).toEqual([]);
});

it('shows no KV usage for a backend whose last scrape is stale, rather than its last value', async () => {
  // Two loopback backends, both reporting 42% KV usage; s0's /metrics then starts failing.
  let s0Up = true;
  const backend = (metricsUp: () => boolean) =>
    listenLoopback(
      http.createServer((req, res) => {
        if (req.url === '/metrics' && metricsUp()) {
          res.writeHead(200, { 'content-type': 'text/plain' });
          res.end(
            'vllm:kv_cache_usage_perc{model_name="m"} 0.42\nvllm:num_requests_waiting{model_name="m"} 0\n',
          );
          return;
        }
        res.writeHead(req.url === '/metrics' ? 500 : 200, { 'content-type': 'application/json' });
        res.end(req.url === '/v1/models' ? '{"object":"list","data":[]}' : '');
      }),
    );
  const s0 = await backend(() => s0Up);
  const s1 = await backend(() => true);
  const g = await startTestGateway({
    backends: [
      { name: 's0', url: s0.url },
      { name: 's1', url: s1.url },
    ],
    // Scrapes every 200 ms: stale after 600 ms without a good one, long enough for s1 never to lag so far.
    config: { upstream: { metrics_scrape_interval_ms: 200 } },
  });
  try {
    type Telemetry = { kvCacheUsage: number | null; saturated: boolean } | null;
    const telemetry = async () => {
      const state = JSON.parse((await get(g.url, '/admin/state')).text) as {
        backends: { name: string; telemetry: Telemetry }[];
      };
      return Object.fromEntries(state.backends.map((b) => [b.name, b.telemetry]));
    };
    await waitFor(
      async () => Object.values(await telemetry()).every((x) => x?.kvCacheUsage === 0.42 && !x.saturated),
      5_000,
      'both backends scraped',
    );
    s0Up = false;
    // The gateway marks s0's telemetry stale (three intervals without a good scrape); its state
    // still carries the last value read, which the page must not show as current.
    await waitFor(async () => (await telemetry()).s0?.saturated === true, 5_000, 's0 stale');
    const now = await telemetry();
    expect(now.s0).toMatchObject({ kvCacheUsage: 0.42, saturated: true });
    expect(now.s1).toMatchObject({ kvCacheUsage: 0.42, saturated: false });

    const page = await browser.newPage();
    try {
      await page.goto(`${g.url}/dashboard`);
      await page.waitForFunction(
        () =>
          ((globalThis as unknown as { slagateDashboard?: { polls: number } }).slagateDashboard?.polls ??
            0) >= 1,
      );
      const rows = await page.$$eval('#backends tbody tr', (trs) =>
        trs.map((tr) => [
          (tr as unknown as { dataset: Record<string, string> }).dataset.backend,
          tr.querySelector('td:nth-child(4)')?.textContent,
        ]),
      );
      expect(rows).toEqual([
        ['s0', '–'],
        ['s1', '42%'],
      ]);
    } finally {
      await page.close();
    }
  } finally {
    await g.close();
    await s0.close();
    await s1.close();
  }
});

it('charts a class named like a method of every object (toString) as any other: a queue depth of 0, not a function', async () => {
  const g = await startTestGateway({ replicas: 1, config: METHOD_NAMED_CLASSES });
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  try {
    await page.goto(`${g.url}/dashboard`);
    await page.waitForFunction(
      () =>
        ((globalThis as unknown as { slagateDashboard?: { polls: number } }).slagateDashboard?.polls ?? 0) >=
        2,
    );
    const queue = await page.evaluate(() => {
      const c = (
        globalThis as unknown as {
          slagateDashboard: { charts: Record<string, { plot: { data: unknown[][] }; names: string[] }> };
        }
      ).slagateDashboard.charts.queue!;
      return Object.fromEntries(c.names.map((n, i) => [n, (c.plot.data[i + 1] ?? []).map((v) => typeof v)]));
    });
    expect(Object.keys(queue).sort()).toEqual(['constructor', 'toString']);
    for (const types of Object.values(queue)) {
      expect(types.length).toBeGreaterThanOrEqual(2);
      expect(new Set(types)).toEqual(new Set(['number']));
    }
    expect(errors).toEqual([]);
  } finally {
    await page.close();
    await g.close();
  }
});

it("shows an ejected backend's time left, and how many times it was ejected once that is more than one", async () => {
  const g = await startTestGateway({
    replicas: 2,
    timeScale: 0.2,
    config: {
      upstream: { outlier: { consecutive_failures: 2, base_ejection_ms: 4_000, max_ejection_percent: 50 } },
    },
  });
  const ejected = async () =>
    (
      JSON.parse((await get(g.url, '/admin/state')).text) as {
        backends: { name: string; ejected: boolean }[];
      }
    ).backends.find((b) => b.name === 'r0')!.ejected;
  /** Requests until r0 (answering 500) is ejected: each fails there and is served by r1. */
  const ejectR0 = async () => {
    for (let i = 0; i < 20 && !(await ejected()); i++)
      expect((await post(g.url, '/v1/chat/completions', chat())).status).toBe(200);
    expect(await ejected()).toBe(true);
  };
  /** r0's state cell once it matches `pattern` (the page polls once a second). */
  const r0State = async (page: Page, pattern: RegExp): Promise<string> => {
    const handle = await page.waitForFunction(
      (source) => {
        const { document } = globalThis as unknown as {
          document: { querySelector(selector: string): { textContent: string | null } | null };
        };
        const td = document.querySelector('#backends tbody tr[data-backend="r0"] td:nth-child(2)');
        const text = td?.textContent ?? '';
        return new RegExp(source).test(text) ? text : null;
      },
      pattern.source,
      { timeout: 5_000 },
    );
    return (await handle.jsonValue()) as string;
  };
  try {
    // The page polls before anything is ejected, so it sees the ejection within a second.
    const page = await browser.newPage();
    await page.goto(`${g.url}/dashboard`);
    await r0State(page, /^healthy$/);
    await g.fleet!.replicas[0]!.fault({ mode: 'error', status: 500 });
    await ejectR0();
    // The first ejection: 4 s at most, no count shown.
    const first = await r0State(page, /^ejected, \d+ s left$/);
    expect(Number(/(\d+) s left/.exec(first)![1])).toBeGreaterThanOrEqual(1);
    expect(Number(/(\d+) s left/.exec(first)![1])).toBeLessThanOrEqual(4);
    expect(await page.textContent('#backends tbody tr[data-backend="r1"] td:nth-child(2)')).toBe('healthy');
    // It runs out; r0 still fails, and is ejected again, for twice as long.
    await waitFor(async () => !(await ejected()), 8_000, 'r0 back');
    await ejectR0();
    const second = await r0State(page, /^ejected ×2, \d+ s left$/);
    expect(Number(/(\d+) s left/.exec(second)![1])).toBeLessThanOrEqual(8);
    await page.close();
  } finally {
    await g.close();
  }
});

it('draws the available backends’ limit at 0 when none is available, not as a gap', async () => {
  const g = await startTestGateway({ replicas: 2, timeScale: 0.2 });
  /** The last value of the in-flight chart's limit series, and the page's poll count. */
  const limitNow = async (page: Page) => {
    const c = await chartNow(page, 'inflight');
    const i = c.names.indexOf('limit (available backends)');
    return { polls: c.polls, limit: i < 0 ? undefined : c.data[i]!.at(-1) };
  };
  const page = await browser.newPage();
  try {
    await page.goto(`${g.url}/dashboard`);
    await waitFor(async () => ((await limitNow(page)).limit ?? 0) > 0, 5_000, 'a limit drawn');
    for (const r of g.fleet!.replicas) await r.fault({ mode: 'refuse' });
    const available = async () =>
      (
        JSON.parse((await get(g.url, '/admin/state')).text) as { backends: { available: boolean }[] }
      ).backends.some((b) => b.available);
    await waitFor(async () => !(await available()), 5_000, 'no backend available');
    // Two polls after that: the last drawn is of a fleet with nothing available.
    const polls = (await limitNow(page)).polls;
    await waitFor(async () => (await limitNow(page)).polls >= polls + 2, 5_000, 'two more polls');
    expect(await available()).toBe(false);
    expect((await limitNow(page)).limit).toBe(0);
  } finally {
    await page.close();
    await g.close();
  }
});
