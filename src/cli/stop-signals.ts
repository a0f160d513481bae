// Stop signals heard before a command takes them over. The entry (bin/slagate.js) holds them from
// before a command's modules load, which takes seconds on a busy machine: without a handler, a
// signal then killed the process, or, as PID 1 in a container, was ignored: a `docker stop` or a
// deleted pod during a gateway's start was lost, and the gateway came up and served until SIGKILL.
//
//   entry ─▶ holdStopSignals() ─▶ import the command ─▶ serve: its own handlers, then takeStopSignal()
//                                                       (a stop heard is kept: it drains once up);
//                                                       any other: main takes it, and a stop heard
//                                                       ends it as the signal would (128 + number)

const HELD = ['SIGTERM', 'SIGINT', 'SIGHUP'] as const;
type Held = (typeof HELD)[number];

let heard: Held | null = null;
const hold = (signal: NodeJS.Signals): void => {
  // The first stop counts; a SIGHUP (a reload asked for) is kept only if nothing else was.
  if (heard === null || heard === 'SIGHUP') heard = signal as Held;
};

/** From now until takeStopSignal(), SIGTERM, SIGINT and SIGHUP are held, not acted on. */
export function holdStopSignals(): void {
  for (const s of HELD) process.on(s, hold);
}

/**
 * Stops holding them (the caller's own handlers, or Node's defaults, act from now on) and returns
 * the one heard while they were held: the first SIGTERM or SIGINT, else a SIGHUP, else null.
 */
export function takeStopSignal(): Held | null {
  for (const s of HELD) process.off(s, hold);
  const s = heard;
  heard = null;
  return s;
}
