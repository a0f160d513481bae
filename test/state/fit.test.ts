import { describe, expect, it } from 'vitest';
import { DecayingFit, FitStats, PooledSpread, predict } from '../../src/state/fit.ts';
import { rng } from '../helpers/rng.ts';

describe('online least squares', () => {
  it('recovers a known prefill rate and load slope from noisy samples', () => {
    const rand = rng(11);
    const s = new FitStats(2);
    // 20 ms base, 0.125 ms per uncached token (8000 tok/s), 4 ms per in-flight request, ±5% noise.
    for (let i = 0; i < 2000; i++) {
      const tokens = Math.floor(rand() * 4000);
      const load = Math.floor(rand() * 32);
      const y = (20 + 0.125 * tokens + 4 * load) * (1 + (rand() - 0.5) * 0.1);
      s.addSample([tokens, load], y);
    }
    const c = s.solve(3);
    expect(c).not.toBeNull();
    expect(c?.slopes[0]).toBeCloseTo(0.125, 2);
    expect(c?.slopes[1]).toBeGreaterThan(3.6);
    expect(c?.slopes[1]).toBeLessThan(4.4);
    expect(c?.intercept).toBeGreaterThan(10);
    expect(c?.intercept).toBeLessThan(30);
    expect(c?.samples).toBe(2000);
  });

  it('needs a minimum number of samples', () => {
    const s = new FitStats(1);
    s.addSample([1], 10);
    s.addSample([2], 12);
    expect(s.solve(3)).toBeNull();
    s.addSample([3], 14);
    expect(s.solve(3)?.slopes[0]).toBeCloseTo(2, 6);
  });

  it('a prior lends the pool’s slopes at the fit’s own means, at a capped weight, never samples or errors', () => {
    // Two backends with the same rate, 0.1 ms per token, but other bases and prompt sizes.
    const a = new FitStats(1);
    for (let t = 0; t < 100; t++) a.addSample([2000 + 40 * t], 20 + 0.1 * (2000 + 40 * t));
    const b = new FitStats(1);
    for (let t = 0; t < 100; t++) b.addSample([200 + 10 * t], 200 + 0.1 * (200 + 10 * t));
    const pool = new PooledSpread(1);
    pool.add(a);
    pool.add(b);
    // Raw sums of both read their difference in base as part of the slope: about 0.057, not 0.1.
    const raw = new FitStats(1);
    raw.addStats(a);
    raw.addStats(b);
    expect(raw.solve(3)?.slopes[0]).toBeLessThan(0.08);
    expect(pool.weight).toBe(200);

    const own = new FitStats(1);
    for (let i = 0; i < 3; i++) own.addSample([6000], 900);
    own.addError(0.5);
    own.addError(-0.1);
    expect(own.solve(3)?.slopes[0]).toBe(0); // alone: no slope to see
    const before = own.error();
    own.addPrior(pool, 10);
    const c = own.solve(3)!;
    expect(c.slopes[0]).toBeCloseTo(0.1, 9);
    expect(predict(c, [6000])).toBeCloseTo(900, 6); // its own level
    expect(c.samples).toBe(3);
    expect(own.v[0]).toBeCloseTo(13, 9);
    expect(own.error()).toEqual(before);
    // A pool lighter than the weight asked is added in full, not scaled up.
    const light = new PooledSpread(1);
    const two = new FitStats(1);
    two.addSample([0], 0);
    two.addSample([1000], 50);
    light.add(two);
    const other = new FitStats(1);
    other.addSample([500], 30);
    other.addPrior(light, 10);
    expect(other.v[0]).toBe(3);
  });

  it('a pool of sums decayed for hours has the same spread per unit of weight (no underflow)', () => {
    const src = new FitStats(1);
    for (let t = 0; t < 50; t++) src.addSample([100 * t], 500 + 0.1 * 100 * t);
    const fresh = new PooledSpread(1);
    fresh.add(src);
    src.scale(2 ** -560); // 560 half-lives: about nine hours at the default 60 s
    const old = new PooledSpread(1);
    old.add(src);
    const perWeight = (p: PooledSpread) => [(p.cxx[0] as number) / p.weight, (p.cxy[0] as number) / p.weight];
    const [fx, fy] = perWeight(fresh);
    const [ox, oy] = perWeight(old);
    expect((ox as number) / (fx as number)).toBeCloseTo(1, 9);
    expect((oy as number) / (fy as number)).toBeCloseTo(1, 9);
  });

  it('a feature that never varied gets slope 0 and the intercept carries the mean', () => {
    const s = new FitStats(2);
    for (const t of [100, 200, 300, 400]) s.addSample([t, 5], 10 + 0.5 * t);
    const c = s.solve(3);
    expect(c?.slopes[0]).toBeCloseTo(0.5, 6);
    expect(c?.slopes[1]).toBe(0);
    expect(predict(c!, [250, 5])).toBeCloseTo(135, 6);
  });

  it('a negative slope is dropped rather than predicting faster service under more load', () => {
    const s = new FitStats(1);
    for (const [load, y] of [
      [0, 30],
      [10, 29],
      [20, 28],
    ]) {
      s.addSample([load as number], y as number);
    }
    const c = s.solve(3);
    expect(c?.slopes[0]).toBe(0);
    expect(c?.intercept).toBeCloseTo(29, 9);
  });

  it('sums from two instances combine into the fit over all samples', () => {
    const rand = rng(5);
    const a = new FitStats(2);
    const b = new FitStats(2);
    const all = new FitStats(2);
    for (let i = 0; i < 400; i++) {
      const x = [Math.floor(rand() * 3000), Math.floor(rand() * 16)];
      const y = 15 + 0.2 * (x[0] as number) + 2 * (x[1] as number) + rand() * 5;
      (i % 3 === 0 ? a : b).addSample(x, y);
      all.addSample(x, y);
    }
    const merged = new FitStats(2);
    expect(merged.addEncoded(a.encode())).toBe(true);
    expect(merged.addEncoded(b.encode())).toBe(true);
    const m = merged.solve(3)!;
    const w = all.solve(3)!;
    expect(m.slopes[0]).toBeCloseTo(w.slopes[0] as number, 6);
    expect(m.slopes[1]).toBeCloseTo(w.slopes[1] as number, 6);
    expect(m.intercept).toBeCloseTo(w.intercept, 4);
    expect(merged.addEncoded([1, 2])).toBe(false);
  });

  it('forgets by half-life: after a change of rate the fit follows the new samples', () => {
    const fit = new DecayingFit(1, 1_000);
    let t = 0;
    for (let i = 0; i < 50; i++, t += 20) {
      fit.decayTo(t);
      fit.stats.addSample([i % 10], 10 + 1 * (i % 10));
    }
    for (let i = 0; i < 50; i++, t += 200) {
      fit.decayTo(t);
      fit.stats.addSample([i % 10], 10 + 3 * (i % 10));
    }
    // The old samples are ~10 half-lives old: their weight is about a thousandth.
    expect(fit.stats.solve(3)?.slopes[0]).toBeGreaterThan(2.9);
    expect(fit.decayFactor(1_000)).toBeCloseTo(0.5, 9);
    // Decay keeps the sample count, which gates predictions.
    expect(fit.stats.samples).toBe(100);
  });

  it('a wall clock stepped back: the sums age from the new time, not held until the old one comes again', () => {
    const fit = new DecayingFit(1, 1_000);
    fit.decayTo(3_600_000);
    for (let i = 0; i < 10; i++) fit.stats.addSample([i], i);
    // Stepped back an hour. One half-life later by the new clock the samples weigh half.
    fit.decayTo(0);
    fit.decayTo(1_000);
    expect(fit.stats.v[0]).toBeCloseTo(5, 9);
  });

  it('reports prediction error as mean absolute and signed relative error', () => {
    const s = new FitStats(1);
    s.addError(0.1);
    s.addError(-0.3);
    const e = s.error();
    expect(e.mape).toBeCloseTo(0.2, 9);
    expect(e.bias).toBeCloseTo(-0.1, 9);
    expect(new FitStats(1).error().mape).toBeNull();
  });
});
