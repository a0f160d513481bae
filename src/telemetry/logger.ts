import { accessSync, constants, mkdirSync, openSync, type Stats, statSync } from 'node:fs';
import { dirname, sep } from 'node:path';
import { pino } from 'pino';

// Secrets never reach a log line: redaction is compiled once, here, for every logger the gateway
// makes, so a call site cannot forget it (the admission log alone opts out: its records are built
// from typed fields only). Paths cover the shapes that carry credentials: request
// headers (as fastify serialises them, and bare), API keys under either spelling at the top level
// or one or two levels down, and the Redis URL (it may embed a password).
export const REDACT_PATHS: readonly string[] = [
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers.cookie',
  'headers.authorization',
  'headers["x-api-key"]',
  'headers.cookie',
  '*.headers.authorization',
  '*.headers["x-api-key"]',
  '*.headers.cookie',
  'authorization',
  '*.authorization',
  '*.*.authorization',
  'api_key',
  '*.api_key',
  '*.*.api_key',
  'apiKey',
  '*.apiKey',
  '*.*.apiKey',
  'api_key_sha256',
  '*.api_key_sha256',
  '*.*.api_key_sha256',
  'redis_url',
  '*.redis_url',
  '*.*.redis_url',
];

export const REDACTED = '[redacted]';

export interface LoggerOptions {
  /** pino level name: trace, debug, info, warn, error, fatal, silent. */
  level: string;
  /**
   * `stdout`, a file path (appended to, parent directories created), or a stream (tests).
   */
  destination: 'stdout' | string | pino.DestinationStream;
  /** A buffered line waits at most this long before it is written. Default 100 ms. */
  flushIntervalMs?: number;
  /**
   * Bytes a file or stdout destination may hold that the OS has not taken yet; lines past it are
   * dropped. Default 64 MiB.
   */
  bufferBytes?: number;
  /** How long close() waits for the buffered lines to be taken before it drops them. Default 5 s. */
  closeWaitMs?: number;
}

export interface Logger {
  logger: pino.Logger;
  /** Resolves once every line logged so far has been handed to the OS. */
  flush(): Promise<void>;
  /**
   * Flushes, then releases the destination (its file descriptor and flush timer; stdout itself is
   * never closed). Only for the very end: a line logged after it is dropped. Waits at most
   * closeWaitMs; resolves with whether every line was handed to the OS (false: a reader stopped
   * reading, or a write failed).
   */
  close(): Promise<boolean>;
  /** Lines dropped because the destination's buffer was full (its reader fell behind). */
  dropped(): number;
  /**
   * Writes to the destination that failed (a full disk, a pipe whose reader closed it). Their lines
   * stay buffered and are tried again with the next write, until the buffer's bound drops them.
   */
  writeErrors(): number;
  /**
   * A file destination opens its path again (created when it is gone) and writes there from now on,
   * lines still buffered included: a log rotated by renaming it (logrotate's default `create`) is
   * taken up in a new file, not written on to the renamed or deleted one. Resolves with the path
   * once the new file is open, or null for a destination that is not a file (or is closed); rejects
   * when the path cannot be opened, and the lines go on to the file the log had open (a later
   * reopen may succeed).
   */
  reopen(): Promise<string | null>;
  /**
   * For a process about to exit after close() gave up: discards what is still buffered, so that
   * the exit does not write it synchronously (pino flushes a destination at exit, and a reader
   * that stopped reading would block that write for good).
   */
  abandon(): void;
}

type SonicBoom = ReturnType<typeof pino.destination>;

/** The file's descriptor, opened for appending; its directory is created first. Throws when it cannot be. */
function openForAppend(path: string): number {
  makeDirectories(dirname(path));
  return openSync(path, 'a');
}

/**
 * `dir` and the ancestors it lacks, made one at a time from the nearest that exists. Not
 * mkdirSync's `recursive`: under a file system that refuses new entries with ENOENT (procfs: an
 * admission log under /proc/), Node 20's recursive mkdir tries again for good, and serve hung at its
 * start, deaf to SIGTERM. Here the first refusal is thrown.
 */
function makeDirectories(dir: string): void {
  const missing: string[] = [];
  for (let d = dir; statOrNull(d) === null && dirname(d) !== d; d = dirname(d)) missing.push(d);
  for (const d of missing.reverse()) {
    try {
      mkdirSync(d);
    } catch (err) {
      // Made meanwhile by another process (two instances starting at once): as good as ours.
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || statOrNull(d)?.isDirectory() !== true)
        throw err;
    }
  }
}

