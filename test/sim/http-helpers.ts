// Raw HTTP against a simulated replica: exact status, headers and body bytes, no pooling.

import { type ClientRequest, type IncomingMessage, request } from 'node:http';

export { type RawResponse, send } from '../helpers/http.ts';

import { send } from '../helpers/http.ts';

export const post = (base: string, path: string, body: unknown, headers?: Record<string, string>) =>
  send(base, 'POST', path, body, headers);

/** The `data:` payloads of an SSE body; throws if any event is not exactly `data: X\n\n`. */
export function sseData(text: string): string[] {
  if (!text.endsWith('\n\n'))
    throw new Error(`SSE body does not end with a blank line: ${JSON.stringify(text.slice(-40))}`);
  return text
    .slice(0, -2)
    .split('\n\n')
    .map((event) => {
      if (!event.startsWith('data: ') || event.includes('\n'))
        throw new Error(`bad SSE event: ${JSON.stringify(event)}`);
      return event.slice('data: '.length);
    });
}

/** A streaming request whose body arrives incrementally; `close()` drops the connection. */
export interface OpenStream {
  res: IncomingMessage;
  req: ClientRequest;
  /** Everything received so far. */
  received(): string;
  /** Resolves when `pred(received)` holds; rejects when the response ends first. */
  until(pred: (text: string) => boolean, timeoutMs?: number): Promise<string>;
  /** Resolves when the connection is gone; `complete` says whether the response ended cleanly. */
  ended: Promise<{ complete: boolean }>;
  close(): void;
}

export function openStream(
  base: string,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<OpenStream> {
  return new Promise((resolve, reject) => {
    const req = request(
      `${base}${path}`,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } },
      (res) => {
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
          res,
          req,
          received: () => text,
          ended,
          close: () => req.destroy(),
          until(pred, timeoutMs = 5000) {
            return new Promise((ok, fail) => {
              const check = () => {
                if (pred(text)) {
                  cleanup();
                  ok(text);
                }
              };
              const timer = setTimeout(() => {
                cleanup();
                fail(new Error(`timed out; received ${JSON.stringify(text.slice(0, 300))}`));
              }, timeoutMs);
              const cleanup = () => {
                clearTimeout(timer);
                waiters.delete(check);
              };
              waiters.add(check);
              void ended.then(() => {
                if (waiters.has(check)) {
                  check();
                  if (waiters.has(check)) {
                    cleanup();
                    fail(new Error(`stream ended; received ${JSON.stringify(text.slice(0, 300))}`));
                  }
                }
              });
              check();
            });
          },
        });
      },
    );
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

/** Polls `fn` until it returns true (or throws after `timeoutMs`). */
export async function waitFor(fn: () => boolean, timeoutMs = 5000, what = 'condition'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!fn()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The error code of a failed connection attempt (ECONNREFUSED, ECONNRESET, ...), or 'ok'. */
export async function connectResult(base: string): Promise<string> {
  try {
    await send(base, 'GET', '/health');
    return 'ok';
  } catch (e) {
    return (e as NodeJS.ErrnoException).code ?? String(e);
  }
}
