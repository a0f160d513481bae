import type { BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { post, scripted, startTestGateway, type TestGateway } from '../gateway/harness.ts';
import { launchChromium } from '../helpers/chromium.ts';
import { chartNow } from '../helpers/dashboard.ts';
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

it("turns two polls' counts into a rate over the gateway's time between them, not the browser's", async () => {
  // Every other answer of /admin/state is held 600 ms on its way: the browser receives the polls
  // unevenly, while the gateway read their counts about a second apart each time.
  let polls = 0;
  const proxy = await forwardingProxy(
    () => a.url,
    (req) => (req.url === '/admin/state' && polls++ % 2 === 1 ? 600 : 0),
  );
  cleanups.push(() => proxy.close());
  const page = await browser.newPage();
  const bodies: Promise<{
    uptime_ms: number;
    admission: { requests: { refused: Record<string, number> } };
  }>[] = [];
  page.on('response', (r) => {
    if (new URL(r.url()).pathname === '/admin/state' && r.ok()) bodies.push(r.json());
  });
  // Refusals keep coming while the page polls.
  let sending = true;
  const load = (async () => {
    while (sending) await post(a.url, '/v1/chat/completions', { model: 'no-such-model', messages: [] });
  })();
  expect((await page.goto(`${proxy.url}/dashboard`))?.status()).toBe(200);
  await page.waitForFunction(
    () =>
      ((globalThis as unknown as { slagateDashboard?: { polls: number } }).slagateDashboard?.polls ?? 0) >= 6,
    undefined,
    { timeout: 20_000 },
  );
  sending = false;
  await load;
  const chart = await chartNow(page, 'decisions');
  const states = (await Promise.all(bodies)).slice(0, chart.polls);
  // The load's refusals: one reason, whichever intake names for a body with no messages.
  const reasons = Object.keys(states.at(-1)!.admission.requests.refused);
  expect(reasons).toHaveLength(1);
  const reason = reasons[0]!;
  const drawn = chart.data[chart.names.indexOf(`refused: ${reason}`)]!;
  let compared = 0;
  for (let i = 1; i < states.length; i++) {
    const before = states[i - 1]!;
    const now = states[i]!;
    const refused = (s: typeof now) => s.admission.requests.refused[reason] ?? 0;
    const expected = (refused(now) - refused(before)) / ((now.uptime_ms - before.uptime_ms) / 1000);
    if (refused(before) === 0) continue; // the series starts at its first refusal
    expect(drawn[i]).toBeCloseTo(expected, 6);
    if (expected > 0) compared++;
  }
  expect(compared).toBeGreaterThanOrEqual(3);
});
