import { mkdirSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  type Config,
  ConfigError,
  type ConfigWatcher,
  type ConfigWatchOptions,
  watchConfig,
} from '../../src/config/index.ts';

const valid = (port: number) => `models: [m]\nsimulate: { replicas: 2 }\nserver: { port: ${port} }\n`;
const INVALID = 'models: [m]\nsimulate: { replicas: 0 }\nserver: { prot: 1 }\n';
const WAIT_MS = 5000;

type Event =
  | { kind: 'change'; next: Config; previous: Config }
  | { kind: 'error'; err: Error }
  | { kind: 'unchanged' }
  | { kind: 'watch_lost'; err: Error };

/** Collects watcher callbacks; `next()` resolves with the next one (or fails after WAIT_MS). */
class Recorder {
  readonly events: Event[] = [];
  private waiters: ((e: Event) => void)[] = [];
  readonly handlers = {
    onChange: (next: Config, previous: Config) => this.push({ kind: 'change', next, previous }),
    onError: (err: Error) => this.push({ kind: 'error', err }),
    onUnchanged: () => this.push({ kind: 'unchanged' }),
    onWatchLost: (err: Error) => this.push({ kind: 'watch_lost', err }),
  };
  private push(event: Event) {
    this.events.push(event);
    this.waiters.shift()?.(event);
  }
  next(): Promise<Event> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no watcher callback')), WAIT_MS);
      this.waiters.push((e) => {
        clearTimeout(timer);
        resolve(e);
      });
    });
  }
}

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let dir: string;
let file: string;
let watcher: ConfigWatcher | undefined;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'slagate-config-'));
  file = join(dir, 'gateway.yaml');
  writeFileSync(file, valid(8080));
});

afterEach(() => {
  watcher?.close();
  watcher = undefined;
  rmSync(dir, { recursive: true, force: true });
});

function start(recorder: Recorder, options: ConfigWatchOptions = {}): ConfigWatcher {
  watcher = watchConfig(file, recorder.handlers, { debounceMs: 30, ...options });
  return watcher;
}

