import { describe, expect, it } from 'vitest';
import { Rng } from '../../src/sim/rng.ts';
import { HashSlots } from '../../src/state/hash-slots.ts';

/** Applies the same random operations to a HashSlots and a Map, checking they agree at every step. */
function agreeWithMap(keys: number[], ops: number, seed: number, maxLive = Infinity): HashSlots {
  const rng = new Rng(seed);
  const t = new HashSlots(4); // small: it grows, and runs wrap around the table's end
  const m = new Map<number, number>();
  for (let n = 0; n < ops; n++) {
    const k = keys[rng.int(0, keys.length - 1)]!;
    const op = rng.int(0, 2);
    if (op === 0 && (m.has(k) || m.size < maxLive)) {
      t.set(k, n);
      m.set(k, n);
    } else if (op === 1) {
      expect(t.delete(k)).toBe(m.delete(k));
    }
    expect(t.get(k)).toBe(m.get(k) ?? -1);
    expect(t.size).toBe(m.size);
  }
  for (const k of keys) expect(t.get(k), `key ${k}`).toBe(m.get(k) ?? -1);
  return t;
}

describe('HashSlots', () => {
  it('agrees with a Map under random sets and deletes of 53-bit chain hashes', () => {
    const rng = new Rng(7);
    const keys = Array.from(
      { length: 300 },
      () => rng.int(0, 2 ** 21 - 1) * 2 ** 32 + rng.int(0, 2 ** 32 - 1),
    );
    agreeWithMap(keys, 20_000, 1);
  });

  it('agrees with a Map when keys differ only in a few bits (long probe runs, deletes inside them)', () => {
    // Low halves equal, high halves close; and low halves close, high halves equal.
    const keys = [
      ...Array.from({ length: 40 }, (_, i) => i * 2 ** 32 + 12345),
      ...Array.from({ length: 40 }, (_, i) => 77 * 2 ** 32 + i),
      0,
      2 ** 53 - 1,
    ];
    agreeWithMap(keys, 20_000, 2);
  });

  it('agrees with a Map in a table that never grows, where probe runs wrap around its end', () => {
    // At most 8 held in the smallest table (16 slots): every run is short and many cross slot 15.
    const rng = new Rng(3);
    for (let seed = 0; seed < 20; seed++) {
      const keys = Array.from({ length: 24 }, () => rng.int(0, 2 ** 53 - 1));
      agreeWithMap(keys, 2_000, seed, 8);
    }
  });

  it('keeps every entry across growth, and frees what is deleted', () => {
    const t = new HashSlots(1);
    for (let i = 0; i < 10_000; i++) t.set(i * 7919 * 2 ** 20 + i, i);
    expect(t.size).toBe(10_000);
    for (let i = 0; i < 10_000; i += 2) expect(t.delete(i * 7919 * 2 ** 20 + i)).toBe(true);
    expect(t.size).toBe(5_000);
    for (let i = 0; i < 10_000; i++) expect(t.get(i * 7919 * 2 ** 20 + i)).toBe(i % 2 === 0 ? -1 : i);
    expect(t.delete(3.5)).toBe(false);
  });

  it('ignores a hash that is not a non-negative number instead of corrupting the table', () => {
    const t = new HashSlots();
    t.set(-1, 5);
    t.set(Number.NaN, 6);
    expect(t.size).toBe(0);
    expect(t.get(-1)).toBe(-1);
    t.set(1, 9);
    expect(t.get(1)).toBe(9);
    expect(t.get(-1)).toBe(-1);
  });
});
