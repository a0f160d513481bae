// The control law of the per-backend limits (src/scheduler/controller.ts), step by step.
import { describe, expect, it } from 'vitest';
import {
  controlError,
  nextLimit,
  nextTpotShare,
  quantile,
  TPOT_SHARE_BOUNDS,
} from '../../src/scheduler/controller.ts';

const sp = { tpotShare: 0.8, ttftShare: 0.25 };
const bounds = { min: 4, max: 512 };
const signals = (over: Partial<Parameters<typeof nextLimit>[2]> = {}) => ({
  itlMs: 40,
  meanItlMs: null as number | null,
  tpotTargetMs: 50,
  ttftQueueShare: 0.1,
  binding: true,
  batch: null as number | null,
  ...over,
});

describe('controlError', () => {
  it('is the larger of the two ratios to their setpoints, null without any signal', () => {
    expect(controlError(signals(), sp)).toBeCloseTo(1, 9); // 40 / (0.8 × 50)
    expect(controlError(signals({ ttftQueueShare: 0.5 }), sp)).toBeCloseTo(2, 9);
    expect(controlError(signals({ itlMs: null }), sp)).toBeCloseTo(0.4, 9);
    expect(controlError(signals({ itlMs: null, ttftQueueShare: null }), sp)).toBeNull();
    // No TPOT target running on the backend: only the TTFT signal is judged.
    expect(controlError(signals({ tpotTargetMs: Number.POSITIVE_INFINITY }), sp)).toBeCloseTo(0.4, 9);
    // And with no TTFT signal either, no signal at all: not an error of 0 that grows the limit.
    expect(
      controlError(
        signals({ tpotTargetMs: Number.POSITIVE_INFINITY, meanItlMs: 60, ttftQueueShare: null }),
        sp,
      ),
    ).toBeNull();
  });

  it('the median gap is judged against the share of the target, the mean against the whole target', () => {
    // A typical step of 20 ms (half the 40 ms setpoint) among slow ones that lift the mean to 60 ms.
    expect(controlError(signals({ itlMs: 20, meanItlMs: 60, ttftQueueShare: 0 }), sp)).toBeCloseTo(1.2, 9);
    expect(controlError(signals({ itlMs: 20, meanItlMs: 45, ttftQueueShare: 0 }), sp)).toBeCloseTo(0.9, 9);
  });
});

