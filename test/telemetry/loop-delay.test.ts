// The gateway's own event-loop delay (src/telemetry/loop-delay.ts): a loop held busy shows up in
// the estimate within a window or two, and the estimate falls again once the loop is free.
import { afterEach, describe, expect, it } from 'vitest';
import { LoopDelay } from '../../src/telemetry/loop-delay.ts';

const open: LoopDelay[] = [];
afterEach(() => {
  for (const d of open.splice(0)) d.close();
});

/** Holds the event loop for `ms` (what a long synchronous task does to every ready callback). */
function hold(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // busy
  }
}

describe('LoopDelay', () => {
  it('is null before any window has closed; its first window counts half, against an idle loop', async () => {
    const d = new LoopDelay();
    open.push(d);
    expect(d.ms()).toBeNull();
    // A 400 ms stall in the first window (as a start-up's compiling is): the next tick is about
    // 390 ms late, and the estimate takes half of it (the bounds leave room for a loaded machine's
    // own lateness, which only adds).
    hold(400);
    const first = await d.nextWindow();
    expect(first).toBeGreaterThanOrEqual(170);
    expect(first).toBeLessThan(300);
    expect(d.ms()).toBe(first);
  });

  it('a loop held busy raises the estimate, and it decays once the loop is free', async () => {
    const d = new LoopDelay();
    open.push(d);
    await d.nextWindow();
    // One 400 ms stall: the next tick is about 390 ms late, the largest lateness of its window,
    // which the estimate takes at half weight; one free window later it still carries a quarter.
    // (A stall this large keeps a loaded machine's own lateness of tens of ms from deciding.)
    hold(400);
    await d.nextWindow();
    const after = await d.nextWindow();
    expect(after).toBeGreaterThanOrEqual(80);
    expect(d.ms()).toBe(after);
    // Free windows halve it each time: within five it is under half of where it was.
    let ms = after;
    for (let i = 0; i < 5; i++) ms = await d.nextWindow();
    expect(ms).toBeLessThan(after / 2);
  });
});
