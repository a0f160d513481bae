// One simulated vLLM replica: an engine, its /metrics, its fault state and the listening
// socket. Crash and refuse close the port for real (clients get ECONNREFUSED), so a replica
// can stop and start listening many times; it always comes back on the same port.

import { createServer, type Server } from 'node:http';
import type { Socket } from 'node:net';
import { sharedTokenizer, type Tokenizer } from '../tokenizer/tokenizer.ts';
import { createEngine } from './engine/engine.ts';
import type { GpuProfile } from './engine/profile-types.ts';
import type { Engine, EngineStats } from './engine/types.ts';
import { type FaultSpec, FaultState, type RequestFault } from './faults.ts';
import { ReplicaMetrics } from './metrics.ts';
import { handleRequest, type ReplicaContext } from './server.ts';
import { generatedToken } from './textgen.ts';

/** How often a replica whose fault ended tries its port again while it cannot listen. */
const RELISTEN_MS = 1000;

export interface SimReplicaOptions {
  profile: GpuProfile;
  /** Wall ms per simulated ms (0.1 = ten times faster than the GPU would be). */
  timeScale?: number;
  /** Fleet seed: outputs without a request seed derive from it and the prompt. */
  seed?: number;
  host?: string;
  /** 0 = an ephemeral port, kept for the replica's life. */
  port?: number;
}

export interface ReplicaStats {
  url: string;
  listening: boolean;
  fault: FaultSpec | null;
  openConnections: number;
  engine: EngineStats;
}

export class SimReplica implements ReplicaContext {
  readonly engine: Engine;
  readonly profile: GpuProfile;
  readonly metrics: ReplicaMetrics;
  readonly tokenizer: Tokenizer;
  readonly fleetSeed: number;
  readonly timeScale: number;
  private readonly host: string;
  private port: number;
  private server: Server | null = null;
  private readonly sockets = new Set<Socket>();
  private readonly faults: FaultState;
  private closed = false;

  private constructor(opts: SimReplicaOptions) {
    this.profile = opts.profile;
    this.timeScale = opts.timeScale ?? 1;
    this.fleetSeed = opts.seed ?? 0;
    this.host = opts.host ?? '127.0.0.1';
    this.port = opts.port ?? 0;
    this.tokenizer = sharedTokenizer;
    // Engine times are wall times, so the front-end delay is counted in wall seconds too.
    this.metrics = new ReplicaMetrics({
      model: this.profile.model,
      frontendOverheadS: (this.profile.frontendOverheadMs * this.timeScale) / 1000,
    });
    this.engine = createEngine(this.profile, {
      timeScale: this.timeScale,
      observer: this.metrics,
      tokenId: (seed, index) => generatedToken(seed, index),
    });
    this.faults = new FaultState(() => this.expire());
  }

  /**
   * A fault's time is up: back to normal, listening again. A port taken meanwhile (an ephemeral
   * port, drawn again by an outgoing connection) is tried again each second for as long as no other
   * fault or reset came: one replica that cannot listen is a replica down, never a rejection that
   * ends the whole fleet's process.
   */
  private expire(again = false): void {
    this.applyFault({ mode: 'reset' }).catch((err: unknown) => {
      if (!again) {
        const code = (err as { code?: unknown } | null)?.code ?? String(err);
        process.stderr.write(
          `simulated replica ${this.url}: cannot listen again after its fault (${String(code)}); trying again each second\n`,
        );
      }
      const retry = setTimeout(() => {
        if (!this.closed && this.server === null && this.faults.active === null) this.expire(true);
      }, RELISTEN_MS);
      retry.unref();
    });
  }

  static async start(opts: SimReplicaOptions): Promise<SimReplica> {
    const r = new SimReplica(opts);
    await r.listen();
    return r;
  }

  get url(): string {
    return `http://${this.host}:${this.port}`;
  }

  requestFault(): RequestFault | null {
    return this.faults.requestFault();
  }

  /** Replaces the current fault (the previous one is undone first). */
  async applyFault(spec: FaultSpec): Promise<void> {
    if (this.closed) return;
    this.faults.clear();
    this.engine.setSlowdown(1);
    if (spec.mode === 'reset') {
      await this.listen();
      return;
    }
    this.faults.set(spec);
    switch (spec.mode) {
      case 'crash':
        await this.stopListening();
        for (const s of this.sockets) s.destroy();
        // A crash is a new process: a cold cache, counters from 0, a new _created.
        this.engine.reset({ restart: true });
        this.metrics.restart();
        return;
      case 'refuse':
        await this.stopListening();
        return;
      case 'slow':
        this.engine.setSlowdown(spec.factor ?? 1);
        await this.listen();
        return;
      default:
        await this.listen();
    }
  }

  fault(spec: FaultSpec): Promise<void> {
    return this.applyFault(spec);
  }

  reset(): Promise<void> {
    return this.applyFault({ mode: 'reset' });
  }

  stats(): ReplicaStats {
    return {
      url: this.url,
      listening: this.server !== null,
      fault: this.faults.active,
      openConnections: this.sockets.size,
      engine: this.engine.stats(),
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.faults.clear();
    const stopped = this.stopListening();
    for (const s of this.sockets) s.destroy();
    await stopped;
    this.engine.close();
  }

  private async listen(): Promise<void> {
    if (this.server !== null || this.closed) return;
    // Invariant: a replica that stopped listening (refuse, crash) serves nothing more, not even on
    // a connection it had open: a request that comes on one is dropped with its connection, and a
    // response still under way when the port closed ends its connection when it ends (as a server
    // that drains). Otherwise a client's pooled connections, busy when the fault came, carried new
    // requests and health checks through a refusing replica for as long as they were reused.
    const server = createServer({ keepAliveTimeout: 5000 }, (req, res) => {
      if (this.server !== server) {
        req.socket.destroy();
        return;
      }
      res.once('finish', () => {
        if (this.server !== server) req.socket.end();
      });
      handleRequest(this, req, res);
    });
    server.on('connection', (s: Socket) => {
      this.sockets.add(s);
      s.once('close', () => this.sockets.delete(s));
    });
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, this.host, () => {
        server.off('error', reject);
        resolve();
      });
    }).catch((e: unknown) => {
      this.server = null;
      throw e;
    });
    const addr = server.address();
    if (addr !== null && typeof addr === 'object') this.port = addr.port;
  }

  /** Closes the port at once; open connections are left to the caller (and idle ones closed). */
  private async stopListening(): Promise<void> {
    const server = this.server;
    if (server === null) return;
    this.server = null;
    await new Promise<void>((resolve) => {
      // close() stops accepting immediately but calls back only when every connection ended.
      server.close(() => resolve());
      server.closeIdleConnections();
      setImmediate(resolve);
    });
  }
}
