// Stop signals heard before a command takes them over. The entry holds them from its first import
// (bin/hold-stop-signals.js), before the TypeScript loader and the command's modules load:
//
//   entry ─▶ hold ─▶ loader ─▶ main ─▶ import the command ─▶ serve: its own handlers, then
//                                                            takeStopSignal() (a stop heard is
//                                                            kept: it drains once up)
//                                                          ─▶ any other: main takes it first, and
//                                                            a stop heard ends it as the signal
//                                                            would (128 + its number)
//   main, as it returns ─▶ a stop held and never taken (help, a usage error) ends it the same way

type Held = 'SIGTERM' | 'SIGINT' | 'SIGHUP';

const KEY = Symbol.for('slagate.heldStopSignal');

/**
 * Stops holding them (the caller's own handlers, or Node's defaults, act from now on) and returns
 * the one heard while they were held: the first SIGTERM or SIGINT, else a SIGHUP, else null (also
 * when nothing held them: an entry other than bin/slagate.js).
 */
export function takeStopSignal(): Held | null {
  const take = (globalThis as Record<symbol, unknown>)[KEY] as (() => Held | null) | undefined;
  return take?.() ?? null;
}
