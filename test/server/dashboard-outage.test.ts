import type { BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { scripted, startTestGateway, type TestGateway } from '../gateway/harness.ts';
import { launchChromium } from '../helpers/chromium.ts';
import { forwardingProxy } from '../helpers/http.ts';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
let gateway: TestGateway;
let front: string;
let browser: BrowserContext;
/** What the proxy in front of the gateway does with GET /admin/state. */
let mode: 'pass' | 'hang' = 'pass';

beforeAll(async () => {
  const backend = await scripted((_req, res) => res.writeHead(500).end());
  cleanups.push(() => backend.close());
  gateway = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }] });
  cleanups.push(() => gateway.close());
  // Accepted, never answered: a gateway whose loop is stuck, or a half-open connection.
  const proxy = await forwardingProxy((req) =>
    mode === 'hang' && req.url === '/admin/state' ? null : gateway.url,
  );
  cleanups.push(() => proxy.close());
  front = proxy.url;
  browser = await launchChromium();
  cleanups.push(() => browser.close());
});
afterAll(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Dash {
  polls: number;
  errors: number;
  charts: Record<string, { plot: { data: (number | null)[][] } }>;
}
const dash = (page: Page) =>
  page.evaluate(() => {
    const d = (globalThis as unknown as { slagateDashboard: Dash }).slagateDashboard;
    return { polls: d.polls, errors: d.errors, inflight: d.charts.inflight!.plot.data[1] ?? [] };
  });
const until = (page: Page, fn: string) => page.waitForFunction(fn, undefined, { timeout: 15_000 });

it('a poll the gateway never answers fails within its timeout, and leaves a gap; polling resumes after', async () => {
  const page = await browser.newPage();
  const errors: string[] = [];
  page.on('pageerror', (err) => errors.push(err.message));
  expect((await page.goto(`${front}/dashboard`))?.status()).toBe(200);
  await until(page, 'globalThis.slagateDashboard.polls >= 2');
  const before = await dash(page);
  expect(before.errors).toBe(0);
  expect(before.inflight.at(-1)).toBe(0);

  mode = 'hang';
  await until(page, 'globalThis.slagateDashboard.errors >= 1');
  expect(await page.locator('#error').textContent()).toMatch(/gateway unreachable/);
  // The failed poll is a gap where the in-flight line was.
  expect((await dash(page)).inflight.at(-1)).toBeNull();
  // And the table and header no longer show the last answer's figures as current.
  const row = page.locator('#backends tbody tr[data-backend="b0"] td');
  expect(await row.allTextContents()).toEqual(['b0', 'unknown', '–', '–', '–', '–', '–', '–']);
  expect(await page.locator('#s-inflight').textContent()).toBe('–');
  expect(await page.locator('#s-queued').textContent()).toBe('–');

  mode = 'pass';
  const polls = (await dash(page)).polls;
  await until(page, `globalThis.slagateDashboard.polls >= ${polls + 2}`);
  const after = await dash(page);
  expect(after.inflight.at(-1)).toBe(0);
  expect(after.inflight).toContain(null);
  expect(await page.locator('#s-inflight').textContent()).toBe('0');
  expect((await row.allTextContents())[1]).not.toBe('unknown');
  expect(await page.locator('#error').isHidden()).toBe(true);
  expect(errors).toEqual([]);
});
