// Raw HTTP for tests: one connection per request (no pooling, no retries), exact status, headers
// and body text, so a test sees precisely what a server sent.

import { once } from 'node:events';
import http from 'node:http';
import { connect, type Socket } from 'node:net';

export interface RawResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
}

/** Reads a whole response. */
export function collect(res: http.IncomingMessage): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    res.on('data', (c: Buffer) => chunks.push(c));
    res.on('end', () =>
      resolve({
        status: res.statusCode ?? 0,
        headers: res.headers,
        text: Buffer.concat(chunks).toString('utf8'),
      }),
    );
    res.on('error', reject);
  });
}

/** One request; a body that is not a string is sent as JSON (with its content-type). */
export function send(
  base: string,
  method: string,
  path: string,
  body?: unknown,
  headers: http.OutgoingHttpHeaders = {},
): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const req = http.request(
      `${base}${path}`,
      {
        method,
        agent: false,
        headers: payload === undefined ? headers : { 'content-type': 'application/json', ...headers },
      },
      (res) => collect(res).then(resolve, reject),
    );
    req.on('error', reject);
    req.end(payload);
  });
}

/** A streaming request read as it arrives; `close()` hangs up. */
export interface OpenStream {
  status: number;
  headers: http.IncomingHttpHeaders;
  received(): string;
  /** Resolves when `pred(received)` holds; rejects when the response ends first or on timeout. */
  until(pred: (text: string) => boolean, timeoutMs?: number): Promise<string>;
  /** Resolves when the response is over; `complete` is false for a cut connection. */
  ended: Promise<{ complete: boolean }>;
  close(): void;
}

/**
 * The client's stream, for an upstream script that waits on what the client has before it writes
 * on: `client` resolves once the test hands the opened stream over with `ready`.
 */
export function streamToCome(): { client: Promise<OpenStream>; ready: (s: OpenStream) => void } {
  let ready: (s: OpenStream) => void = () => {};
  const client = new Promise<OpenStream>((r) => {
    ready = r;
  });
  return { client, ready };
}

/** Sends a request and resolves at its response headers. `sent` resolves when the body is out. */
export function openStream(
  base: string,
  path: string,
  body: unknown,
  headers: http.OutgoingHttpHeaders = {},
): { response: Promise<OpenStream>; abort(): void } {
  const req = http.request(`${base}${path}`, {
    method: 'POST',
    agent: false,
    headers: { 'content-type': 'application/json', ...headers },
  });
  const response = new Promise<OpenStream>((resolve, reject) => {
    req.on('error', reject);
    req.on('response', (res) => {
      let text = '';
      const waiters = new Set<() => void>();
      const ended = new Promise<{ complete: boolean }>((done) => {
        res.on('end', () => done({ complete: true }));
        res.on('close', () => done({ complete: res.complete }));
        res.on('error', () => done({ complete: false }));
      });
      res.on('data', (c: Buffer) => {
        text += c.toString('utf8');
        for (const w of waiters) w();
      });
      resolve({
        status: res.statusCode ?? 0,
        headers: res.headers,
        received: () => text,
        ended,
        close: () => req.destroy(),
        until(pred, timeoutMs = 5000) {
          return new Promise((ok, fail) => {
            const cleanup = () => {
              clearTimeout(timer);
              waiters.delete(check);
            };
            const check = () => {
              if (!pred(text)) return;
              cleanup();
              ok(text);
            };
            const timer = setTimeout(() => {
              cleanup();
              fail(new Error(`timed out; received ${JSON.stringify(text.slice(0, 300))}`));
            }, timeoutMs);
            waiters.add(check);
            void ended.then(() => {
              if (!waiters.has(check)) return;
              check();
              if (!waiters.has(check)) return;
              cleanup();
              fail(new Error(`stream ended; received ${JSON.stringify(text.slice(0, 300))}`));
            });
            check();
          });
        },
      });
    });
  });
  // A test that aborts before the response would otherwise leave an unhandled rejection.
  response.catch(() => {});
  req.end(JSON.stringify(body));
  return { response, abort: () => req.destroy() };
}

/** Listens on an ephemeral port of 127.0.0.1; `close()` drops open connections and waits. */
export async function listenLoopback(server: http.Server): Promise<{ url: string; close(): Promise<void> }> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as import('node:net').AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * A forwarding proxy on 127.0.0.1 (a balancer, or a path that stops answering): each request goes
 * to the origin `route` names for it, or, when it names none, is accepted and never answered (its
 * socket is destroyed at close()).
 */
export async function forwardingProxy(
  route: (req: http.IncomingMessage) => string | null,
  /** How long to hold each answer before passing it on (its head and body as they came). */
  holdMs: (req: http.IncomingMessage) => number = () => 0,
): Promise<{ url: string; close(): Promise<void> }> {
  const held: import('node:net').Socket[] = [];
  const server = http.createServer((req, res) => {
    const origin = route(req);
    if (origin === null) {
      held.push(req.socket);
      return;
    }
    const target = new URL(origin);
    const up = http.request(
      { host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers },
      (answer) => {
        const pass = () => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        };
        const ms = holdMs(req);
        if (ms > 0) setTimeout(pass, ms);
        else pass();
      },
    );
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  const listening = await listenLoopback(server);
  return {
    url: listening.url,
    close: () => {
      for (const s of held) s.destroy();
      return listening.close();
    },
  };
}

/** A raw TCP connection to a server, for requests written byte by byte. */
export interface RawConnection {
  readonly socket: Socket;
  /** Everything the server has written back so far. */
  received(): string;
  /** Resolves with what was received once `pred` holds of it. */
  until(pred: (text: string) => boolean): Promise<string>;
}

/** Opens a raw connection to `base`'s server (a reset it sends is the test's to judge, not an error). */
export async function rawConnection(base: string): Promise<RawConnection> {
  const socket = connect(Number(new URL(base).port), '127.0.0.1');
  await once(socket, 'connect');
  let text = '';
  const waiters = new Set<() => void>();
  socket.on('data', (c: Buffer) => {
    text += c.toString('utf8');
    for (const w of waiters) w();
  });
  socket.on('error', () => {});
  return {
    socket,
    received: () => text,
    until: (pred) =>
      new Promise((resolve) => {
        const check = () => {
          if (!pred(text)) return;
          waiters.delete(check);
          resolve(text);
        };
        waiters.add(check);
        check();
      }),
  };
}