describe('watchConfig on file changes', () => {
  it('loads the file at start and throws ConfigError when it is invalid', () => {
    const w = start(new Recorder());
    expect(w.current().server.port).toBe(8080);
    w.close();
    writeFileSync(file, INVALID);
    expect(() => watchConfig(file, new Recorder().handlers)).toThrow(ConfigError);
  });

  it('a valid change calls onChange with the new and the previous configuration', async () => {
    const recorder = new Recorder();
    const w = start(recorder);
    const event = recorder.next();
    writeFileSync(file, valid(9001));
    const e = await event;
    expect(e.kind).toBe('change');
    if (e.kind !== 'change') return;
    expect(e.next.server.port).toBe(9001);
    expect(e.previous.server.port).toBe(8080);
    expect(Object.isFrozen(e.next.server)).toBe(true);
    expect(w.current()).toBe(e.next);
  });

  it('given the configuration already running, an edit made before the watch began is applied at once', async () => {
    const running = watchConfig(file, new Recorder().handlers, { watchFile: false, sighup: false });
    const initial = running.current();
    running.close();
    // Edited while the caller was still starting: no file event will come for it after the watch.
    writeFileSync(file, valid(9002));
    const recorder = new Recorder();
    const event = recorder.next();
    const w = start(recorder, { initial });
    const e = await event;
    expect(e.kind).toBe('change');
    if (e.kind !== 'change') return;
    expect(e.next.server.port).toBe(9002);
    expect(e.previous).toBe(initial);
    expect(w.current()).toBe(e.next);
  });

  it('an invalid change calls onError with every issue and keeps the previous configuration', async () => {
    const recorder = new Recorder();
    const w = start(recorder);
    const before = w.current();
    const errored = recorder.next();
    writeFileSync(file, INVALID);
    const e = await errored;
    expect(e.kind).toBe('error');
    if (e.kind !== 'error') return;
    expect(e.err).toBeInstanceOf(ConfigError);
    expect((e.err as ConfigError).issues.map((i) => i.path).sort()).toEqual([
      'server.prot',
      'simulate.replicas',
    ]);
    expect(w.current()).toBe(before);

    // Fixing the file is picked up; the "previous" configuration is the one that stayed in force.
    const fixed = recorder.next();
    writeFileSync(file, valid(9002));
    const f = await fixed;
    expect(f.kind === 'change' && [f.next.server.port, f.previous.server.port]).toEqual([9002, 8080]);
  });

  it('follows an editor that replaces the file (write a temporary, rename it over)', async () => {
    const recorder = new Recorder();
    const w = start(recorder);
    const event = recorder.next();
    const temp = join(dir, '.gateway.yaml.swp');
    writeFileSync(temp, valid(9003));
    renameSync(temp, file);
    expect((await event).kind).toBe('change');
    expect(w.current().server.port).toBe(9003);

    // The watch survives the replacement: a second edit is seen too.
    const second = recorder.next();
    writeFileSync(file, valid(9004));
    await second;
    expect(w.current().server.port).toBe(9004);
  });

  it('a change the caller fails to apply (onChange rejects) leaves the previous one current', async () => {
    const errors: Error[] = [];
    let reject: (err: Error) => void = () => {};
    const running = watchConfig(
      file,
      {
        onChange: () => new Promise<void>((_, r) => (reject = r)),
        onError: (err) => errors.push(err),
        onWatchLost: (err) => errors.push(err),
      },
      { debounceMs: 30 },
    );
    watcher = running;
    const before = running.current();
    writeFileSync(file, valid(9003));
    for (let i = 0; i < 100 && running.current() === before; i++) await delay(20);
    expect(running.current().server.port).toBe(9003);
    reject(new Error('router.policy is not built'));
    await delay(10);
    expect(running.current()).toBe(before);
    expect(errors.map((e) => e.message)).toEqual(['router.policy is not built']);
  });

  it('a change of layout only (same effective configuration) is not a change', async () => {
    // Fake timers: each write's debounced reload is run at will, so the reformat's reload is known
    // to have run (and found nothing) before the real change is written.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      const recorder = new Recorder();
      const w = start(recorder);
      /** Runs the reload the file event scheduled, once the watch has seen the write. */
      const reloadNow = async () => {
        const deadline = Date.now() + WAIT_MS;
        while (vi.getTimerCount() < 1) {
          if (Date.now() > deadline) throw new Error('no reload was scheduled');
          await new Promise((r) => setImmediate(r));
        }
        vi.runOnlyPendingTimers();
      };
      writeFileSync(
        file,
        `# reformatted\nserver:\n  port: 8080\nsimulate: { replicas: 2 }\nmodels:\n  - m\n`,
      );
      await reloadNow();
      expect(recorder.events).toEqual([]);
      writeFileSync(file, valid(9005));
      await reloadNow();
      // The one callback is the real change: the reformatting produced none.
      expect(recorder.events).toHaveLength(1);
      const e = recorder.events[0]!;
      expect(e.kind === 'change' && e.previous.server.port).toBe(8080);
      expect(w.current().server.port).toBe(9005);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('a file that cannot be watched', () => {
  it('is reported, does not throw, and SIGHUP still reloads it', async () => {
    // fs.watch throws at once when it cannot watch (the inotify limits used up: ENOSPC, EMFILE; here
    // ENOENT, the file's directory gone when the watch begins).
    const initial = watchConfig(file, new Recorder().handlers, { watchFile: false, sighup: false }).current();
    rmSync(dir, { recursive: true, force: true });
    const recorder = new Recorder();
    const w = start(recorder, { initial });
    expect(recorder.events).toHaveLength(1);
    const lost = recorder.events[0]!;
    expect(lost.kind === 'watch_lost' && (lost.err as NodeJS.ErrnoException).code).toBe('ENOENT');
    // The read a watch given `initial` makes at once finds no file.
    expect((await recorder.next()).kind).toBe('error');
    // The file comes back changed; only the signal can tell the watcher.
    mkdirSync(dir);
    writeFileSync(file, valid(9400));
    await delay(200);
    expect(recorder.events).toHaveLength(2);
    const event = recorder.next();
    process.kill(process.pid, 'SIGHUP');
    const e = await event;
    expect(e.kind === 'change' && e.next.server.port).toBe(9400);
    expect(w.current().server.port).toBe(9400);
  });
});

describe('watchConfig on SIGHUP', () => {
  it('SIGHUP reloads the file', async () => {
    const recorder = new Recorder();
    const w = start(recorder, { watchFile: false });
    writeFileSync(file, valid(9100));
    await delay(100);
    expect(recorder.events).toHaveLength(0); // file events are off: only the signal reloads
    const event = recorder.next();
    process.kill(process.pid, 'SIGHUP');
    const e = await event;
    expect(e.kind === 'change' && e.next.server.port).toBe(9100);
    expect(w.current().server.port).toBe(9100);
  });

  it('SIGHUP with the configuration in force says so, and changes nothing', async () => {
    const recorder = new Recorder();
    const w = start(recorder, { watchFile: false });
    const initial = w.current();
    // Same configuration, different text (a comment): still nothing to apply.
    writeFileSync(file, `# touched\n${valid(8080)}`);
    const event = recorder.next();
    process.kill(process.pid, 'SIGHUP');
    expect(await event).toEqual({ kind: 'unchanged' });
    expect(w.current()).toBe(initial);
    expect(recorder.events).toHaveLength(1);
  });

  it('SIGHUP on a still-invalid file reports its errors again and keeps the configuration', async () => {
    const recorder = new Recorder();
    const w = start(recorder, { watchFile: false });
    writeFileSync(file, INVALID);
    for (let i = 0; i < 2; i++) {
      const event = recorder.next();
      process.kill(process.pid, 'SIGHUP');
      const e = await event;
      expect(e.kind === 'error' && e.err).toBeInstanceOf(ConfigError);
    }
    expect(w.current().server.port).toBe(8080);
  });
});

describe('close()', () => {
  it('removes the SIGHUP listener and stops reacting to the file', async () => {
    const baseline = process.listenerCount('SIGHUP');
    const recorder = new Recorder();
    const w = start(recorder);
    expect(process.listenerCount('SIGHUP')).toBe(baseline + 1);
    w.close();
    expect(process.listenerCount('SIGHUP')).toBe(baseline);
    writeFileSync(file, valid(9200));
    await delay(300);
    expect(recorder.events).toEqual([]);
    expect(w.current().server.port).toBe(8080);
  });

  it('cancels a reload already scheduled', async () => {
    // Fake timers: each watcher's debounced reload is a timer that can be seen pending and run at
    // will. A second watcher on the same file, left open, shows what the pending timer would do.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    const control = new Recorder();
    const controlWatcher = watchConfig(file, control.handlers, { debounceMs: 200 });
    try {
      const recorder = new Recorder();
      const w = start(recorder, { debounceMs: 200 });
      writeFileSync(file, valid(9300));
      // Both watchers have had the file event: a reload is pending on each.
      const deadline = Date.now() + WAIT_MS;
      while (vi.getTimerCount() < 2) {
        if (Date.now() > deadline) throw new Error('no reload was scheduled');
        await new Promise((r) => setImmediate(r));
      }
      w.close();
      expect(vi.getTimerCount()).toBe(1);
      vi.runAllTimers();
      expect(recorder.events).toEqual([]);
      expect(w.current().server.port).toBe(8080);
      // The control's pending reload ran: it was the change to 9300.
      expect(control.events.map((e) => (e.kind === 'change' ? e.next.server.port : e.kind))).toEqual([9300]);
    } finally {
      controlWatcher.close();
      vi.useRealTimers();
    }
  });
});
