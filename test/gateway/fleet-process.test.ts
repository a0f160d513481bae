// `simulate:` runs the simulated fleet in a child process, off the gateway's event loop: the
// gateway serves through it, and it never outlives the gateway (closed, or killed).
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { startGateway } from '../../src/gateway.ts';
import { startFleetProcess } from '../../src/sim/fleet-process.ts';
import { alive, childPids } from '../helpers/processes.ts';
import { chat, MODEL, post, type ServedGateway, serveChild, toConfig, waitFor } from './harness.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('the simulated fleet of simulate:', () => {
  it('is a child process; the gateway serves through it and stops it on close', async () => {
    const before = new Set(childPids());
    const gw = await startGateway({
      config: toConfig({
        models: [MODEL],
        simulate: { replicas: 2, time_scale: 0.1 },
        server: { port: 0 },
        logging: { level: 'silent' },
      }),
      watch: false,
    });
    const fleet = gw.fleet!;
    expect(fleet.pid).not.toBe(process.pid);
    expect(childPids().filter((p) => !before.has(p))).toContain(fleet.pid);
    expect(fleet.urls).toHaveLength(2);
    expect(gw.runtime.backends.list().map((b) => b.url)).toEqual(fleet.urls.map((u) => new URL(u).origin));
    const res = await post(gw.url, '/v1/chat/completions', chat());
    expect(res.status).toBe(200);
    await gw.close();
    expect(alive(fleet.pid)).toBe(false);
  });

  it('serves a model whose name starts with a dash (passed to the fleet as one argument)', async () => {
    const model = '-dashed/model';
    const gw = await startGateway({
      config: toConfig({
        models: [model],
        simulate: { replicas: 1, time_scale: 0.1 },
        server: { port: 0 },
        logging: { level: 'silent' },
      }),
      watch: false,
    });
    cleanups.push(async () => {
      await gw.close();
    });
    const res = await post(gw.url, '/v1/chat/completions', chat({ model }));
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as { model: string }).model).toBe(model);
  });

  it('outlives a signal to its process group (the gateway drains through it), and ends when closed', async () => {
    const fleet = await startFleetProcess({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.05 });
    let closed = false;
    cleanups.push(async () => {
      if (!closed) await fleet.close();
    });
    // What a Ctrl-C or a service manager's stop delivers to the gateway's group, delivered here.
    process.kill(fleet.pid, 'SIGINT');
    process.kill(fleet.pid, 'SIGTERM');
    process.kill(fleet.pid, 'SIGHUP');
    // A whole generation later it still serves (a stream of the drain would have been cut).
    const res = await post(fleet.urls[0]!, '/v1/chat/completions', chat({ max_tokens: 20 }));
    expect(res.status).toBe(200);
    expect(alive(fleet.pid)).toBe(true);
    await fleet.close();
    closed = true;
    expect(alive(fleet.pid)).toBe(false);
  });

  it('tells of an exit close() did not ask for', async () => {
    const exits: (NodeJS.Signals | null)[] = [];
    let told: () => void = () => {};
    const toldOnce = new Promise<void>((resolve) => {
      told = resolve;
    });
    const fleet = await startFleetProcess({
      replicas: 1,
      profile: 'llama3-8b-h100',
      timeScale: 0.05,
      onUnexpectedExit: (_code, signal) => {
        exits.push(signal);
        told();
      },
    });
    cleanups.push(() => fleet.close());
    process.kill(fleet.pid, 'SIGKILL');
    await toldOnce;
    expect(exits).toEqual(['SIGKILL']);
  });

  it('keeps no process alive that reaches its end without closing it, and then ends itself', async () => {
    // A parent that never calls close() (a failed shutdown step): neither holds the other up.
    const script = [
      `import { startFleetProcess } from ${JSON.stringify(new URL('../../src/sim/fleet-process.ts', import.meta.url).pathname)};`,
      `const fleet = await startFleetProcess({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.1 });`,
      "process.stdout.write(String(fleet.pid) + '\\n');",
    ].join('\n');
    const parent = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    cleanups.push(async () => {
      if (parent.exitCode === null) parent.kill('SIGKILL');
    });
    let out = '';
    parent.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    const code = await new Promise<number | null>((resolve) => parent.once('exit', (c) => resolve(c)));
    expect(code).toBe(0);
    const fleetPid = Number(out.trim());
    expect(fleetPid).toBeGreaterThan(0);
    await waitFor(() => !alive(fleetPid), 5000, 'the fleet ends with its parent');
  });

  it('exits when the gateway process is killed without a chance to stop it', async () => {
    let served: ServedGateway | null = await serveChild({
      models: [MODEL],
      simulate: { replicas: 1, time_scale: 0.1 },
    });
    cleanups.push(async () => served?.dispose());
    const gatewayPid = served.child.pid!;
    await waitFor(() => childPids(gatewayPid).length > 0, 5000, 'the fleet child');
    const [fleetPid] = childPids(gatewayPid);
    served.child.kill('SIGKILL');
    await served.exited;
    await waitFor(() => !alive(fleetPid!), 5000, 'the orphaned fleet exits');
    await served.dispose();
    served = null;
  });
});
