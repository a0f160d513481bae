// Preloaded (node --import) into a proxy under scripts/stages.ts: when each stage of each request
// happened in this process, from node:http's, undici's and the gateway's own diagnostics channels
// (src/telemetry/stages.ts). A request is known by its x-request-id, which the client sets, the
// gateway keeps and both the gateway (with a suffix) and the undici floor send upstream; its client
// connection serves one request at a time, so a write to that socket belongs to the request it
// carries now.
// On SIGUSR2 every request's marks are written as JSON to the file named by STAGE_PROBE_OUT, with
// where this process's performance.now() starts on the system's monotonic clock (process.hrtime,
// which every process shares; a mark plus it compares with the client's times).
//
// Plain JavaScript, so that it loads into any Node process before that process's own loader.
import { subscribe } from 'node:diagnostics_channel';
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import { PerformanceObserver } from 'node:perf_hooks';

const rows = [];
const byId = new Map();
const bySocket = new WeakMap();
const byUpstream = new WeakMap();

const mark = (row, key, at = performance.now()) => {
  if (row !== undefined && row[key] === undefined) row[key] = at;
};

/** The x-request-id among undici's flat [name, value, ...] header list. */
function upstreamId(headers) {
  if (!Array.isArray(headers)) return undefined;
  for (let i = 0; i < headers.length; i += 2) {
    if (String(headers[i]).toLowerCase() === 'x-request-id') return String(headers[i + 1]);
  }
  return undefined;
}

subscribe('http.server.request.start', ({ request }) => {
  if (request.method !== 'POST' || !request.url.startsWith('/v1/')) return;
  const at = performance.now();
  const id = request.headers['x-request-id'];
  // The request that arrived before this one: the time from its end to this arrival (it means
  // something for one stream, where this request was sent when that one ended).
  const before = rows.at(-1);
  if (before?.finish !== undefined) before.nextArrival = at;
  const row = { id, arrival: at };
  rows.push(row);
  if (id !== undefined) byId.set(id, row);
  bySocket.set(request.socket, row);
});
subscribe('http.server.response.finish', ({ request }) => mark(bySocket.get(request.socket), 'finish'));
subscribe('undici:request:create', ({ request }) => {
  // The gateway sends `<id>.<suffix>` upstream (each attempt its own); the floor sends the id.
  const id = upstreamId(request.headers) ?? '';
  const row = byId.get(id) ?? byId.get(id.slice(0, id.lastIndexOf('.')));
  if (row !== undefined) byUpstream.set(request, row);
});
subscribe('undici:client:sendHeaders', ({ request }) => mark(byUpstream.get(request), 'upstreamSent'));
subscribe('undici:request:bodyChunkReceived', ({ request }) =>
  mark(byUpstream.get(request), 'upstreamFirstChunk'),
);
// Upstream connections opened (a request that needs one waits for the connect).
const connects = [];
subscribe('undici:client:connected', () => connects.push(performance.now()));
subscribe('slagate:request:stage', ({ reqId, stage, at }) => mark(byId.get(reqId), stage, at));

// The first bytes after the upstream's first chunk that go to the client's socket, by either of
// the two ways a socket writes.
for (const method of ['_writeGeneric', '_writev']) {
  const original = net.Socket.prototype[method];
  net.Socket.prototype[method] = function (...args) {
    const row = bySocket.get(this);
    if (row?.upstreamFirstChunk !== undefined) mark(row, 'clientFirstWrite');
    return original.apply(this, args);
  };
}

// The garbage collector's pauses ([start, duration, kind] in performance.now() ms): a request
// that waits while one runs has waited for it.
const gcs = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcs.push([e.startTime, e.duration, e.detail?.kind ?? 0]);
}).observe({ entryTypes: ['gc'] });

process.on('SIGUSR2', () => {
  writeFileSync(
    process.env.STAGE_PROBE_OUT,
    JSON.stringify({
      origin: Number(process.hrtime.bigint()) / 1e6 - performance.now(),
      rows,
      gcs,
      connects,
    }),
  );
});
