import type { BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { post, scripted, startTestGateway, type TestGateway } from '../gateway/harness.ts';
import { launchChromium } from '../helpers/chromium.ts';
import { forwardingProxy } from '../helpers/http.ts';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
let a: TestGateway;
let b: TestGateway;
let balancer: string;
let browser: BrowserContext;

/** Sends request n to targets[n % 2], as a balancer with two idle upstreams does. */
async function roundRobin(targets: string[]): Promise<string> {
  let next = 0;
  const proxy = await forwardingProxy(() => targets[next++ % targets.length]!);
  cleanups.push(() => proxy.close());
  return proxy.url;
}

beforeAll(async () => {
  const backend = await scripted((_req, res) => res.writeHead(500).end());
  cleanups.push(() => backend.close());
  a = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }] });
  b = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }] });
  cleanups.push(
    () => a.close(),
    () => b.close(),
  );
  balancer = await roundRobin([a.url, b.url]);
  browser = await launchChromium();
  cleanups.push(() => browser.close());
});
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

it('draws no rate from two polls of different instances, and none below zero', async () => {
  // Instance a has refused 30 requests; b none.
  for (let i = 0; i < 30; i++) {
    const res = await post(a.url, '/v1/chat/completions', { model: 'no-such-model', messages: [] });
    expect(res.status).toBeGreaterThanOrEqual(400);
  }
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  expect((await page.goto(`${balancer}/dashboard`))?.status()).toBe(200);
  await page.waitForFunction(
    () =>
      ((globalThis as unknown as { slagateDashboard?: { polls: number } }).slagateDashboard?.polls ?? 0) >= 5,
    undefined,
    { timeout: 20_000 },
  );
  const seen = await page.evaluate(() => {
    const d = (
      globalThis as unknown as {
        slagateDashboard: {
          state: { instance: string };
          charts: Record<string, { plot: { data: (number | null)[][] }; names: string[] }>;
        };
      }
    ).slagateDashboard;
    const c = d.charts.decisions!;
    return { rates: c.names.flatMap((_n, i) => c.plot.data[i + 1] ?? []), instance: d.state.instance };
  });
  // The polls reached both instances (the header names the last one's).
  expect([a.gw.runtime.live.instanceId, b.gw.runtime.live.instanceId]).toContain(seen.instance);
  // Every poll's instance differs from the one before, so no rate is drawn: a's 30 refusals less
  // b's 0 would read as ±30 over a second, alternately.
  expect(seen.rates.filter((v) => v !== null)).toEqual([]);
  expect(errors).toEqual([]);
});