describe('nextLimit', () => {
  it('above the setpoint: steps down from the running batch by the error, at most halving', () => {
    // e = 1.25: 200 running → 160.
    expect(nextLimit(300, 200, signals({ itlMs: 50 }), sp, bounds).limit).toBeCloseTo(160, 9);
    // e = 4: halved, not quartered.
    expect(nextLimit(300, 200, signals({ itlMs: 160 }), sp, bounds).limit).toBeCloseTo(100, 9);
    // Never up on a decrease, even if the batch is above the limit already.
    expect(nextLimit(100, 200, signals({ itlMs: 45 }), sp, bounds).limit).toBe(100);
  });

  it('the same evidence seen again asks for the same limit (decreases do not compound while draining)', () => {
    const first = nextLimit(300, 200, signals({ itlMs: 50 }), sp, bounds).limit;
    const second = nextLimit(first, 200, signals({ itlMs: 50 }), sp, bounds).limit;
    expect(second).toBe(first);
  });

  it('below the setpoint and binding: grows by 1/√e, at most 1.5×, at least +1', () => {
    // e = 0.25 → ×2 capped at ×1.5.
    expect(nextLimit(100, 100, signals({ itlMs: 10, ttftQueueShare: 0 }), sp, bounds).limit).toBe(150);
    // e = 0.81 → ×1/0.9.
    const e081 = nextLimit(100, 100, signals({ itlMs: 32.4, ttftQueueShare: 0 }), sp, bounds).limit;
    expect(e081).toBeCloseTo(100 / 0.9, 6);
    // Right at the setpoint: the +1 floor.
    expect(nextLimit(100, 100, signals({ itlMs: 40, ttftQueueShare: 0 }), sp, bounds).limit).toBe(101);
  });

  it('does not grow a limit nobody presses against, and holds without a signal', () => {
    expect(nextLimit(100, 30, signals({ itlMs: 10, binding: false }), sp, bounds).limit).toBe(100);
    expect(nextLimit(100, 100, signals({ itlMs: null, ttftQueueShare: null }), sp, bounds)).toEqual({
      limit: 100,
      error: null,
    });
  });

  it('holds the limit when the backend has emptied: the signal describes a batch that has left', () => {
    expect(nextLimit(64, 0, signals({ itlMs: 45, binding: false }), sp, bounds)).toMatchObject({ limit: 64 });
    // Nor grows, when a request was blocked on it earlier in the period.
    expect(nextLimit(64, 0, signals({ itlMs: 45, binding: true }), sp, bounds)).toMatchObject({ limit: 64 });
    // One request still running, and no batch known for the signal: the step is from it.
    expect(nextLimit(64, 1, signals({ itlMs: 45, binding: false }), sp, bounds).limit).toBe(4);
  });

  it('steps from the batch the signal was measured on when fewer requests run now (traffic ebbing)', () => {
    // e = 1.125, measured on 60 requests; 1 is left: 60 / 1.125, not 1 / 1.125 (the minimum).
    const ebb = nextLimit(64, 1, signals({ itlMs: 45, binding: false, batch: 60 }), sp, bounds);
    expect(ebb.limit).toBeCloseTo(60 / 1.125, 9);
    // More running now than the signal saw (traffic rising): the step is from those running.
    expect(nextLimit(300, 200, signals({ itlMs: 50, batch: 120 }), sp, bounds).limit).toBeCloseTo(160, 9);
    // Never above the limit: a batch the limit has since been cut below asks for no more.
    expect(nextLimit(40, 30, signals({ itlMs: 50, batch: 64 }), sp, bounds).limit).toBe(40);
    // Nothing running still holds, whatever the batch was.
    expect(nextLimit(64, 0, signals({ itlMs: 45, batch: 60 }), sp, bounds).limit).toBe(64);
  });

  it('stays within [min, max]', () => {
    expect(nextLimit(5, 5, signals({ itlMs: 200 }), sp, bounds).limit).toBe(4);
    expect(nextLimit(500, 500, signals({ itlMs: 1 }), sp, bounds).limit).toBe(512);
  });

  it('converges without overshoot on a backend whose token gap is a + b·batch', () => {
    // TPOT setpoint 0.8 × 50 = 40 ms; gap = 6 + 0.1·B reaches it at B = 340.
    let limit = 16;
    const seen: number[] = [];
    for (let period = 0; period < 60; period++) {
      const batch = limit; // demand is unlimited: the backend runs at its limit
      const step = nextLimit(
        limit,
        batch,
        signals({ itlMs: 6 + 0.1 * batch, ttftQueueShare: 0 }),
        sp,
        bounds,
      );
      limit = step.limit;
      seen.push(limit);
    }
    expect(Math.max(...seen)).toBeLessThanOrEqual(345);
    expect(limit).toBeGreaterThan(330);
    // From 16 it gets within 10% of the setpoint in a few periods (1.5× a period from far below).
    expect(seen.findIndex((l) => l > 306)).toBeLessThan(12);
  });
});

describe('nextTpotShare (outer loop)', () => {
  it('moves the share toward a P99 at 95% of the target, slowly and within its bounds', () => {
    expect(nextTpotShare(0.8, 0.95)).toBeCloseTo(0.8, 9);
    expect(nextTpotShare(0.8, 1.9)).toBeCloseTo(0.8 * (1 + 0.1 * (1 - 2)), 9);
    expect(nextTpotShare(0.8, 0.475)).toBeCloseTo(0.8 * 1.05, 9);
    expect(nextTpotShare(0.61, 10)).toBe(TPOT_SHARE_BOUNDS.min);
    expect(nextTpotShare(0.99, 0.1)).toBe(TPOT_SHARE_BOUNDS.max);
  });
});

describe('quantile', () => {
  it('is the nearest rank', () => {
    expect(quantile([5, 1, 4, 2, 3], 0.5)).toBe(3);
    expect(quantile([5, 1, 4, 2, 3], 0.9)).toBe(5);
    expect(quantile([7], 0.99)).toBe(7);
  });

  it('orders numerically, fractions and negatives included, and leaves its input as it was', () => {
    const xs = [10, -2.5, 9, 0.25, 100, 1e-3];
    expect(quantile(xs, 0)).toBe(-2.5);
    expect(quantile(xs, 0.5)).toBe(0.25);
    expect(quantile(xs, 0.99)).toBe(100);
    expect(xs).toEqual([10, -2.5, 9, 0.25, 100, 1e-3]);
  });
});
