// The tenant usage table (src/state/tenants.ts): a refunded lease's tokens leave the window, one
// that used more than its charge pays the rest as it ends, and every tenant in use is tracked
// whatever their number, idle ones making room.
import { describe, expect, it } from 'vitest';
import { TenantUsageTable } from '../../src/state/tenants.ts';

describe('TenantUsageTable', () => {
  it('a lease ended with a refund takes its tokens out of the window, once', () => {
    const table = new TenantUsageTable();
    const kept = table.lease('a', 300, 10_000);
    const refunded = table.lease('a', 200, 25_000);
    expect(table.local('a', 25_000)).toEqual({ inflight: 2, tokens: 500 });
    refunded.end(true);
    refunded.end(true);
    kept.end();
    expect(table.local('a', 25_000)).toEqual({ inflight: 0, tokens: 300 });
    // A refund after its bucket left the window takes nothing from newer tokens.
    const late = table.lease('a', 50, 30_000);
    table.lease('a', 70, 95_000).end();
    late.end(true);
    expect(table.local('a', 95_000).tokens).toBe(70);
  });

  it('a refund after the wall clock stepped back (less than the window) takes back its own tokens', () => {
    const table = new TenantUsageTable();
    table.lease('a', 100, 10_000).end();
    // The clock steps back 1.5 s: the window keeps its newest bucket, and the next lease's tokens
    // go there, not to the bucket of its own (earlier) time.
    const refunded = table.lease('a', 40, 8_500);
    expect(table.local('a', 8_600).tokens).toBe(140);
    refunded.end(true);
    expect(table.local('a', 8_600)).toEqual({ inflight: 0, tokens: 100 });
  });

  it('a lease that used more than it was charged is charged the rest as it ends, at that time', () => {
    const table = new TenantUsageTable();
    let clock = 10_000;
    const lease = table.lease('a', 300, clock, () => clock);
    clock = 40_000;
    lease.end(false, 1000);
    lease.end(false, 1000); // once
    expect(table.local('a', 40_000)).toEqual({ inflight: 0, tokens: 1000 });
    // The admission's 300 leave the window a minute after admission, the 700 a minute after the end.
    expect(table.local('a', 70_500).tokens).toBe(700);
    expect(table.local('a', 100_500).tokens).toBe(0);
    // One that used less keeps its charge (the budget counts what was asked for).
    clock = 100_500;
    table.lease('a', 300, clock, () => clock).end(false, 10);
    expect(table.local('a', 100_500).tokens).toBe(300);
  });

  it('past its size, drops idle tenants to make room, and never stops counting one in use', () => {
    const table = new TenantUsageTable({ bucketMs: 1_000, buckets: 60, sweepAt: 3 });
    const busy = ['a', 'b', 'c'].map((name) => table.lease(name, 100, 0));
    // Every slot taken by a tenant in use: a fourth is still counted (its limits still apply).
    table.lease('d', 100, 1_000);
    expect(table.local('d', 1_000)).toEqual({ inflight: 1, tokens: 100 });
    expect(table.size).toBe(4);
    // a, b and c end, and a minute later their tokens have left: idle, dropped for the next one.
    for (const l of busy) l.end();
    table.lease('e', 10, 61_500);
    expect(table.size).toBe(2);
    expect(table.local('d', 61_500)).toEqual({ inflight: 1, tokens: 0 });
    expect(table.local('e', 61_500)).toEqual({ inflight: 1, tokens: 10 });
  });
});
