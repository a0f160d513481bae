// What the live dashboard page has drawn (window.slagateDashboard, src/server/dashboard/dashboard.js),
// read from the page a test drives.
import type { Page } from 'playwright-core';

export interface ChartNow {
  /** Polls the page has made. */
  polls: number;
  /** The chart's series, in order (none while the chart is not drawn yet). */
  names: string[];
  /** Each series' values, one per poll kept (the time axis left out). */
  data: (number | null)[][];
}

/** One chart of the page (`inflight`, `decisions`, …) as drawn now. */
export function chartNow(page: Page, key: string): Promise<ChartNow> {
  return page.evaluate((k) => {
    const d = (
      globalThis as unknown as {
        slagateDashboard: {
          polls: number;
          charts: Record<string, { plot: { data: (number | null)[][] }; names: string[] }>;
        };
      }
    ).slagateDashboard;
    const c = d.charts[k];
    return { polls: d.polls, names: c?.names ?? [], data: c?.plot.data.slice(1) ?? [] };
  }, key);
}
