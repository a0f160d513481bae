// A one-line progress bar for long runs. It draws only on a terminal: piped or redirected
// output (CI logs, `> result.txt`) stays free of control characters.

export interface Progress {
  /** One request finished. */
  tick(success: boolean): void;
  /** Erase the bar; idempotent. */
  done(): void;
}

const SILENT: Progress = { tick() {}, done() {} };
const REDRAW_MS = 100;
const WIDTH = 30;

/** total = null when the run is bounded by time only. */
export function createProgress(
  total: number | null,
  stream: NodeJS.WriteStream = process.stderr,
  now: () => number = () => performance.now(),
): Progress {
  if (!stream.isTTY) return SILENT;
  const started = now();
  let finished = 0;
  let failed = 0;
  let lastDraw = Number.NEGATIVE_INFINITY;
  let open = true;
  const draw = () => {
    const elapsed = (now() - started) / 1000;
    const rate = elapsed > 0 ? finished / elapsed : 0;
    const bar =
      total === null
        ? ''
        : `[${'#'.repeat(Math.round((finished / Math.max(total, 1)) * WIDTH)).padEnd(WIDTH, '.')}] `;
    const count = total === null ? `${finished}` : `${finished}/${total}`;
    const fails = failed > 0 ? ` ${failed} failed` : '';
    stream.write(`\r\x1b[2K${bar}${count} ${elapsed.toFixed(1)}s ${rate.toFixed(1)} req/s${fails}`);
  };
  return {
    tick(success) {
      if (!open) return;
      finished++;
      if (!success) failed++;
      const t = now();
      if (t - lastDraw >= REDRAW_MS || finished === total) {
        lastDraw = t;
        draw();
      }
    },
    done() {
      if (!open) return;
      open = false;
      stream.write('\r\x1b[2K');
    },
  };
}
