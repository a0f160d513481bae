import { describe, expect, it } from 'vitest';
import { PrefillBacklog } from '../../src/state/prefill-backlog.ts';

describe('PrefillBacklog', () => {
  it('drains at the given rate from when the work was sent, and never below zero', () => {
    const b = new PrefillBacklog();
    b.add(7000, 1000, 0.1); // 10 tokens per ms
    expect(b.ahead(7000, 1000, 0.1)).toBe(7000);
    expect(b.ahead(7000, 1300, 0.1)).toBeCloseTo(4000, 6);
    expect(b.ahead(7000, 1700, 0.1)).toBe(0);
    expect(b.ahead(7000, 5000, 0.1)).toBe(0);
  });

  it('time with nothing left to drain earns no credit against work sent later', () => {
    const b = new PrefillBacklog();
    b.add(1000, 0, 0.1); // drained by t = 100
    b.add(2000, 1000, 0.1); // 900 ms later: all of it is ahead
    expect(b.ahead(3000, 1000, 0.1)).toBe(2000);
    expect(b.ahead(3000, 1100, 0.1)).toBeCloseTo(1000, 6);
  });

  it('is never above the exact count, and a settled request takes the backlog down to it', () => {
    const b = new PrefillBacklog();
    b.add(5000, 0, 0.1);
    b.add(5000, 0, 0.1);
    // One of the two came back at once (its first token): 5,000 are pending by the counters.
    b.settle(5000, 10, 0.1);
    expect(b.ahead(5000, 10, 0.1)).toBe(5000);
    expect(b.ahead(5000, 110, 0.1)).toBeCloseTo(4000, 6);
    // A slow rate never reports more than the counters hold.
    const slow = new PrefillBacklog();
    slow.add(800, 0, 1000);
    expect(slow.ahead(300, 5, 1000)).toBe(300);
  });

  it('without a rate nothing drains: the exact count', () => {
    const b = new PrefillBacklog();
    b.add(4000, 0, null);
    expect(b.ahead(4000, 10_000, null)).toBe(4000);
    b.add(1000, 20_000, 0);
    expect(b.ahead(5000, 30_000, 0)).toBe(5000);
  });
});
