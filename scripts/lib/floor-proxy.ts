// The reference floors of the request-path benchmark: the least a proxy in Node can add.
//
//   tcp   a TCP pass-through: each client connection gets its own connection to the backend and
//         bytes are piped both ways; no HTTP parsing at all.
//   http  a minimal node:http proxy: a node:http server, one keep-alive agent to the backend,
//         request and response bodies piped, status and headers copied; no other work.
//   undici the same server with undici underneath, as slagate has: the request body read whole,
//         one Pool.dispatch with a bare handler that writes each response chunk with res.write.
//         Against `http` it shows what undici itself costs (or saves) per request and event.
//
// Prints its URL on stdout, serves until SIGTERM.
//
//   npx tsx scripts/lib/floor-proxy.ts --kind tcp|http|undici --target http://127.0.0.1:PORT

import http from 'node:http';
import net from 'node:net';
import { parseArgs } from 'node:util';
import { type Dispatcher, Pool } from 'undici';

const { values } = parseArgs({ options: { kind: { type: 'string' }, target: { type: 'string' } } });
const target = new URL(values.target ?? '');
const port = Number(target.port);

let server: net.Server;
if (values.kind === 'tcp') {
  server = net.createServer((client) => {
    const up = net.connect(port, target.hostname);
    client.setNoDelay(true);
    up.setNoDelay(true);
    client.pipe(up).on('error', () => client.destroy());
    up.pipe(client).on('error', () => up.destroy());
    client.on('error', () => up.destroy());
    up.on('error', () => client.destroy());
    client.on('close', () => up.destroy());
    up.on('close', () => client.destroy());
  });
} else if (values.kind === 'http') {
  const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity });
  server = http.createServer((req, res) => {
    const up = http.request(
      { host: target.hostname, port, method: req.method, path: req.url, headers: req.headers, agent },
      (upRes) => {
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        upRes.pipe(res);
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  (server as http.Server).keepAliveTimeout = 60_000;
} else if (values.kind === 'undici') {
  const pool = new Pool(target.origin, { connections: 1024 });
  server = http.createServer((req, res) => {
    const body: Buffer[] = [];
    req.on('data', (c: Buffer) => body.push(c));
    req.on('end', () => {
      // onRequestStart marks the handler as undici 7's controller API (as slagate's Attempt is).
      const handler: Dispatcher.DispatchHandler = {
        onRequestStart: () => {},
        onResponseStart: (_c, status, headers) => {
          const type = headers['content-type'];
          res.writeHead(status, type === undefined ? {} : { 'content-type': type });
        },
        onResponseData: (_c, chunk) => {
          res.write(chunk);
        },
        onResponseEnd: () => {
          res.end();
        },
        onResponseError: () => {
          res.destroy();
        },
      };
      pool.dispatch(
        {
          path: req.url ?? '/',
          method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
          body: req.method === 'POST' ? Buffer.concat(body) : null,
          // The client's request id goes upstream, as slagate sends it (scripts/stages.ts follows it).
          headers:
            typeof req.headers['x-request-id'] === 'string'
              ? { 'content-type': 'application/json', 'x-request-id': req.headers['x-request-id'] }
              : { 'content-type': 'application/json' },
          headersTimeout: 0,
          bodyTimeout: 0,
        },
        handler,
      );
    });
  });
  (server as http.Server).keepAliveTimeout = 60_000;
} else {
  throw new Error('--kind tcp|http|undici');
}
server.listen(0, '127.0.0.1', () => {
  const { port: p } = server.address() as net.AddressInfo;
  process.stdout.write(`http://127.0.0.1:${p}\n`);
});
process.on('SIGTERM', () => process.exit(0));
