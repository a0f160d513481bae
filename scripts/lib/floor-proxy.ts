// The reference floors of the request-path benchmark: the least a proxy in Node can add.
//
//   tcp   a TCP pass-through: each client connection gets its own connection to the backend and
//         bytes are piped both ways; no HTTP parsing at all.
//   http  a minimal node:http proxy: a node:http server, one keep-alive agent to the backend,
//         request and response bodies piped, status and headers copied; no other work.
//
// Prints its URL on stdout, serves until SIGTERM.
//
//   npx tsx scripts/lib/floor-proxy.ts --kind tcp|http --target http://127.0.0.1:PORT

import http from 'node:http';
import net from 'node:net';
import { parseArgs } from 'node:util';

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
} else {
  throw new Error('--kind tcp|http');
}
server.listen(0, '127.0.0.1', () => {
  const { port: p } = server.address() as net.AddressInfo;
  process.stdout.write(`http://127.0.0.1:${p}\n`);
});
process.on('SIGTERM', () => process.exit(0));
