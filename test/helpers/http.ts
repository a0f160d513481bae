// Raw HTTP for tests: one connection per request (no pooling, no retries), exact status, headers
// and body text, so a test sees precisely what a server sent.

import http from 'node:http';

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
