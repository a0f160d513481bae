// A real redis-server for tests: on a free port of 127.0.0.1 (never 6379), no persistence, its own
// temporary directory. It can be killed with SIGKILL, frozen with SIGSTOP and brought back on the
// same port, so tests can cut Redis the way production loses it.

import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface RedisServerOptions {
  /** Start in cluster mode and give this single node every slot. */
  cluster?: boolean;
}

export interface RedisServer {
  readonly port: number;
  readonly url: string;
  /** SIGKILL, as a crash: no shutdown, no goodbye to clients. */
  kill9(): Promise<void>;
  /** Starts it again on the same port (after kill9 or stop). */
  restart(): Promise<void>;
  /** SIGSTOP: the port stays open but nothing answers. */
  pause(): void;
  /** SIGCONT after pause(). */
  resume(): void;
  /** Sends one command through redis-cli and returns its raw output. */
  cli(...args: string[]): Promise<string>;
  stop(): Promise<void>;
}

export async function freePort(): Promise<number> {
  for (;;) {
    const port = await new Promise<number>((resolve, reject) => {
      const srv = createServer();
      srv.once('error', reject);
      srv.listen(0, '127.0.0.1', () => {
        const addr = srv.address();
        const p = typeof addr === 'object' && addr !== null ? addr.port : 0;
        srv.close(() => resolve(p));
      });
    });
    // Cluster mode also binds port + 10000 for its bus.
    if (port !== 6379 && port + 10000 <= 65535) return port;
  }
}

export async function startRedisServer(opts: RedisServerOptions = {}): Promise<RedisServer> {
  let port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'slagate-redis-'));
  let child: ChildProcess | null = null;

  const launch = async () => {
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'];
    args.push('--dir', dir, '--logfile', '');
    if (opts.cluster) {
      // A lone node does not know its own address until it meets another: announce it.
      args.push('--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf');
      args.push('--cluster-announce-ip', '127.0.0.1');
    }
    child = await spawnListening(args, port, 'redis-server');
  };

  const exit = async (signal: NodeJS.Signals) => {
    const proc = child;
    child = null;
    if (proc === null || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGCONT');
    proc.kill(signal);
    await exited;
  };

  const cli = (...args: string[]) =>
    new Promise<string>((resolve, reject) => {
      const proc = spawn('redis-cli', ['-p', String(port), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      proc.stdout.on('data', (b: Buffer) => {
        out += b.toString();
      });
      proc.once('error', reject);
      proc.once('exit', () => resolve(out));
    });

  // A free port is free only when it was asked: another test file's server (the suite runs files in
  // parallel) may take it first. Then ours exits and theirs answers, until its file ends. Each try
  // checks the server that answers is ours, and the first launch moves to another port if not.
  for (let attempt = 1; ; attempt++) {
    try {
      await launch();
      break;
    } catch (err) {
      if (!(err instanceof PortTakenError) || attempt >= 5) throw err;
      port = await freePort();
    }
  }
  if (opts.cluster) {
    await cli('cluster', 'addslotsrange', '0', '16383');
    const deadline = Date.now() + 10_000;
    while (!(await cli('cluster', 'info')).includes('cluster_state:ok')) {
      if (Date.now() > deadline) throw new Error('single-node cluster did not become ok');
      await sleep(50);
    }
  }

  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    kill9: () => exit('SIGKILL'),
    restart: async () => {
      await exit('SIGKILL');
      await launch();
    },
    pause: () => {
      child?.kill('SIGSTOP');
    },
    resume: () => {
      child?.kill('SIGCONT');
    },
    cli,
    stop: async () => {
      await exit('SIGKILL');
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** `redis-server ARGS`, once it accepts connections on `port` (it is killed if it never does). */
async function spawnListening(args: string[], port: number, what: string): Promise<ChildProcess> {
  const proc = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  proc.stdout?.on('data', (b: Buffer) => {
    output += b.toString();
  });
  proc.stderr?.on('data', (b: Buffer) => {
    output += b.toString();
  });
  const deadline = Date.now() + 10_000;
  while (!(await accepts(port))) {
    if (proc.exitCode !== null || Date.now() > deadline) {
      proc.kill('SIGKILL');
      throw new Error(`${what} did not start on ${port}: ${output}`);
    }
    await sleep(20);
  }
  const pid = await processIdOn(port);
  if (pid !== proc.pid) {
    proc.kill('SIGKILL');
    throw new PortTakenError(`${what}: port ${port} is answered by process ${pid}, not ours (${proc.pid})`);
  }
  return proc;
}

class PortTakenError extends Error {}

/** The process_id the Redis server (or sentinel) on `port` reports in INFO server; null if none. */
function processIdOn(port: number): Promise<number | null> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    let text = '';
    const done = (v: number | null) => {
      s.destroy();
      resolve(v);
    };
    s.setTimeout(2_000, () => done(null));
    s.once('error', () => done(null));
    s.once('connect', () => s.write('*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n'));
    s.on('data', (b: Buffer) => {
      text += b.toString();
      const m = /process_id:(\d+)/.exec(text);
      if (m) done(Number(m[1]));
    });
  });
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export interface RedisSentinel {
  readonly port: number;
  stop(): Promise<void>;
}

/** A real redis sentinel on a free port of 127.0.0.1, monitoring the master on `masterPort` as `name`. */
export async function startRedisSentinel(masterPort: number, name: string): Promise<RedisSentinel> {
  const port = await freePort();
  const dir = await mkdtemp(join(tmpdir(), 'slagate-sentinel-'));
  // Sentinel rewrites its config file: it lives in the sentinel's own directory.
  const conf = join(dir, 'sentinel.conf');
  await writeFile(
    conf,
    [
      `port ${port}`,
      'bind 127.0.0.1',
      `dir ${dir}`,
      'logfile ""',
      `sentinel monitor ${name} 127.0.0.1 ${masterPort} 1`,
    ].join('\n'),
  );
  const proc = await spawnListening([conf, '--sentinel'], port, 'redis sentinel');
  return {
    port,
    stop: async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
        proc.kill('SIGKILL');
        await exited;
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
}
