// A fleet of simulated vLLM replicas in one process, plus a control API for the faults that
// make a replica's own port unreachable (crash, refuse): programmatic (`fleet.replicas[i]`)
// and, optionally, an admin HTTP server.

import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { FaultSpecError, parseFaultJson } from './faults.ts';
import { getProfile } from './profiles.ts';
import { SimReplica } from './replica.ts';

export interface FleetOptions {
  replicas: number;
  /** 0 or absent = ephemeral ports; else replica i listens on port + i. */
  port?: number;
  host?: string;
  profile: string;
  /** Served model name (default: the profile's). */
  model?: string;
  timeScale?: number;
  seed?: number;
  /** Admin server port (0 = ephemeral); absent = no admin server. */
  adminPort?: number;
}

export interface Fleet {
  urls: string[];
  replicas: SimReplica[];
  /** URL of the admin server, when one was asked for. */
  adminUrl: string | undefined;
  close(): Promise<void>;
}

export async function startFleet(opts: FleetOptions): Promise<Fleet> {
  if (!Number.isInteger(opts.replicas) || opts.replicas < 1) throw new RangeError('replicas must be >= 1');
  const base = getProfile(opts.profile);
  const profile = opts.model === undefined ? base : { ...base, model: opts.model };
  const host = opts.host ?? '127.0.0.1';
  const replicas: SimReplica[] = [];
  try {
    for (let i = 0; i < opts.replicas; i++) {
      replicas.push(
        await SimReplica.start({
          profile,
          host,
          port: opts.port ? opts.port + i : 0,
          timeScale: opts.timeScale ?? 1,
          seed: opts.seed ?? 0,
        }),
      );
    }
  } catch (e) {
    await Promise.all(replicas.map((r) => r.close()));
    throw e;
  }
  let admin: Server | undefined;
  let adminUrl: string | undefined;
  if (opts.adminPort !== undefined) {
    admin = createServer((req, res) => adminHandler(replicas, req, res));
    const server = admin;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(opts.adminPort, host, () => resolve());
    }).catch(async (e: unknown) => {
      await Promise.all(replicas.map((r) => r.close()));
      throw e;
    });
    const addr = server.address();
    if (addr !== null && typeof addr === 'object') adminUrl = `http://${host}:${addr.port}`;
  }
  return {
    urls: replicas.map((r) => r.url),
    replicas,
    adminUrl,
    async close() {
      const closing = replicas.map((r) => r.close());
      if (admin !== undefined) {
        const server = admin;
        closing.push(new Promise<void>((resolve) => server.close(() => resolve())));
        server.closeAllConnections();
      }
      await Promise.all(closing);
    },
  };
}

/** `GET /replicas`, `POST /replicas/:i/fault` (JSON FaultSpec), `DELETE /replicas/:i/fault`. */
function adminHandler(replicas: SimReplica[], req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? '/').split('?', 1)[0] as string;
  const reply = (status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
  };
  if (path === '/replicas' && req.method === 'GET') {
    req.resume();
    reply(200, { replicas: replicas.map((r, i) => ({ index: i, ...r.stats() })) });
    return;
  }
  const m = /^\/replicas\/(\d+)\/fault$/.exec(path);
  const replica = m === null ? undefined : replicas[Number(m[1])];
  if (replica === undefined || (req.method !== 'POST' && req.method !== 'DELETE')) {
    req.resume();
    reply(404, { error: { message: 'Not Found', type: 'NotFoundError', param: null, code: 404 } });
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    let spec: ReturnType<typeof parseFaultJson>;
    try {
      spec =
        req.method === 'DELETE'
          ? { mode: 'reset' }
          : parseFaultJson(JSON.parse(Buffer.concat(chunks).toString()));
    } catch (e) {
      const message = e instanceof FaultSpecError || e instanceof SyntaxError ? e.message : String(e);
      reply(400, { error: { message, type: 'BadRequestError', param: null, code: 400 } });
      return;
    }
    replica.fault(spec).then(
      () => reply(200, { fault: replica.stats().fault }),
      (e: unknown) =>
        reply(500, { error: { message: String(e), type: 'InternalServerError', param: null, code: 500 } }),
    );
  });
}