/**
 * Why openForAppend would fail on `path`, without creating anything: null when it would succeed as
 * far as the file system can tell now. check-config asks this, so that it refuses the log paths
 * serve would refuse at its start.
 */
export function appendProblem(path: string): string | null {
  // A path naming a directory (a trailing separator) cannot be opened as a file, existing or not.
  if (path.endsWith('/') || path.endsWith(sep)) return 'EISDIR';
  try {
    const stat = statOrNull(path);
    if (stat !== null) {
      if (stat.isDirectory()) return 'it is a directory';
      accessSync(path, constants.W_OK);
      return null;
    }
    // The nearest existing ancestor must be a directory we may create entries in (a file on the
    // way made the stat above throw ENOTDIR).
    let dir = dirname(path);
    while (statOrNull(dir) === null && dirname(dir) !== dir) dir = dirname(dir);
    accessSync(dir, constants.W_OK | constants.X_OK);
    return null;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? (err instanceof Error ? err.message : String(err));
  }
}

function statOrNull(path: string): Stats | null {
  try {
    return statSync(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}

export function createLogger(opts: LoggerOptions): Logger {
  const redact = { paths: [...REDACT_PATHS], censor: REDACTED };
  if (typeof opts.destination !== 'string') {
    const logger = pino({ level: opts.level, redact }, opts.destination);
    return {
      logger,
      flush: async () => {},
      close: async () => true,
      dropped: () => 0,
      writeErrors: () => 0,
      abandon: () => {},
      reopen: async () => null,
    };
  }
  // Asynchronous writes keep logging off the request path; the buffer is bounded in time by the
  // periodic flush so a quiet gateway's lines still appear promptly (e.g. for `slagate logs --pretty`).
  // minLength must stay above 0: with 0, sonic-boom calls a flush back before pending writes finish.
  // The destination is ended only by close(), after the last request: a late line cannot throw.
  // A file is opened here, synchronously (parent directories created): a path that cannot be
  // written throws now, at the start, not later as an uncaught error of the destination's own
  // open (after which its flush timer threw on the missing file descriptor every 100 ms).
  const path = opts.destination === 'stdout' ? null : opts.destination;
  const dest: SonicBoom = pino.destination({
    dest: path === null ? 1 : openForAppend(path),
    sync: false,
    minLength: 4096,
    // Invariant: what a stalled reader (a blocked stdout pipe, a full disk's slow writes) leaves
    // unwritten is bounded; past it lines are dropped and counted, never held without limit.
    maxLength: opts.bufferBytes ?? 64 * 1024 * 1024,
    periodicFlush: opts.flushIntervalMs ?? 100,
  });
  let dropped = 0;
  dest.on('drop', () => {
    dropped++;
  });
  // Invariant: the destination always has an 'error' listener, and the operator hears of a log that
  // cannot be written. A write that fails (a full disk, a pipe whose reader is gone) leaves its
  // lines buffered, sonic-boom tries them again with the next write, and the gateway goes on
  // serving; without the listener it would be an uncaught error. Each failure is counted
  // (slagate_log_write_errors_total), and stderr says when writing stops and when it resumes.
  let failed = false;
  let writeErrors = 0;
  const where = path ?? 'stdout';
  // A reopen's open that fails is not a write that failed: sonic-boom keeps the descriptor it had,
  // and the lines go on there (reopen rejects; a later SIGHUP may reopen).
  let reopening = false;
  dest.on('error', (err: NodeJS.ErrnoException) => {
    if (reopening) return;
    writeErrors++;
    if (failed) return;
    failed = true;
    process.stderr.write(
      `slagate: the log (${where}) cannot be written (${err.code ?? err.message}): its lines are held and tried again, and dropped past the buffer's bound\n`,
    );
  });
  // Bytes written, not a write of none (a periodic flush with nothing to write succeeds even on a
  // full disk): only they show the destination takes lines again.
  dest.on('write', (n: number) => {
    if (n <= 0 || !failed || closed) return;
    failed = false;
    process.stderr.write(`slagate: the log (${where}) is written again\n`);
  });
  // With a file descriptor the destination is ready on the next tick; a flush issued before then
  // could wait for a drain that never comes.
  const ready = new Promise<void>((resolve) => dest.once('ready', () => resolve()));
  let closed = false;
  // Invariant: a line logged after close() is dropped, never written to the ended or abandoned
  // destination (sonic-boom throws on that, and pino does not catch it): a reload or a Redis tick
  // that finishes after the shutdown must not turn into an uncaught error.
  const sink = {
    write(line: string): void {
      if (!closed) dest.write(line);
    },
  };
  const logger = pino({ level: opts.level, redact }, sink);
  const flushes = serialFlushes(() => flushDestination(dest));
  const flush = () => (closed || failed ? Promise.resolve() : ready.then(flushes));
  const close = async (): Promise<boolean> => {
    if (closed) return !failed;
    if (failed) {
      closed = true;
      dest.destroy();
      return false;
    }
    const waitMs = opts.closeWaitMs ?? 5_000;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<'expired'>((resolve) => {
      timer = setTimeout(() => resolve('expired'), waitMs);
    });
    const ended = (async () => {
      await flush();
      closed = true;
      await new Promise<void>((resolve) => {
        dest.once('close', () => resolve());
        dest.end();
      });
      return 'ended' as const;
    })();
    const how = await Promise.race([ended, expired]);
    clearTimeout(timer);
    // Past the wait the destination is left as it is: destroying it under a write in flight leaves
    // sonic-boom retrying an empty write for good once the reader resumes. Lines logged from now
    // on are dropped; what is still buffered is written if the reader resumes before the process
    // exits (serve exits at once when this returns false).
    closed = true;
    return how === 'ended' && !failed;
  };
  const abandon = (): void => {
    closed = true;
    if (!(dest as SonicBoom & { destroyed?: boolean }).destroyed) dest.destroy();
  };
  const reopen = async (): Promise<string | null> => {
    if (path === null || closed) return null;
    await ready;
    // sonic-boom reopens only a destination it opened by name; this one was given the descriptor
    // opened above (so that a bad path fails the start), so it is told the name here. reopen()
    // waits for a write in flight, opens the path for appending, then closes the old descriptor.
    (dest as unknown as { file: string | null }).file = path;
    reopening = true;
    try {
      await new Promise<void>((resolve, reject) => {
        const onError = (err: Error) => {
          dest.off('ready', onReady);
          reject(err);
        };
        const onReady = () => {
          dest.off('error', onError);
          resolve();
        };
        dest.once('ready', onReady);
        dest.once('error', onError);
        dest.reopen();
      });
    } finally {
      reopening = false;
    }
    return path;
  };
  return { logger, flush, close, dropped: () => dropped, writeErrors: () => writeErrors, abandon, reopen };
}

/**
 * One flush at a time, and at most one more queued behind it that every later caller shares: that
 * one starts after the call, so it covers every line logged before the call. Each sonic-boom
 * flush adds listeners until it completes; callers flushing per request must not pile them up.
 */
function serialFlushes(run: () => Promise<void>): () => Promise<void> {
  let running: Promise<void> | null = null;
  let queued: Promise<void> | null = null;
  const next = (): Promise<void> => {
    if (running === null) {
      running = run().finally(() => {
        running = null;
      });
      return running;
    }
    if (queued === null) {
      const again = (): Promise<void> => {
        queued = null;
        return next();
      };
      queued = running.then(again, again);
    }
    return queued;
  };
  return next;
}

/**
 * Every line logged so far reaches the OS. sonic-boom's flush() issued while a write is in flight
 * only waits for that write's 'drain', which it emits with up to minLength bytes still buffered
 * (sonic-boom 4.2: a write that leaves ≤ minLength bytes ends the writing state without writing
 * them). A second flush, issued when nothing is in flight, writes whatever is left.
 */
async function flushDestination(dest: SonicBoom): Promise<void> {
  await flushOnce(dest);
  await flushOnce(dest);
}

function flushOnce(dest: SonicBoom): Promise<void> {
  return new Promise((resolve, reject) =>
    dest.flush((err) => {
      // fsync after the drain fails on pipes and terminals (EINVAL); the data was written.
      if (err && !isUnsyncable(err)) reject(err);
      else resolve();
    }),
  );
}

function isUnsyncable(err: Error): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'EINVAL' || code === 'ENOTSUP' || code === 'EROFS';
}

export interface RequestContext {
  req_id: string;
  tenant: string | null;
  class: string | null;
}

/** A child logger whose every line carries the request's id, tenant and class. */
export function requestLogger(logger: pino.Logger, ctx: RequestContext): pino.Logger {
  return logger.child({ req_id: ctx.req_id, tenant: ctx.tenant, class: ctx.class });
}
