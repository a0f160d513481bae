// /dashboard when the gateway stops answering: a poll that gets no answer fails within its timeout
// (the banner says so) instead of leaving the last figures on screen as current, and a failed poll
// is a gap in the charts, not a line drawn across the outage.
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { scripted, startTestGateway, type TestGateway } from '../gateway/harness.ts';
import { launchChromium } from '../helpers/chromium.ts';

const cleanups: (() => Promise<unknown> | unknown)[] = [];
let gateway: TestGateway;
let front: string;
let browser: BrowserContext;
/** What the proxy in front of the gateway does with GET /admin/state. */
let mode: 'pass' | 'hang' = 'pass';
const held: Socket[] = [];

beforeAll(async () => {
  const backend = await scripted((_req, res) => res.writeHead(500).end());
  cleanups.push(() => backend.close());
  gateway = await startTestGateway({ backends: [{ name: 'b0', url: backend.url }] });
  cleanups.push(() => gateway.close());
  const target = new URL(gateway.url);
  const server = http.createServer((req, res) => {
    if (mode === 'hang' && req.url === '/admin/state') {
      // Accepted, never answered: a gateway whose loop is stuck, or a half-open connection.
      held.push(req.socket);
      return;
    }
    const up = http.request(
      { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanups.push(() => {
    for (const s of held) s.destroy();
    server.closeAllConnections();
    server.close();
  });
  front = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const profile = mkdtempSync(join(tmpdir(), 'slagate-chromium-'));
  cleanups.push(() => rmSync(profile, { recursive: true, force: true }));
  browser = await launchChromium(profile);
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

  mode = 'pass';
  const polls = (await dash(page)).polls;
  await until(page, `globalThis.slagateDashboard.polls >= ${polls + 2}`);
  const after = await dash(page);
  expect(after.inflight.at(-1)).toBe(0);
  expect(after.inflight).toContain(null);
  expect(await page.locator('#error').isHidden()).toBe(true);
  expect(errors).toEqual([]);
});
