import { describe, expect, it } from 'vitest';
import { arrivalOffsets } from '../../src/bench/arrivals.ts';
import { Rng } from '../../src/sim/rng.ts';

function gaps(offsets: number[]): number[] {
  return offsets.map((t, i) => t - (i === 0 ? 0 : (offsets[i - 1] as number)));
}

function cv(xs: number[]): number {
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  const variance = xs.reduce((a, b) => a + (b - mean) ** 2, 0) / xs.length;
  return Math.sqrt(variance) / mean;
}

describe('arrivalOffsets', () => {
  it('rescales so the last arrival is exactly N / rate, hence mean rate = rate', () => {
    const offsets = arrivalOffsets(500, 20, 1, new Rng(1));
    expect(offsets).toHaveLength(500);
    expect(offsets.at(-1)).toBeCloseTo(500 / 20, 9);
    const g = gaps(offsets);
    expect(g.reduce((a, b) => a + b, 0) / g.length).toBeCloseTo(1 / 20, 9);
    for (const x of g) expect(x).toBeGreaterThanOrEqual(0);
  });

  it('burstiness sets the coefficient of variation of the gaps (1/sqrt(shape) for a gamma)', () => {
    const at = (b: number) => cv(gaps(arrivalOffsets(4000, 10, b, new Rng(3))));
    const poisson = at(1);
    const bursty = at(0.25);
    const smooth = at(4);
    expect(poisson).toBeGreaterThan(0.9);
    expect(poisson).toBeLessThan(1.1);
    expect(bursty).toBeGreaterThan(1.7); // expected 2
    expect(smooth).toBeLessThan(0.6); // expected 0.5
    expect(bursty).toBeGreaterThan(poisson);
    expect(poisson).toBeGreaterThan(smooth);
  });

  it('infinite burstiness gives evenly spaced arrivals', () => {
    const g = gaps(arrivalOffsets(10, 4, Number.POSITIVE_INFINITY, new Rng(1)));
    for (const x of g) expect(x).toBeCloseTo(0.25, 12);
  });

  it('an infinite rate sends everything at t = 0', () => {
    expect(arrivalOffsets(5, Number.POSITIVE_INFINITY, 1, new Rng(1))).toEqual([0, 0, 0, 0, 0]);
  });

  it('is a function of the seed', () => {
    const a = arrivalOffsets(100, 5, 0.5, new Rng(42));
    expect(arrivalOffsets(100, 5, 0.5, new Rng(42))).toEqual(a);
    expect(arrivalOffsets(100, 5, 0.5, new Rng(43))).not.toEqual(a);
  });

  it('rejects impossible parameters', () => {
    expect(() => arrivalOffsets(10, 0, 1, new Rng(1))).toThrow(/rate/);
    expect(() => arrivalOffsets(10, 1, -1, new Rng(1))).toThrow(/burstiness/);
    expect(() => arrivalOffsets(1.5, 1, 1, new Rng(1))).toThrow(/whole/);
  });
});

describe('Rng.gamma', () => {
  it('has mean shape·scale and variance shape·scale², also for shape < 1', () => {
    for (const shape of [0.3, 1, 2.5]) {
      const rng = new Rng(9);
      const xs = Array.from({ length: 40000 }, () => rng.gamma(shape, 2));
      const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
      const variance = xs.reduce((a, b) => a + (b - mean) ** 2, 0) / xs.length;
      expect(mean).toBeGreaterThan(shape * 2 * 0.95);
      expect(mean).toBeLessThan(shape * 2 * 1.05);
      expect(variance).toBeGreaterThan(shape * 4 * 0.85);
      expect(variance).toBeLessThan(shape * 4 * 1.15);
    }
  });
});
