// The summary's percentiles in bounded memory (src/cli/quantile-sketch.ts): each within its stated
// accuracy of the exact percentile, and the memory set by the values' range, not their number.
import { describe, expect, it } from 'vitest';
import { ACCURACY, QuantileSketch } from '../../src/cli/quantile-sketch.ts';
import { Rng } from '../../src/sim/rng.ts';

/** numpy's default percentile (linear between closest ranks) of sorted values: the reference. */
function exact(sorted: Float64Array, p: number): number {
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const a = sorted[lo] as number;
  return a + ((sorted[Math.ceil(rank)] as number) - a) * (rank - lo);
}

describe('QuantileSketch', () => {
  it('reads every percentile to within its accuracy of the exact one', () => {
    const rng = new Rng(7);
    const sketch = new QuantileSketch();
    const values = new Float64Array(200_000);
    for (let i = 0; i < values.length; i++) {
      // Latency-like: log-normal around 200 ms, two decades either way.
      values[i] = Math.exp(Math.log(200) + 1.2 * rng.normal());
      sketch.add(values[i] as number);
    }
    values.sort();
    const ps = [0, 1, 10, 50, 90, 99, 99.9, 100];
    const got = sketch.percentiles(ps);
    ps.forEach((p, i) => {
      const want = exact(values, p);
      expect(Math.abs((got[i] as number) / want - 1)).toBeLessThanOrEqual(ACCURACY);
    });
    expect(sketch.count).toBe(values.length);
  });

  it("holds as many buckets as the values' range needs, however many values come", () => {
    const rng = new Rng(11);
    const sketch = new QuantileSketch();
    // Four decades (1 ms to 10 s): at most ln(10^4) / ln(γ) + 1 buckets.
    const bound = Math.ceil(Math.log(1e4) / Math.log((1 + ACCURACY) / (1 - ACCURACY))) + 1;
    const draw = () => 10 ** (4 * rng.next());
    for (let i = 0; i < 100_000; i++) sketch.add(draw());
    const after100k = sketch.size;
    expect(after100k).toBeLessThanOrEqual(bound);
    for (let i = 0; i < 400_000; i++) sketch.add(draw());
    expect(sketch.size).toBeLessThanOrEqual(bound);
    expect(sketch.count).toBe(500_000);
  });

  it('counts zeros (a queue wait of 0) as 0 exactly, and has no percentile before a value', () => {
    const sketch = new QuantileSketch();
    expect(sketch.percentiles([50, 99])).toEqual([null, null]);
    for (const v of [0, 0, 0, 10]) sketch.add(v);
    const [p50, p100] = sketch.percentiles([50, 100]);
    expect(p50).toBe(0);
    expect(Math.abs((p100 as number) / 10 - 1)).toBeLessThanOrEqual(ACCURACY);
    // Between a zero and a value, interpolated as numpy does: rank 2.7 of 0, 0, 0, 10.
    const [p90] = sketch.percentiles([90]);
    expect(Math.abs((p90 as number) / 7 - 1)).toBeLessThanOrEqual(ACCURACY);
  });
});
