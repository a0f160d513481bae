// GET /dashboard: the live page (dashboard/index.html and its script), and uPlot from the
// installed package. Every file is read once, when the app is built; the page itself polls
// /admin/state, so the dashboard adds nothing to the request path.

import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { FastifyInstance } from 'fastify';

interface Asset {
  type: string;
  body: Buffer;
}

function own(file: string, type: string): Asset {
  return { type, body: readFileSync(new URL(`./dashboard/${file}`, import.meta.url)) };
}

function uplot(file: string, type: string): Asset {
  const require = createRequire(import.meta.url);
  return { type, body: readFileSync(require.resolve(`uplot/dist/${file}`)) };
}

export function registerDashboard(app: FastifyInstance): void {
  const assets: Record<string, Asset> = {
    '/dashboard': own('index.html', 'text/html; charset=utf-8'),
    '/dashboard/dashboard.js': own('dashboard.js', 'text/javascript; charset=utf-8'),
    '/dashboard/dashboard.css': own('dashboard.css', 'text/css; charset=utf-8'),
    '/dashboard/uplot.js': uplot('uPlot.iife.min.js', 'text/javascript; charset=utf-8'),
    '/dashboard/uplot.css': uplot('uPlot.min.css', 'text/css; charset=utf-8'),
  };
  for (const [url, asset] of Object.entries(assets)) {
    app.get(url, async (_request, reply) =>
      reply.header('content-type', asset.type).header('cache-control', 'no-cache').send(asset.body),
    );
  }
}
