// The prefix index (src/state/prefix-index.ts): what a backend is believed to hold, learnt from
// dispatch, bounded and aged out least-recently-used.
import { describe, expect, it } from 'vitest';
import {
  MAX_RECENT_BLOCKS,
  MAX_TOLD_BLOCKS,
  MIN_WEIGHT,
  PrefixIndex,
  SHARE_EVERY_MS,
} from '../../src/state/prefix-index.ts';

/** A chain of `n` distinct hashes starting at `from` (the values are opaque to the index). */
const chain = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

describe('PrefixIndex', () => {
  it('matches the leading blocks a backend was sent, per backend', () => {
    const idx = new PrefixIndex();
    const system = chain(1, 30);
    idx.insert('a', [...system, ...chain(1000, 5)]);
    // Another question after the same system prompt: its 30 leading blocks are held on a only.
    const other = [...system, ...chain(2000, 5)];
    expect(idx.match('a', other)).toBe(30);
    expect(idx.match('b', other)).toBe(0);
    expect(idx.match('a', [...system, ...chain(1000, 5)])).toBe(35);
    expect(idx.match('a', chain(9000, 3))).toBe(0);
    expect(idx.match('a', [])).toBe(0);
  });

  it('counts each block at its weight against the capacity; a peer tells no weight, so a held block keeps its own', () => {
    const idx = new PrefixIndex(() => 1_000);
    idx.insert('a', chain(1, 50), 10); // 500 of 1,000
    idx.insert('a', chain(100, 10), 40); // 400 more: 900
    expect([idx.size('a'), idx.held('a')]).toEqual([60, 900]);
    // 5 blocks of 40: 200 more, so the 10 least recent of weight 10 go (the chain's last 10).
    idx.insert('a', chain(200, 5), 40);
    expect([idx.size('a'), idx.held('a')]).toEqual([55, 1_000]);
    expect(idx.match('a', chain(1, 50))).toBe(40);
    // A peer's blocks: new ones weigh what it is given, a held one keeps its weight.
    idx.insertPeer('a', [...chain(100, 10), 300], 10);
    expect(idx.held('a')).toBe(1_000);
    expect(idx.size('a')).toBe(55); // 300 in, the least recent of weight 10 out
    // Sent again from here, a held block takes the weight it is sent with.
    idx.insert('a', [300], 100);
    expect(idx.match('a', [300])).toBe(1);
    expect(idx.held('a')).toBeLessThanOrEqual(1_000);
    // A weight that is no number counts as 1; one below MIN_WEIGHT as MIN_WEIGHT: memory stays bounded.
    const tiny = new PrefixIndex(() => 10);
    tiny.insert('a', chain(1, 5_000), 0);
    expect(tiny.size('a')).toBe(10 / MIN_WEIGHT);
    tiny.insert('b', chain(1, 50), Number.NaN);
    expect(tiny.size('b')).toBe(10);
  });

  it('stays within its capacity under a stream of unique prompts', () => {
    const idx = new PrefixIndex(() => 500);
    for (let i = 0; i < 2000; i++) {
      idx.insert('a', chain(i * 1000, 40));
      expect(idx.size('a')).toBeLessThanOrEqual(500);
    }
    expect(idx.size('a')).toBe(500);
  });

  it('ages out a prefix nobody sends any more: it stops matching', () => {
    const idx = new PrefixIndex(() => 200);
    const hot = chain(1, 50);
    idx.insert('a', hot);
    // Re-sent regularly, the hot prefix stays while others churn past it.
    for (let i = 0; i < 30; i++) {
      idx.insert('a', chain(10_000 + i * 100, 40));
      if (i % 3 === 0) idx.insert('a', hot);
    }
    expect(idx.match('a', hot)).toBe(50);
    // Not sent again: gone once more than the capacity has been inserted after it.
    for (let i = 0; i < 10; i++) idx.insert('a', chain(50_000 + i * 100, 40));
    expect(idx.match('a', hot)).toBe(0);
  });

  it('evicts a chain from its tail first, so what is left of it is still its prefix', () => {
    const idx = new PrefixIndex(() => 60);
    const conv = chain(1, 50);
    idx.insert('a', conv);
    idx.insert('a', chain(5000, 20)); // 10 over: the 10 least recent go, conv's last 10
    expect(idx.match('a', conv)).toBe(40);
  });

  it('tells its peers every block it sends, once per SHARE_EVERY_MS, in chain order', () => {
    let now = 0;
    const idx = new PrefixIndex(undefined, () => now);
    idx.record(true);
    const system = chain(1, 10);
    idx.insert('a', [...system, 100, 101]);
    idx.insert('a', [...system, 200]);
    idx.insert('b', system);
    expect(idx.drainRecent()).toEqual(
      new Map([
        ['a', [...system, 100, 101, 200]],
        ['b', system],
      ]),
    );
    expect(idx.drainRecent().size).toBe(0);
    // Sent again soon after: only what was not told yet goes.
    now += SHARE_EVERY_MS - 1;
    idx.insert('a', [...system, 300]);
    expect(idx.drainRecent()).toEqual(new Map([['a', [300]]]));
    // A use later than that is told again, although nothing in it is new on the backend: a peer
    // that heard only of the first use would age the prefix out while the backend keeps it warm.
    now += 1;
    idx.insert('a', [...system, 300]);
    expect(idx.drainRecent()).toEqual(new Map([['a', system]]));
  });

  it('a wall clock stepped back does not hold back what is due to be told', () => {
    let now = 1_000_000;
    const idx = new PrefixIndex(undefined, () => now);
    idx.record(true);
    const system = chain(1, 10);
    idx.insert('a', system);
    expect(idx.drainRecent()).toEqual(new Map([['a', system]]));
    // NTP steps the clock back a minute; the prefix is used again well after SHARE_EVERY_MS.
    now -= 60_000;
    idx.insert('a', system);
    expect(idx.drainRecent()).toEqual(new Map([['a', system]]));
    // And from the new time on, once per SHARE_EVERY_MS as before.
    now += SHARE_EVERY_MS - 1;
    idx.insert('a', system);
    expect(idx.drainRecent().size).toBe(0);
  });

  it('what a peer told of is learnt and not told on until it is due again', () => {
    let now = 0;
    const idx = new PrefixIndex(undefined, () => now);
    idx.record(true);
    idx.insertPeer('c', chain(300, 4));
    expect(idx.match('c', chain(300, 4))).toBe(4);
    expect(idx.drainRecent().size).toBe(0);
    // Sent from here as well: the peer has just told everyone, so nothing goes yet;
    idx.insert('c', chain(300, 4));
    expect(idx.drainRecent().size).toBe(0);
    // later, this instance's use is news.
    now += SHARE_EVERY_MS;
    idx.insert('c', chain(300, 4));
    expect(idx.drainRecent()).toEqual(new Map([['c', chain(300, 4)]]));
  });

  it('tells nothing of blocks evicted before the drain', () => {
    const idx = new PrefixIndex(() => 10);
    idx.record(true);
    idx.insert('a', chain(1, 10));
    idx.insert('a', chain(100, 10)); // evicts the first chain from the index
    expect(idx.drainRecent()).toEqual(new Map([['a', chain(100, 10)]]));
  });

  it('with no drain (the store unreachable), keeps a bounded backlog of the newest blocks sent', () => {
    const half = MAX_RECENT_BLOCKS / 2;
    const big = new PrefixIndex(() => 4 * MAX_RECENT_BLOCKS);
    big.record(true);
    const a = chain(0, half);
    const b = chain(10_000_000, 5);
    const c = chain(20_000_000, half - 5);
    const d = chain(30_000_000, 5);
    for (const hashes of [a, b, c, d]) big.insert('x', hashes);
    // a filled one half; b started the next; c filled it; d started a third, and a, the oldest,
    // went. The local index learnt every one of them. Of what is kept, one drain tells the newest
    // MAX_TOLD_BLOCKS: d, and the end of what came before it, whole lists only (c, then b, do not
    // fit), so here d alone.
    expect(big.match('x', a)).toBe(half);
    expect(big.drainRecent()).toEqual(new Map([['x', d]]));
    // One request over half the bound is never kept for telling (the index still learns it).
    const huge = chain(40_000_000, half + 1);
    big.insert('x', huge);
    expect(big.match('x', huge)).toBe(half + 1);
    expect(big.drainRecent()).toEqual(new Map());
  });

  it('one drain tells at most MAX_TOLD_BLOCKS, the newest; the rest is told at its next use', () => {
    const idx = new PrefixIndex(() => 4 * MAX_TOLD_BLOCKS);
    idx.record(true);
    const third = MAX_TOLD_BLOCKS / 2;
    const [p, q, r] = [0, 1, 2].map((k) => chain(k * 10_000_000, third));
    for (const hashes of [p, q, r]) idx.insert('x', hashes!);
    // q and r fill the bound exactly; p, the oldest, waits.
    expect(idx.drainRecent()).toEqual(new Map([['x', [...q!, ...r!]]]));
    // Not marked told: sent again, it is told now.
    idx.insert('x', p!);
    expect(idx.drainRecent()).toEqual(new Map([['x', p]]));
  });

  it('forgets a removed backend', () => {
    const idx = new PrefixIndex();
    idx.insert('a', chain(1, 5));
    idx.drop('a');
    expect(idx.match('a', chain(1, 5))).toBe(0);
    expect(idx.size('a')).toBe(0);
  });
});
