// Packaging and deployment files: Dockerfile, docker-compose.yml, deploy/k8s, the Grafana
// dashboard. Each check is a function returning the problems it finds, run on the real file
// (no problems expected) and on a broken variant of it (the problem must be found), so that no
// assertion here can pass whatever the file says.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { checkConfigCommand } from '../../src/cli/check-config.ts';
import { BIN } from '../helpers/cli.ts';
import { send } from '../helpers/http.ts';

const root = (p: string) => fileURLToPath(new URL(`../../${p}`, import.meta.url));
const read = (p: string) => readFileSync(root(p), 'utf8');

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const obj = (v: unknown): Obj => (isObj(v) ? v : {});
const arr = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);
/** Deep copy through JSON, for making broken variants. */
const clone = <T>(v: T): T => JSON.parse(JSON.stringify(v)) as T;

const scratch = mkdtempSync(join(tmpdir(), 'slagate-packaging-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

async function checkConfigText(text: string, name: string): Promise<{ code: number; stderr: string }> {
  const file = join(scratch, name);
  writeFileSync(file, text);
  let stderr = '';
  const code = await checkConfigCommand([file], {
    stdout: { write: () => true },
    stderr: { write: (t: string) => (stderr += t) },
  });
  return { code, stderr };
}

// ---------------------------------------------------------------------------------------------
// Dockerfile

interface Instruction {
  op: string;
  args: string;
}

/** Instructions of a Dockerfile, continuation lines joined, comments dropped, split by stage. */
function dockerStages(text: string): Instruction[][] {
  const stages: Instruction[][] = [];
  let current: Instruction[] | undefined;
  let pending = '';
  for (const raw of text.split('\n')) {
    const line = raw.trimEnd();
    if (pending === '' && /^\s*#/.test(line)) continue;
    if (line.trim() === '' && pending === '') continue;
    if (/^\s*#/.test(line)) continue; // a comment inside a continued instruction
    if (line.endsWith('\\')) {
      pending += `${line.slice(0, -1)} `;
      continue;
    }
    const full = (pending + line).trim();
    pending = '';
    const m = /^(\S+)\s*(.*)$/s.exec(full);
    if (m === null) continue;
    const op = (m[1] as string).toUpperCase();
    const ins = { op, args: (m[2] as string).trim() };
    if (op === 'FROM') {
      current = [ins];
      stages.push(current);
    } else if (current === undefined) {
      // ARG before the first FROM: a global, not part of a stage.
      if (op !== 'ARG') {
        current = [ins];
        stages.push(current);
      }
    } else {
      current.push(ins);
    }
  }
  return stages;
}

function execForm(args: string): string[] | null {
  if (!args.startsWith('[')) return null;
  try {
    const v: unknown = JSON.parse(args);
    return Array.isArray(v) && v.every((s) => typeof s === 'string') ? (v as string[]) : null;
  } catch {
    return null;
  }
}

function dockerfileProblems(text: string): string[] {
  const problems: string[] = [];
  const stages = dockerStages(text);
  const final = stages.at(-1);
  if (final === undefined || final[0]?.op !== 'FROM') return ['no FROM'];
  const from = final[0].args;
  // The base: node 20 (slim or alpine), pinned to a 20.x tag, directly or through an ARG default.
  const argDefault = /^\$\{?(\w+)\}?/.exec(from);
  const image = argDefault
    ? (new RegExp(`^ARG\\s+${argDefault[1]}=(\\S+)`, 'm').exec(text)?.[1] ?? '')
    : (from.split(/\s+/)[0] ?? '');
  if (!/^node:20\.\d+(\.\d+)?-([a-z]+-)?(slim|alpine[\d.]*)$/.test(image))
    problems.push(`final stage base is not a pinned node:20.x slim/alpine image (${image || from})`);

  const ops = final.map((i) => i.op);
  const entryAt = ops.lastIndexOf('ENTRYPOINT');
  const cmdAt = ops.lastIndexOf('CMD');
  if (entryAt < 0) problems.push('final stage has no ENTRYPOINT');
  const entry = entryAt < 0 ? null : execForm((final[entryAt] as Instruction).args);
  if (entryAt >= 0 && entry === null) problems.push('ENTRYPOINT is not in exec (JSON array) form');
  if (entry !== null && !/(^|\/)node$/.test(entry[0] ?? ''))
    problems.push(`ENTRYPOINT runs ${entry[0]}, not node`);
  if (cmdAt >= 0 && execForm((final[cmdAt] as Instruction).args) === null)
    problems.push('CMD is not in exec (JSON array) form');

  const userAt = ops.lastIndexOf('USER');
  if (userAt < 0) problems.push('final stage sets no USER');
  else {
    const user = (final[userAt] as Instruction).args.split(':')[0]?.trim();
    if (user === 'root' || user === '0') problems.push('final USER is root');
    if (entryAt >= 0 && userAt > entryAt) problems.push('USER comes after ENTRYPOINT');
  }
  if (!final.some((i) => i.op === 'EXPOSE' && i.args.split(/\s+/).includes('8080')))
    problems.push('does not EXPOSE 8080');

  for (const stage of stages)
    for (const i of stage) {
      const words = execForm(i.args)?.join(' ') ?? i.args;
      if (/\bnpm\s+(run\s+)?start\b/.test(words)) problems.push(`${i.op} uses npm start`);
      if (i.op === 'RUN' && /\bnpm\s+(ci|install)\b/.test(i.args) && !/--omit=dev/.test(i.args))
        problems.push('npm install without --omit=dev');
    }
  return problems;
}

function copySources(text: string): string[] {
  const out: string[] = [];
  for (const stage of dockerStages(text))
    for (const i of stage) {
      if (i.op !== 'COPY' || /--from=/.test(i.args)) continue;
      const words = i.args.split(/\s+/).filter((w) => !w.startsWith('--'));
      out.push(...words.slice(0, -1));
    }
  return out;
}

describe('Dockerfile', () => {
  const text = read('Dockerfile');

  it('runs node as PID 1 in exec form, as a non-root user, on a pinned node 20 base', () => {
    expect(dockerfileProblems(text)).toEqual([]);
    const final = dockerStages(text).at(-1) ?? [];
    const entry = final.find((i) => i.op === 'ENTRYPOINT');
    expect(execForm(entry?.args ?? '')).toEqual(['node', 'bin/slagate.js']);
    const cmd = execForm(final.find((i) => i.op === 'CMD')?.args ?? '') ?? [];
    expect(cmd[0]).toBe('serve');
    expect(cmd).toContain('0.0.0.0');
  });

  it('the checks catch a shell-form entrypoint, npm start, a root or late USER and a dev install', () => {
    const swap = (from: RegExp, to: string) => {
      const broken = text.replace(from, to);
      expect(broken).not.toBe(text);
      return dockerfileProblems(broken);
    };
    expect(swap(/^ENTRYPOINT .*$/m, 'ENTRYPOINT node bin/slagate.js')).toContain(
      'ENTRYPOINT is not in exec (JSON array) form',
    );
    expect(swap(/^ENTRYPOINT .*$/m, 'ENTRYPOINT ["npm", "start"]').join('\n')).toMatch(
      /not node[\s\S]*npm start/,
    );
    expect(swap(/^CMD .*$/m, 'CMD serve --host 0.0.0.0')).toContain('CMD is not in exec (JSON array) form');
    expect(swap(/^USER .*$/m, 'USER root')).toContain('final USER is root');
    expect(swap(/^USER .*$/m, '')).toContain('final stage sets no USER');
    expect(dockerfileProblems(`${text.replace(/^USER .*$/m, '')}\nUSER node\n`)).toContain(
      'USER comes after ENTRYPOINT',
    );
    expect(swap(/--omit=dev/, '')).toContain('npm install without --omit=dev');
    expect(swap(/^ARG NODE_IMAGE=.*$/m, 'ARG NODE_IMAGE=node:latest').join()).toMatch(/pinned node:20/);
    expect(swap(/^EXPOSE .*$/m, 'EXPOSE 9000')).toContain('does not EXPOSE 8080');
  });

  it('copies only what runs, every source exists and none is excluded by .dockerignore', () => {
    const sources = copySources(text);
    expect(new Set(sources)).toEqual(
      new Set([
        'package.json',
        'package-lock.json',
        'tsconfig.json',
        'bin',
        'src',
        'config',
        'config/gateway.yaml',
      ]),
    );
    for (const s of sources) expect(existsSync(root(s)), s).toBe(true);
    const ignored = read('.dockerignore')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l !== '' && !l.startsWith('#'));
    for (const s of sources) expect(ignored, `${s} is in .dockerignore`).not.toContain(s);
    for (const must of ['node_modules', '.git', 'test', 'docs', 'results', 'tmp'])
      expect(ignored).toContain(must);
  });

  it('the runtime dependencies include what the entry loads TypeScript with', () => {
    const pkg = JSON.parse(read('package.json')) as { dependencies?: Obj };
    // bin/ts-loader.js imports esbuild; an image built with --omit=dev must still have it.
    expect(read('bin/ts-loader.js')).toMatch(/from 'esbuild'/);
    expect(Object.keys(pkg.dependencies ?? {})).toContain('esbuild');
    expect(read('bin/slagate.js')).toMatch(/import '\.\/register\.js'/);
  });
});

// ---------------------------------------------------------------------------------------------
// docker-compose.yml

const GATEWAYS = ['gateway-1', 'gateway-2'] as const;

/** `${VAR:-default}` as Compose resolves it: the value in `env`, else the default. */
const interpolate = (s: string, env: Record<string, string> = {}) =>
  s.replace(/\$\{(\w+):-([^}]*)\}/g, (_, name: string, fallback: string) => env[name] ?? fallback);

function flag(command: unknown, name: string, env: Record<string, string> = {}): string | undefined {
  const c = arr(command).map((w) => interpolate(String(w), env));
  const i = c.indexOf(name);
  return i < 0 ? undefined : c[i + 1];
}

/** The repository path of the file a gateway service reads as --config, through its volumes. */
function mountedConfig(service: Obj, env: Record<string, string> = {}): string | undefined {
  const target = flag(service.command, '--config', env);
  if (target === undefined) return undefined;
  for (const v of arr(service.volumes).map(String)) {
    const [src, dst] = interpolate(v, env).split(':');
    if (src === undefined || dst === undefined) continue;
    const local = src.replace(/^\.\//, '');
    if (dst === target) return local;
    if (target.startsWith(`${dst}/`)) return `${local}/${target.slice(dst.length + 1)}`;
  }
  return undefined;
}

function composeProblems(compose: Obj, readFile: (p: string) => string): string[] {
  const problems: string[] = [];
  const services = obj(compose.services);
  for (const name of ['redis', 'sim', ...GATEWAYS, 'lb'])
    if (!isObj(services[name])) problems.push(`service ${name} missing`);
  for (const [name, s] of Object.entries(services)) {
    const profiles = arr(obj(s).profiles);
    if (['redis', 'sim', ...GATEWAYS, 'lb'].includes(name) && profiles.length > 0)
      problems.push(`${name} is not in the default profile`);
  }

  // The gpu profile: vLLM services with an NVIDIA GPU each, pinned image.
  const gpu = Object.entries(services).filter(([, s]) => arr(obj(s).profiles).includes('gpu'));
  if (gpu.length < 2) problems.push('profile gpu has fewer than two services');
  for (const [name, s] of gpu) {
    const image = String(obj(s).image ?? '');
    if (!/^vllm\/vllm-openai:v?\d/.test(image))
      problems.push(`${name}: image not a pinned vllm/vllm-openai (${image})`);
    const devices = arr(obj(obj(obj(obj(s).deploy).resources).reservations).devices).map(obj);
    if (!devices.some((d) => d.driver === 'nvidia' && arr(d.capabilities).includes('gpu')))
      problems.push(`${name}: no nvidia GPU reservation`);
    if (!arr(obj(s).command).includes('meta-llama/Llama-3.1-8B-Instruct'))
      problems.push(`${name}: model not served`);
  }

  // The sim: replicas from port 8000, listening on every interface so the gateways reach them.
  const sim = obj(services.sim);
  const simCmd = arr(sim.command).map(String);
  if (simCmd[0] !== 'sim') problems.push('sim does not run `slagate sim`');
  if (flag(sim.command, '--host') !== '0.0.0.0') problems.push('sim does not listen on 0.0.0.0');
  const simPort = Number(flag(sim.command, '--port') ?? 8000);
  const simPorts = new Set(
    Array.from({ length: Number(flag(sim.command, '--replicas') ?? 2) }, (_, i) => simPort + i),
  );

  // Both gateways: the same image as sim, one shared config file, Redis state at the redis service.
  const configs = GATEWAYS.map((g) => mountedConfig(obj(services[g])));
  if (configs[0] === undefined || configs[0] !== configs[1])
    problems.push(`gateways do not mount one shared config (${configs.join(', ')})`);
  for (const g of GATEWAYS) {
    const s = obj(services[g]);
    if (s.image !== sim.image) problems.push(`${g} does not use the slagate image`);
    if (arr(s.command)[0] !== 'serve') problems.push(`${g} does not run serve`);
    const file = mountedConfig(s);
    if (file === undefined) continue;
    let cfg: Obj;
    try {
      cfg = obj(parse(readFile(file)));
    } catch (err) {
      problems.push(`${g}: cannot read ${file}: ${(err as Error).message}`);
      continue;
    }
    const state = obj(cfg.state);
    if (state.store !== 'redis' || state.redis_url !== 'redis://redis:6379')
      problems.push(`${g}: state is not redis://redis:6379 (${String(state.redis_url)})`);
    for (const b of arr(cfg.backends).map(obj)) {
      const url = new URL(String(b.url));
      if (url.hostname !== 'sim') problems.push(`${g}: backend ${url} is not the sim service`);
      if (!simPorts.has(Number(url.port))) problems.push(`${g}: backend port ${url.port} is not a sim port`);
    }
  }

  // Only the load balancer publishes ports: exactly one to every address, any other on the
  // host's loopback only.
  for (const [name, s] of Object.entries(services)) {
    const ports = arr(obj(s).ports).map(String);
    const open = ports.filter((p) => !p.startsWith('127.0.0.1:'));
    if (name === 'lb' && open.length !== 1)
      problems.push(`lb publishes ${open.length} ports beyond the loopback`);
    if (name !== 'lb' && ports.length > 0) problems.push(`${name} publishes ports`);
  }
  // The gateways' shutdown grace (30 s) fits in the stop timeout.
  for (const g of GATEWAYS) {
    const grace = /^(\d+)s$/.exec(String(obj(services[g]).stop_grace_period ?? '10s'));
    if (grace === null || Number(grace[1]) <= 30) problems.push(`${g}: stop_grace_period not above 30s`);
  }
  return problems;
}

describe('docker-compose.yml', () => {
  const compose = obj(parse(read('docker-compose.yml'), { merge: true }));

  it('has redis, sim, two gateways sharing Redis, one public load balancer port (the operational one on the loopback) and a gpu profile', () => {
    expect(composeProblems(compose, read)).toEqual([]);
    const services = obj(compose.services);
    expect(Object.keys(services)).toEqual(
      expect.arrayContaining(['redis', 'sim', 'gateway-1', 'gateway-2', 'lb', 'vllm-0', 'vllm-1']),
    );
    expect(arr(obj(services.sim).command)).toEqual(
      expect.arrayContaining(['sim', '--replicas', '4', '--port', '8000', '--profile', 'llama3-8b-h100']),
    );
  });

  it('the checks catch a missing service or profile, split configs, a second port and a non-redis store', () => {
    const broken = (edit: (services: Obj) => void, readFile: (p: string) => string = read) => {
      const c = clone(compose);
      edit(obj(c.services));
      return composeProblems(c, readFile).join('\n');
    };
    expect(broken((s) => delete s.redis)).toMatch(/service redis missing/);
    expect(
      broken((s) => {
        for (const v of Object.values(s)) delete obj(v).profiles;
      }),
    ).toMatch(/fewer than two/);
    expect(
      broken((s) => {
        obj(s['gateway-2']).volumes = ['./deploy/other:/etc/slagate:ro'];
      }),
    ).toMatch(/one shared config/);
    expect(
      broken((s) => {
        obj(s.lb).ports = ['8080:8080', '8443:8443'];
      }),
    ).toMatch(/lb publishes 2 ports beyond the loopback/);
    expect(
      broken((s) => {
        obj(s['gateway-1']).ports = ['8081:8081'];
      }),
    ).toMatch(/gateway-1 publishes ports/);
    expect(
      broken((s) => {
        delete obj(obj(obj(obj(s['vllm-0']).deploy).resources).reservations).devices;
      }),
    ).toMatch(/vllm-0: no nvidia GPU/);
    expect(
      broken((s) => {
        obj(s.sim).command = arr(obj(s.sim).command).filter((w) => w !== '--host' && w !== '0.0.0.0');
      }),
    ).toMatch(/sim does not listen on 0.0.0.0/);
    expect(
      broken(
        () => {},
        (p) => read(p).replace('http://sim:8000', 'http://127.0.0.1:8000'),
      ),
    ).toMatch(/backend http:\/\/127.0.0.1:8000\/ is not the sim service/);
    const memoryStore = (p: string) => read(p).replace(/store: redis/, 'store: memory');
    expect(broken(() => {}, memoryStore)).toMatch(/gateway-1: state is not redis/);
    expect(
      broken(
        () => {},
        (p) => read(p).replace('sim:8003', 'sim:8004'),
      ),
    ).toMatch(/port 8004 is not a sim port/);
  });

  it('the load balancer reaches both gateways and does not buffer streams', () => {
    const nginx = read('deploy/compose/nginx.conf').replace(/#.*$/gm, '');
    const servers = [...nginx.matchAll(/^\s*server\s+([\w.-]+:\d+)/gm)].map((m) => m[1]);
    const services = obj(compose.services);
    expect(servers.sort()).toEqual(
      GATEWAYS.map((g) => `${g}:${flag(obj(services[g]).command, '--port')}`).sort(),
    );
    for (const directive of [
      /proxy_buffering\s+off;/,
      // A 503 is retried on the other gateway only for a body nginx holds whole.
      /proxy_request_buffering\s+on;/,
      /proxy_http_version\s+1\.1;/,
      /proxy_read_timeout\s+\d{3,}s;/,
    ])
      expect(nginx).toMatch(directive);
    // No gateway is taken out for its own 503s (backends down): no passive failure accounting.
    expect([...nginx.matchAll(/^\s*server\s+[\w.-]+:\d+([^;]*);/gm)].map((m) => m[1]!.trim())).toEqual([
      'max_fails=0',
      'max_fails=0',
    ]);
    // Inference on the first listener, published; the operational routes (unauthenticated in the
    // gateway) refused there and served on one listener per gateway, each passing to that gateway
    // alone (an instance's dashboard and metrics are its own), published on the host's loopback
    // only.
    const [inference, ...opsPorts] = [...nginx.matchAll(/listen\s+(\d+);/g)].map((m) => m[1]);
    expect(arr(obj(services.lb).ports).map(String).sort()).toEqual(
      [`${inference}:${inference}`, ...opsPorts.map((p) => `127.0.0.1:${p}:${p}`)].sort(),
    );
    const opsTargets = [
      ...nginx.matchAll(/listen\s+(\d+);\s*location\s+\/\s*\{\s*proxy_pass\s+http:\/\/([\w.-]+:\d+);/g),
    ].map((m) => m[2]);
    expect(opsTargets).toHaveLength(opsPorts.length);
    expect(opsTargets.sort()).toEqual(servers.sort());
    const ops = /location\s+~\s+\^\/\(metrics\|admin\/\|dashboard\)\s*\{([^}]*)\}/.exec(nginx)?.[1];
    expect(ops).toBeDefined();
    expect(ops).toMatch(/return\s+403;/);
  });

  it('`slagate sim` runs with the flags the sim service passes, --host included, and serves on that host', async () => {
    // The service's own command, on a loopback address and ephemeral ports instead of 0.0.0.0:8000.
    const args = arr(obj(obj(compose.services).sim).command).map(String);
    expect(args[0]).toBe('sim');
    const at = (name: string) => {
      const i = args.indexOf(name);
      expect(i, `${name} in the sim command`).toBeGreaterThan(0);
      return i + 1;
    };
    args[at('--host')] = '127.0.0.1';
    args[at('--port')] = '0';
    args.push('--time-scale', '0.05');
    const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    child.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    try {
      const replicas = Number(args[at('--replicas')]);
      const urls = () => [...out.matchAll(/^ {2}(http:\/\/\S+)$/gm)].map((m) => m[1] as string);
      // Serving (its URLs printed), or exited (a flag refused: exit code 2 and the usage).
      await Promise.race([
        exited,
        new Promise<void>((resolve) => {
          const check = () => {
            if (urls().length === replicas) resolve();
          };
          child.stdout.on('data', check);
        }),
      ]);
      expect(child.exitCode, err).toBeNull();
      expect(urls()).toHaveLength(replicas);
      for (const url of urls()) {
        expect(new URL(url).hostname).toBe('127.0.0.1');
        const res = await send(url, 'GET', '/health');
        expect(res.status).toBe(200);
      }
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    }
  });

  it('the mounted gateway configurations pass check-config', async () => {
    for (const file of ['deploy/compose/gateway.yaml', 'deploy/compose/gateway-gpu.yaml']) {
      const { code, stderr } = await checkConfigText(read(file), file.replaceAll('/', '_'));
      expect(code, stderr).toBe(0);
    }
    // With SLAGATE_CONFIG=gateway-gpu.yaml both gateways read the gpu file.
    const env = { SLAGATE_CONFIG: 'gateway-gpu.yaml' };
    for (const g of GATEWAYS)
      expect(mountedConfig(obj(obj(compose.services)[g]), env)).toBe('deploy/compose/gateway-gpu.yaml');
    const gpu = obj(parse(read('deploy/compose/gateway-gpu.yaml')));
    const hosts = arr(gpu.backends).map((b) => new URL(String(obj(b).url)).hostname);
    const gpuServices = Object.entries(obj(compose.services))
      .filter(([, s]) => arr(obj(s).profiles).includes('gpu'))
      .map(([n]) => n);
    expect(hosts.sort()).toEqual(gpuServices.sort());
    expect(obj(gpu.state).redis_url).toBe('redis://redis:6379');
  });
});

// ---------------------------------------------------------------------------------------------
// Kubernetes

function k8sDocs(dir: string): Obj[] {
  const out: Obj[] = [];
  for (const f of readdirSync(root(dir)).sort()) {
    if (!/\.ya?ml$/.test(f) || f === 'kustomization.yaml') continue;
    for (const doc of parseAllDocuments(read(`${dir}/${f}`))) {
      if (doc.errors.length > 0) throw new Error(`${f}: ${doc.errors[0]?.message}`);
      const v: unknown = doc.toJS();
      if (isObj(v)) out.push(v);
    }
  }
  return out;
}

const find = (docs: Obj[], kind: string, name: string) =>
  docs.find((d) => d.kind === kind && obj(d.metadata).name === name);

function gatewayConfigOf(docs: Obj[]): Obj {
  return obj(parse(String(obj(obj(find(docs, 'ConfigMap', 'slagate-gateway')).data)['gateway.yaml'] ?? '')));
}

function k8sProblems(docs: Obj[]): string[] {
  const problems: string[] = [];
  const dep = find(docs, 'Deployment', 'slagate-gateway');
  if (dep === undefined) return ['no gateway Deployment'];
  const spec = obj(dep.spec);
  if (spec.replicas !== 3) problems.push(`replicas ${String(spec.replicas)}`);
  const pod = obj(obj(spec.template).spec);
  const [c] = arr(pod.containers).map(obj);
  if (c === undefined) return [...problems, 'no container'];
  if (obj(obj(c.readinessProbe).httpGet).path !== '/readyz')
    problems.push('readinessProbe is not on /readyz');
  if (obj(obj(c.livenessProbe).httpGet).path !== '/healthz')
    problems.push('livenessProbe is not on /healthz');

  const preStop = obj(obj(c.lifecycle).preStop);
  const sleepCmd = arr(obj(preStop.exec).command).map(String);
  const preStopS =
    sleepCmd[0] === 'sleep' ? Number(sleepCmd[1]) : Number(obj(preStop.sleep).seconds ?? Number.NaN);
  if (!(preStopS > 0)) problems.push('no preStop sleep');
  const graceMs = Number(obj(gatewayConfigOf(docs).server).shutdown_grace_ms ?? 30000);
  const termS = Number(pod.terminationGracePeriodSeconds ?? 30);
  if (!(termS > graceMs / 1000 + (Number.isFinite(preStopS) ? Math.max(preStopS, 0) : 0)))
    problems.push(`terminationGracePeriodSeconds ${termS} not above preStop + shutdown_grace_ms ${graceMs}`);

  const podSec = obj(pod.securityContext);
  const sec = obj(c.securityContext);
  if (podSec.runAsNonRoot !== true && sec.runAsNonRoot !== true) problems.push('runAsNonRoot not set');
  if (sec.readOnlyRootFilesystem === true) {
    // Node and the libraries may write temporary files: /tmp stays writable.
    const mounts = arr(c.volumeMounts).map(obj);
    if (!mounts.some((m) => m.mountPath === '/tmp'))
      problems.push('read-only root filesystem without a /tmp volume');
  }
  const res = obj(c.resources);
  if (obj(res.requests).memory === undefined) problems.push('no memory request');
  if (obj(res.limits).memory === undefined) problems.push('no memory limit');

  // The config is the ConfigMap, mounted as a directory (no subPath, so edits reach the pod).
  const args = arr(c.args).map(String);
  const configPath = args[args.indexOf('--config') + 1] ?? '';
  const mount = arr(c.volumeMounts)
    .map(obj)
    .find((m) => configPath.startsWith(`${String(m.mountPath)}/`));
  if (mount === undefined) problems.push(`--config ${configPath} is not on a mounted volume`);
  else {
    if (mount.subPath !== undefined) problems.push('config mounted with subPath (no live reload)');
    const vol = arr(pod.volumes)
      .map(obj)
      .find((v) => v.name === mount.name);
    if (obj(vol?.configMap).name !== 'slagate-gateway') problems.push('config volume is not the ConfigMap');
  }
  if (find(docs, 'Service', 'slagate-gateway') === undefined) problems.push('no gateway Service');
  if (
    find(docs, 'Deployment', 'slagate-redis') === undefined &&
    find(docs, 'StatefulSet', 'slagate-redis') === undefined
  )
    problems.push('no Redis workload');
  const redisSvc = find(docs, 'Service', 'slagate-redis');
  const state = obj(gatewayConfigOf(docs).state);
  if (redisSvc === undefined || state.redis_url !== 'redis://slagate-redis:6379')
    problems.push(`gateway state does not point at the Redis Service (${String(state.redis_url)})`);
  return problems;
}

describe('deploy/k8s', () => {
  const docs = k8sDocs('deploy/k8s');

  it('gateway Deployment: 3 replicas, /readyz and /healthz probes, preStop, drain fits the grace period', () => {
    expect(k8sProblems(docs)).toEqual([]);
    const kinds = docs.map((d) => d.kind);
    expect(kinds).toEqual(
      expect.arrayContaining(['ConfigMap', 'Deployment', 'Service', 'PodDisruptionBudget']),
    );
  });

  it('the checks catch a wrong readiness path, no preStop, a short grace period and a root pod', () => {
    const broken = (edit: (pod: Obj, container: Obj) => void) => {
      const d = clone(docs);
      const pod = obj(obj(obj(find(d, 'Deployment', 'slagate-gateway')?.spec).template).spec);
      edit(pod, obj(arr(pod.containers)[0]));
      return k8sProblems(d).join('\n');
    };
    expect(broken((_, c) => (obj(obj(c.readinessProbe).httpGet).path = '/healthz'))).toMatch(
      /not on \/readyz/,
    );
    expect(broken((_, c) => delete c.lifecycle)).toMatch(/no preStop sleep/);
    expect(broken((pod) => (pod.terminationGracePeriodSeconds = 30))).toMatch(
      /terminationGracePeriodSeconds 30/,
    );
    expect(broken((pod) => delete pod.terminationGracePeriodSeconds)).toMatch(
      /terminationGracePeriodSeconds 30/,
    );
    expect(
      broken((pod, c) => {
        delete obj(pod.securityContext).runAsNonRoot;
        delete obj(c.securityContext).runAsNonRoot;
      }),
    ).toMatch(/runAsNonRoot/);
    expect(
      broken((_, c) => (c.volumeMounts = arr(c.volumeMounts).filter((m) => obj(m).mountPath !== '/tmp'))),
    ).toMatch(/without a \/tmp volume/);
    expect(broken((_, c) => (obj(arr(c.volumeMounts)[0]).subPath = 'gateway.yaml'))).toMatch(/subPath/);
    // A longer shutdown grace in the ConfigMap needs a longer termination grace period.
    const d = clone(docs);
    const cm = obj(find(d, 'ConfigMap', 'slagate-gateway')?.data);
    cm['gateway.yaml'] = String(cm['gateway.yaml']).replace(
      'shutdown_grace_ms: 30000',
      'shutdown_grace_ms: 60000',
    );
    expect(k8sProblems(d).join('\n')).toMatch(/shutdown_grace_ms 60000/);
  });

  it("the ConfigMap's gateway YAML passes check-config", async () => {
    const text = String(obj(obj(find(docs, 'ConfigMap', 'slagate-gateway')).data)['gateway.yaml']);
    const ok = await checkConfigText(text, 'k8s-gateway.yaml');
    expect(ok.code, ok.stderr).toBe(0);
    // The same check refuses a key that does not exist.
    const bad = await checkConfigText(
      text.replace('shutdown_grace_ms:', 'shutdown_grace_s:'),
      'k8s-bad.yaml',
    );
    expect(bad.code).toBe(1);
  });

  it('kustomization lists every manifest', () => {
    const k = obj(parse(read('deploy/k8s/kustomization.yaml')));
    const files = readdirSync(root('deploy/k8s')).filter(
      (f) => /\.ya?ml$/.test(f) && f !== 'kustomization.yaml',
    );
    expect(arr(k.resources).map(String).sort()).toEqual(files.sort());
  });
});

// ---------------------------------------------------------------------------------------------
// Grafana

// DESIGN section 6 (and docs/observability.md): every slagate_ series the gateway exports.
const METRICS = new Set([
  ...['ttft', 'tpot', 'itl', 'e2e', 'queue_wait', 'overhead'].flatMap((h) =>
    ['bucket', 'sum', 'count'].map((s) => `slagate_${h}_seconds_${s}`),
  ),
  'slagate_requests_total',
  'slagate_admission_total',
  'slagate_sla_met_total',
  'slagate_sla_judged_total',
  'slagate_backend_inflight',
  'slagate_backend_concurrency_limit',
  'slagate_backend_healthy',
  'slagate_backend_kv_cache_usage',
  'slagate_backend_waiting',
  'slagate_backend_prefill_tokens_per_second',
  'slagate_queue_depth',
  'slagate_prefix_hit_ratio',
  'slagate_state_store_degraded',
  'slagate_log_lines_dropped_total',
]);

const REQUIRED = [
  'slagate_ttft_seconds_bucket',
  'slagate_tpot_seconds_bucket',
  'slagate_backend_inflight',
  'slagate_backend_concurrency_limit',
  'slagate_queue_depth',
  'slagate_admission_total',
  'slagate_sla_met_total',
  'slagate_sla_judged_total',
  'slagate_requests_total',
  'slagate_backend_kv_cache_usage',
  'slagate_prefix_hit_ratio',
  'slagate_backend_healthy',
  'slagate_state_store_degraded',
];

// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's datasource input placeholder, verbatim.
const DS_UID = '${DS_PROMETHEUS}';

function dashboardProblems(d: Obj): string[] {
  const problems: string[] = [];
  const inputs = arr(d.__inputs).map(obj);
  if (!inputs.some((i) => i.name === 'DS_PROMETHEUS' && i.pluginId === 'prometheus'))
    problems.push('no DS_PROMETHEUS datasource input');
  const panels = arr(d.panels).map(obj);
  const ids = panels.map((p) => p.id);
  if (new Set(ids).size !== ids.length) problems.push('panel ids are not unique');
  const used = new Set<string>();
  for (const p of panels) {
    if (p.type === 'row') continue;
    if (obj(p.datasource).uid !== DS_UID) problems.push(`${String(p.title)}: datasource not the input`);
    const targets = arr(p.targets).map(obj);
    if (targets.length === 0) problems.push(`${String(p.title)}: no query`);
    for (const t of targets) {
      const expr = String(t.expr ?? '');
      let depth = 0;
      for (const ch of expr) {
        depth += ch === '(' ? 1 : ch === ')' ? -1 : 0;
        if (depth < 0) break;
      }
      if (depth !== 0) problems.push(`${String(p.title)}: unbalanced parentheses`);
      for (const m of expr.matchAll(/\bslagate_[a-z_]+/g)) {
        used.add(m[0]);
        if (!METRICS.has(m[0])) problems.push(`${String(p.title)}: unknown metric ${m[0]}`);
      }
    }
  }
  for (const m of REQUIRED) if (!used.has(m)) problems.push(`no panel uses ${m}`);
  return problems;
}

describe('deploy/grafana/slagate-dashboard.json', () => {
  const text = read('deploy/grafana/slagate-dashboard.json');

  it('is valid JSON over the contract metrics, with a Prometheus datasource input', () => {
    const d = obj(JSON.parse(text));
    expect(dashboardProblems(d)).toEqual([]);
    expect(d.title).toBe('slagate');
    const vars = arr(obj(d.templating).list).map((v) => obj(v).name);
    expect(vars).toEqual(expect.arrayContaining(['class', 'backend']));
  });

  it('the checks catch an unknown metric, a missing input, a missing panel and broken PromQL', () => {
    const d = obj(JSON.parse(text));
    expect(() => JSON.parse(text.replace(/}\s*$/, ''))).toThrow();
    const variant = (edit: (c: Obj) => void) => {
      const c = clone(d);
      edit(c);
      return dashboardProblems(c).join('\n');
    };
    expect(variant((c) => (c.__inputs = []))).toMatch(/DS_PROMETHEUS/);
    const firstTarget = (c: Obj) =>
      obj(arr(obj(arr(c.panels).find((p) => arr(obj(p).targets).length > 0)).targets)[0]);
    expect(variant((c) => (firstTarget(c).expr = 'sum(rate(slagate_ttft_ms_bucket[5m]))'))).toMatch(
      /unknown metric slagate_ttft_ms_bucket/,
    );
    expect(variant((c) => (firstTarget(c).expr = `${String(firstTarget(c).expr)})`))).toMatch(/unbalanced/);
    expect(
      variant((c) => {
        c.panels = arr(c.panels).filter((p) => !JSON.stringify(p).includes('slagate_state_store_degraded'));
      }),
    ).toMatch(/no panel uses slagate_state_store_degraded/);
  });
});
