import { describe, expect, it } from 'vitest';
import { blockHashes, hashBlock, ROOT_HASH } from '../../src/prompt/chain-hash.ts';
import { BlockPool, NO_BLOCK } from '../../src/sim/engine/kv-cache.ts';

describe('BlockPool', () => {
  it('never hands out the null block and allocates from the head in id order', () => {
    const pool = new BlockPool(5, 16);
    expect(pool.numFree).toBe(4);
    expect([pool.allocate(), pool.allocate(), pool.allocate(), pool.allocate()]).toEqual([1, 2, 3, 4]);
    expect(pool.allocate()).toBe(NO_BLOCK);
    expect(pool.usage()).toBe(1);
  });

  it('keeps freed blocks hittable and counts them as free', () => {
    const pool = new BlockPool(8, 16);
    const blocks = [pool.allocate(), pool.allocate(), pool.allocate()];
    for (const [i, b] of blocks.entries()) pool.cache(b, 1000 + i);
    expect(pool.usage()).toBeCloseTo(3 / 7, 10);
    pool.releaseAll(blocks);
    expect(pool.numFree).toBe(7);
    expect(pool.usage()).toBe(0);
    expect([pool.lookup(1000), pool.lookup(1001), pool.lookup(1002)]).toEqual(blocks);
    expect(pool.longestHit([1000, 1001, 1002, 1003], 10)).toBe(3);
    expect(pool.longestHit([1000, 1001, 1002], 2)).toBe(2);
    expect(pool.longestHit([1000, 4242, 1002], 3)).toBe(1);
  });

  it('a hash held by two blocks stays hittable while either copy lives: evicting the older keeps the newer', () => {
    const pool = new BlockPool(4, 16); // usable blocks 1..3
    const old = pool.allocate();
    pool.cache(old, 777);
    pool.release(old); // free, hittable, first in line to be evicted
    const live = pool.allocate(); // a request computing the same block again, still running
    pool.cache(live, 777);
    expect(pool.allocate()).toBe(3);
    expect(pool.allocate()).toBe(old); // the older copy is evicted
    expect(pool.lookup(777)).toBe(live);
    expect(pool.longestHit([777], 1)).toBe(1);
    // The other way round: the copy registered later is freed and evicted while the first lives.
    const p2 = new BlockPool(4, 16);
    const first = p2.allocate();
    p2.cache(first, 888); // a long decode's prompt block, in use throughout
    const second = p2.allocate();
    p2.cache(second, 888); // a shorter request with the same prompt and seed
    p2.release(second);
    expect(p2.allocate()).toBe(3);
    expect(p2.allocate()).toBe(second);
    expect(p2.lookup(888)).toBe(first);
    // Gone with its last copy.
    p2.release(first);
    expect(p2.allocate()).toBe(first);
    expect(p2.lookup(888)).toBe(NO_BLOCK);
  });

  it('a block registered under another hash gives up the first', () => {
    const pool = new BlockPool(4, 16);
    const b = pool.allocate();
    pool.cache(b, 1);
    pool.cache(b, 2);
    expect(pool.lookup(1)).toBe(NO_BLOCK);
    expect(pool.lookup(2)).toBe(b);
  });

  it('evicts head-first: untouched free blocks, then a released request from its deepest block', () => {
    const pool = new BlockPool(7, 16); // usable blocks 1..6
    const req = [pool.allocate(), pool.allocate(), pool.allocate()]; // 1, 2, 3
    for (const [i, b] of req.entries()) pool.cache(b, 500 + i);
    pool.releaseAll(req); // free queue: 4 5 6 | 3 2 1
    expect([pool.allocate(), pool.allocate(), pool.allocate()]).toEqual([4, 5, 6]);
    expect(pool.longestHit([500, 501, 502], 3)).toBe(3);
    expect(pool.allocate()).toBe(3);
    expect(pool.lookup(502)).toBe(NO_BLOCK);
    expect(pool.longestHit([500, 501, 502], 3)).toBe(2);
    expect(pool.allocate()).toBe(2);
    expect(pool.longestHit([500, 501, 502], 3)).toBe(1);
  });

  it('a hit touches the block out of the free queue and back to the tail on release', () => {
    const pool = new BlockPool(5, 16); // usable 1..4
    const a = [pool.allocate(), pool.allocate()]; // 1, 2
    pool.cache(a[0]!, 7);
    pool.releaseAll(a); // free: 3 4 2 1
    pool.touch(pool.lookup(7)); // block 1 leaves the queue
    expect(pool.refCountOf(1)).toBe(1);
    expect(pool.numFree).toBe(3);
    expect([pool.allocate(), pool.allocate(), pool.allocate(), pool.allocate()]).toEqual([3, 4, 2, NO_BLOCK]);
    expect(pool.lookup(7)).toBe(1);
    pool.touch(1); // shared by a second request
    pool.release(1);
    expect(pool.numFree).toBe(0);
    pool.release(1);
    expect(pool.numFree).toBe(1);
    expect(pool.allocate()).toBe(1);
    expect(pool.lookup(7)).toBe(NO_BLOCK);
  });

  it('clear() forgets every hash', () => {
    const pool = new BlockPool(4, 16);
    const b = pool.allocate();
    pool.cache(b, 99);
    pool.release(b);
    pool.clear();
    expect(pool.lookup(99)).toBe(NO_BLOCK);
    expect(pool.numFree).toBe(3);
  });
});

describe('block hashes', () => {
  const tokens = Array.from({ length: 2000 }, (_, i) => (i * 7919) % 100000);

  it('hashes only full blocks and chains each on its parent', () => {
    const h = blockHashes(tokens.slice(0, 47), 16);
    expect(h).toHaveLength(2);
    expect(h[0]).toBe(hashBlock(ROOT_HASH, tokens, 0, 16));
    expect(h[1]).toBe(hashBlock(h[0]!, tokens, 16, 16));
    // The same 16 tokens under a different parent hash differently.
    expect(hashBlock(ROOT_HASH, tokens, 16, 16)).not.toBe(h[1]);
    for (const x of h) expect(Number.isSafeInteger(x)).toBe(true);
  });

  it('shares a prefix chain exactly as far as the tokens agree', () => {
    const other = [...tokens];
    other[1000] = (other[1000]! + 1) % 100000; // inside block 62
    const a = blockHashes(tokens, 16);
    const b = blockHashes(other, 16);
    expect(a).toHaveLength(125);
    expect(b.slice(0, 62)).toEqual(a.slice(0, 62));
    for (let i = 62; i < 125; i++) expect(b[i]).not.toBe(a[i]);
  });

  it('extends an existing chain incrementally', () => {
    const full = blockHashes(tokens, 16);
    const part = blockHashes(tokens.slice(0, 800), 16);
    expect(blockHashes(tokens, 16, part)).toEqual(full);
  });

  it('has no collisions over many distinct blocks', () => {
    const seen = new Set<number>();
    const buf = new Int32Array(16);
    for (let i = 0; i < 50000; i++) {
      buf[i % 16] = i;
      seen.add(hashBlock(ROOT_HASH, buf, 0, 16));
    }
    expect(seen.size).toBe(50000);
  });
});
