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
    // A 150 ms stall in the first window (as a start-up's compiling is): the next tick is about
    // 140 ms late, and the estimate takes half of it.
    hold(150);
    const first = await d.nextWindow();
    expect(first).toBeGreaterThanOrEqual(60);
    expect(first).toBeLessThan(120);
    expect(d.ms()).toBe(first);
  });

  it('a loop held busy raises the estimate, and it decays once the loop is free', async () => {
    const d = new LoopDelay();
    open.push(d);
    await d.nextWindow();
    // One 150 ms stall: the next tick is about 140 ms late, the largest lateness of its window,
    // which the estimate takes at half weight; one free window later it still carries a quarter.
    hold(150);
    await d.nextWindow();
    const after = await d.nextWindow();
    expect(after).toBeGreaterThanOrEqual(25);
    expect(d.ms()).toBe(after);
    // Free windows halve it each time: within five it is under half of where it was.
    let ms = after;
    for (let i = 0; i < 5; i++) ms = await d.nextWindow();
    expect(ms).toBeLessThan(after / 2);
  });
});
