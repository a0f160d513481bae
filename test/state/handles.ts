// Counts the timers and TCP handles created while tracking is on and not yet destroyed, including
// unref'd ones (process.getActiveResourcesInfo() does not list those), to catch leaks after close().
//
// Timers count only when created from src/state: node's HTTP date cache and undici's shared
// fast-timer tick are process-wide singletons, not owned by any scraper or store. TCP handles all
// count (a test closes its own servers before asking).
import { createHook } from 'node:async_hooks';

export interface HandleTracker {
  /** Handles created since trackHandles() that are still alive, by type. */
  live(): Record<string, number>;
  /** Where each timer still alive was created: the frames of its stack in src/ and test/. */
  timerStacks(): string[];
  stop(): void;
}

const OWN_CODE = /[/\\]src[/\\]state[/\\]/;
const UNDICI_SHARED_TIMER = /undici[/\\]lib[/\\]util[/\\]timers\.js/;

/**
 * `own`: where a timer must be created from to count (src/state by default); `except`: timers
 * whose creation stack matches it do not count.
 */
export function trackHandles(own: RegExp = OWN_CODE, except?: RegExp): HandleTracker {
  const alive = new Map<number, string>();
  const stacks = new Map<number, string>();
  const previousLimit = Error.stackTraceLimit;
  Error.stackTraceLimit = 50;
  const hook = createHook({
    init(id, type) {
      if (type === 'TCPWRAP') alive.set(id, type);
      if (type !== 'Timeout') return;
      const stack = new Error().stack ?? '';
      if (own.test(stack) && !UNDICI_SHARED_TIMER.test(stack) && !except?.test(stack)) {
        alive.set(id, type);
        stacks.set(id, stack);
      }
    },
    destroy(id) {
      alive.delete(id);
      stacks.delete(id);
    },
  });
  hook.enable();
  return {
    live() {
      const out: Record<string, number> = {};
      for (const type of alive.values()) out[type] = (out[type] ?? 0) + 1;
      return out;
    },
    timerStacks() {
      return [...stacks.values()].map((stack) =>
        stack
          .split('\n')
          .filter((line) => /[/\\](src|test)[/\\]/.test(line))
          .join(' | '),
      );
    },
    stop() {
      hook.disable();
      Error.stackTraceLimit = previousLimit;
    },
  };
}
