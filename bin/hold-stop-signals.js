// The entry's first import, plain JavaScript evaluated before the TypeScript loader starts (which
// takes hundreds of milliseconds on a busy machine, and the command's modules seconds more): from
// here on SIGTERM, SIGINT and SIGHUP are held for the command, not acted on. Without a handler
// then, a signal killed the process, or, as PID 1 in a container, was ignored: a `docker stop` or
// a deleted pod during a gateway's start was lost, and the gateway came up and served until SIGKILL.
// src/cli/stop-signals.ts takes what was held (once: the holder is gone after).

const HELD = ['SIGTERM', 'SIGINT', 'SIGHUP'];
let heard = null;
const hold = (signal) => {
  // The first stop counts; a SIGHUP (a reload asked for) is kept only if nothing else was.
  if (heard === null || heard === 'SIGHUP') heard = signal;
};
for (const s of HELD) process.on(s, hold);

globalThis[Symbol.for('slagate.heldStopSignal')] = () => {
  for (const s of HELD) process.off(s, hold);
  const s = heard;
  heard = null;
  return s;
};
