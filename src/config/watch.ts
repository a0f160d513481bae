// Live reload: the running configuration changes only to a file that validates. A bad file (or a
// missing one, mid-replace) is reported through onError with every issue, and the previous
// configuration stays current.
//
// The directory is watched, not the file: editors and Kubernetes ConfigMaps replace the file
// (write a temporary, rename it over; or swap a `..data` symlink), which orphans a watch on the
// old inode. Events are debounced and a reload happens only when the text differs from the last
// text seen, so bursts of events and unrelated files in the directory cost one read at most.
import { type FSWatcher, watch } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { parseConfig, readConfigText } from './load.ts';
import type { Config } from './schema.ts';

export interface ConfigWatchHandlers {
  /**
   * A new valid configuration that differs from the previous one. If applying it fails (it throws,
   * or the promise it returns rejects), the watcher keeps the previous one as current.
   */
  onChange(next: Config, previous: Config): void | Promise<void>;
  /** A ConfigError for an invalid or unreadable file (the previous configuration is kept), or the
   *  failure of onChange. */
  onError(err: Error): void;
  /**
   * The file cannot be watched (the system's inotify limits used up: ENOSPC, EMFILE) or its
   * watcher failed: edits are no longer seen, and SIGHUP (when on) is what reloads the file now.
   */
  onWatchLost(err: Error): void;
  /** A SIGHUP read the file and found the configuration in force (nothing to apply). */
  onUnchanged?(): void;
}

export interface ConfigWatchOptions {
  /** The configuration already running; when absent the file is loaded now (throws ConfigError). */
  initial?: Config;
  /** Quiet time after the last file event before reading, ms. */
  debounceMs?: number;
  /** Reload when the file changes (default true). */
  watchFile?: boolean;
  /** Reload on SIGHUP (default true); a SIGHUP reload reports a still-invalid file again. */
  sighup?: boolean;
}

export interface ConfigWatcher {
  /** The configuration currently in force. */
  current(): Config;
  /** Stops watching: closes the file watcher, clears the timer, removes the SIGHUP listener. */
  close(): void;
}

export function watchConfig(
  path: string,
  handlers: ConfigWatchHandlers,
  options: ConfigWatchOptions = {},
): ConfigWatcher {
  const file = resolve(path);
  const { debounceMs = 100, watchFile = true, sighup = true } = options;
  // With `initial`, the caller loaded the file some time ago (the gateway starts its fleet, its
  // state store and its model list before it watches): nothing of the file counts as seen, and it
  // is read once as soon as the watch starts, so an edit made meanwhile is applied, not lost.
  let lastSeen: Snapshot = options.initial === undefined ? snapshot(path) : { key: '', text: '' };
  let current = options.initial ?? parseSnapshot(lastSeen, path);
  let timer: NodeJS.Timeout | undefined;
  let forcePending = false;
  let closed = false;

  const reload = (force: boolean) => {
    const seen = snapshot(path);
    if (!force && seen.key === lastSeen.key) return;
    lastSeen = seen;
    let next: Config;
    try {
      next = parseSnapshot(seen, path);
    } catch (err) {
      handlers.onError(err as Error);
      return;
    }
    if (isDeepStrictEqual(next, current)) {
      if (force) handlers.onUnchanged?.();
      return;
    }
    const previous = current;
    current = next;
    // Invariant: current() names the configuration that is running. A change the gateway could
    // not apply is rolled back here (unless a newer one has replaced it meanwhile).
    const failed = (err: unknown) => {
      if (current === next) current = previous;
      handlers.onError(err instanceof Error ? err : new Error(String(err)));
    };
    try {
      const applied = handlers.onChange(next, previous);
      if (applied instanceof Promise) applied.catch(failed);
    } catch (err) {
      failed(err);
    }
  };

  const schedule = (force: boolean) => {
    if (closed) return;
    forcePending ||= force;
    clearTimeout(timer);
    timer = setTimeout(() => {
      const f = forcePending;
      forcePending = false;
      timer = undefined;
      if (!closed) reload(f);
    }, debounceMs);
    timer.unref();
  };

  // Invariant: a file that cannot be watched never stops the gateway. fs.watch throws at once when
  // the per-user inotify limits are used up (shared by every container of one uid on a node), and
  // a gateway that serves fine must not be undone at its start for it: the loss is reported, and
  // SIGHUP still reloads.
  let watcher: FSWatcher | undefined;
  if (watchFile) {
    const name = basename(file);
    try {
      // `..data` and friends: the Kubernetes atomic writer swaps a symlink next to the file.
      watcher = watch(dirname(file), { persistent: false }, (_event, changed) => {
        if (changed === null || changed === name || changed.startsWith('..')) schedule(false);
      });
      watcher.on('error', (err) => {
        watcher?.close();
        watcher = undefined;
        handlers.onWatchLost(err);
      });
    } catch (err) {
      handlers.onWatchLost(err as Error);
    }
  }
  const onSighup = () => schedule(true);
  if (sighup) process.on('SIGHUP', onSighup);
  if (options.initial !== undefined) schedule(false);

  return {
    current: () => current,
    close() {
      if (closed) return;
      closed = true;
      clearTimeout(timer);
      watcher?.close();
      if (sighup) process.off('SIGHUP', onSighup);
    },
  };
}

type Snapshot = { key: string; text: string } | { key: string; error: Error };

/** What the file holds now; `key` differs whenever the text or the reason it is unreadable does. */
function snapshot(path: string): Snapshot {
  try {
    const text = readConfigText(path);
    return { key: `text:${text}`, text };
  } catch (err) {
    return { key: `unreadable:${(err as Error).message}`, error: err as Error };
  }
}

function parseSnapshot(seen: Snapshot, path: string): Config {
  if ('error' in seen) throw seen.error;
  return parseConfig(seen.text, path);
}
