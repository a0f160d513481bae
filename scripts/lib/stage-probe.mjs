// Preloaded (node --import) into a proxy under scripts/stages.ts: when each stage of each request
// happened in this process, from node:http's, undici's and the gateway's own diagnostics channels
// (src/telemetry/stages.ts). Requests are taken one at a time (the script sends one stream), so a
// mark belongs to the request that arrived last. On SIGUSR2 every request's marks are written as
// JSON to the file named by STAGE_PROBE_OUT.
//
// Plain JavaScript, so that it loads into any Node process before that process's own loader.
import { subscribe } from 'node:diagnostics_channel';
import { writeFileSync } from 'node:fs';
import net from 'node:net';

const rows = [];
let cur = null;
let client = null;

const once = (key) => {
  if (cur !== null && cur[key] === undefined) cur[key] = performance.now();
};

subscribe('http.server.request.start', ({ request }) => {
  if (request.method !== 'POST' || !request.url.startsWith('/v1/')) return;
  const at = performance.now();
  if (cur !== null && cur.finish !== undefined) cur.nextArrival = at;
  cur = { arrival: at };
  client = request.socket;
  rows.push(cur);
});
subscribe('http.server.response.finish', () => once('finish'));
subscribe('undici:client:sendHeaders', () => once('upstreamSent'));
subscribe('undici:request:bodyChunkReceived', () => once('upstreamFirstChunk'));
subscribe('slagate:request:stage', ({ stage, at }) => {
  if (cur !== null && cur[stage] === undefined) cur[stage] = at;
});

// The first bytes after the upstream's first chunk that go to the client's socket, by either of
// the two ways a socket writes.
for (const method of ['_writeGeneric', '_writev']) {
  const original = net.Socket.prototype[method];
  net.Socket.prototype[method] = function (...args) {
    if (this === client && cur !== null && cur.upstreamFirstChunk !== undefined) once('clientFirstWrite');
    return original.apply(this, args);
  };
}

process.on('SIGUSR2', () => {
  writeFileSync(process.env.STAGE_PROBE_OUT, JSON.stringify(rows));
});
