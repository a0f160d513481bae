// Raw HTTP against a simulated replica: exact status, headers and body bytes, no pooling.

export { type OpenStream, type RawResponse, send } from '../helpers/http.ts';

import { type OpenStream, openStream as openStreamAt, send } from '../helpers/http.ts';

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
export function openStream(
  base: string,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<OpenStream> {
  return openStreamAt(base, path, body, headers).response;
}

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
