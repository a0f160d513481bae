// The order requests leave the gateway's queue (src/scheduler/queue.ts).
import { describe, expect, it } from 'vitest';
import { FifoQueue, type QueueEntry, SlagateQueue } from '../../src/scheduler/queue.ts';
import type { ScheduledRequest } from '../../src/scheduler/types.ts';
import { route } from '../router/fixtures.ts';

const AGING = 1000;

function req(over: Partial<ScheduledRequest> = {}): ScheduledRequest {
  return {
    reqId: over.reqId ?? 'r',
    className: 'interactive',
    priority: 0,
    sheddable: false,
    tenant: 'anonymous',
    model: 'm',
    arrivedAt: 0,
    ttftTargetMs: 500,
    tpotTargetMs: 50,
    deadlineAt: 60_000,
    uncachedTokens: 100,
    promptTokens: 100,
    expectedOutputTokens: 100,
    noQueue: false,
    route: route(),
    predictions: new Map(),
    prefillMs: 10,
    bestBackendMs: 50,
    ...over,
    ttftBudgetMs: over.ttftBudgetMs ?? over.ttftTargetMs ?? 500,
    loopDelayMs: over.loopDelayMs ?? 0,
  };
}

function entry(q: SlagateQueue | FifoQueue, at: number, over: Partial<ScheduledRequest>): QueueEntry {
  const r = req(over);
  const e: QueueEntry = { req: r, queuedAt: at, key: q.keyFor(r, at), state: 'queued' };
  q.push(e);
  return e;
}

/** An entry of one size (100 prefill tokens, no output) queued at `at`. */
function unit(q: SlagateQueue, at: number, over: Partial<ScheduledRequest>): QueueEntry {
  return entry(q, at, { uncachedTokens: 100, expectedOutputTokens: 0, ...over });
}

/** `n` entries of `tenant`, ids `${tenant}0`…, queued at 0, 1, …, all of one size. */
function burst(q: SlagateQueue, tenant: string, n: number): void {
  for (let i = 0; i < n; i++) unit(q, i, { reqId: `${tenant}${i}`, tenant });
}

/** The ids a scan shows when it answers 'skip' to `skipped` and 'pass' to every other entry. */
function scanSkipping(q: SlagateQueue | FifoQueue, skipped: string): string[] {
  const seen: string[] = [];
  q.scan((e) => {
    seen.push(e.req.reqId);
    return e.req.reqId === skipped ? 'skip' : 'pass';
  });
  return seen;
}

function drain(q: SlagateQueue | FifoQueue): string[] {
  const out: string[] = [];
  q.scan((e) => {
    out.push(e.req.reqId);
    return 'take';
  });
  return out;
}

describe('SlagateQueue', () => {
  it('orders by class priority, then by predicted prefill among requests that arrived together', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    entry(q, 0, { reqId: 'batch-short', priority: 2, prefillMs: 1 });
    entry(q, 0, { reqId: 'long', prefillMs: 120 });
    entry(q, 0, { reqId: 'short', prefillMs: 5 });
    entry(q, 0, { reqId: 'medium', prefillMs: 40 });
    expect(drain(q)).toEqual(['short', 'medium', 'long', 'batch-short']);
  });

  it('waiting is aging: a request is overtaken only by arrivals within its window', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // A long prompt (prefill 120 ms, slack 500 − 50 = 450 → size term min(120, 225) = 120 ms).
    entry(q, 0, { reqId: 'long', prefillMs: 120 });
    // Shorts arriving inside its window (< 120 − their own 5 ms) overtake it; later ones do not.
    entry(q, 100, { reqId: 'short-at-100', prefillMs: 5 });
    entry(q, 116, { reqId: 'short-at-116', prefillMs: 5 });
    entry(q, 200, { reqId: 'short-at-200', prefillMs: 5 });
    expect(drain(q)).toEqual(['short-at-100', 'long', 'short-at-116', 'short-at-200']);
  });

  it('a lower class catches up after aging_ms × the priority difference', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    entry(q, 0, { reqId: 'batch', priority: 2, prefillMs: 0 });
    entry(q, 1999, { reqId: 'interactive-early', prefillMs: 0 });
    entry(q, 2001, { reqId: 'interactive-late', prefillMs: 0 });
    expect(drain(q)).toEqual(['interactive-early', 'batch', 'interactive-late']);
  });

  it('size never costs a request more than half its slack', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // Slack 500 − 300 = 200: the size term is capped at 100 though its prefill is 250.
    const e = entry(q, 0, { reqId: 'x', prefillMs: 250, bestBackendMs: 300 });
    expect(e.key).toBe(100);
    // No prediction at all: no size term.
    expect(entry(q, 0, { reqId: 'y', prefillMs: null, bestBackendMs: null }).key).toBe(0);
  });

  it('between tenants of a class: the least-served tenant goes next, whatever the other queued', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // Tenant A bursts 6 requests; B queues 2, later and larger.
    for (let i = 0; i < 6; i++)
      entry(q, i, { reqId: `a${i}`, tenant: 'a', uncachedTokens: 100, expectedOutputTokens: 0 });
    entry(q, 10, { reqId: 'b0', tenant: 'b', uncachedTokens: 100, expectedOutputTokens: 0, prefillMs: 50 });
    entry(q, 11, { reqId: 'b1', tenant: 'b', uncachedTokens: 100, expectedOutputTokens: 0, prefillMs: 50 });
    // Equal work each: they take turns, so B's two requests do not wait behind A's burst.
    expect(drain(q)).toEqual(['a0', 'b0', 'a1', 'b1', 'a2', 'a3', 'a4', 'a5']);
  });

  it("'skip' shows the rest of a tenant's entries in its class after the other tenants' there; classes keep their order; all stay queued", () => {
    const q = new SlagateQueue({ agingMs: AGING });
    burst(q, 'a', 4);
    unit(q, 10, { reqId: 'b0', tenant: 'b' });
    // Another class's entries of tenant a are not put off with them, nor brought ahead by it.
    unit(q, 11, { reqId: 'a-batch', tenant: 'a', className: 'batch', priority: 1 });
    const seen = scanSkipping(q, 'a0');
    expect(seen).toEqual(['a0', 'b0', 'a1', 'a2', 'a3', 'a-batch']);
    expect(q.size).toBe(6);
    expect(drain(q)).toEqual(['a0', 'b0', 'a1', 'a2', 'a3', 'a-batch']);
    // Without tenants, fcfs takes it for a pass.
    const f = new FifoQueue();
    for (let i = 0; i < 3; i++) entry(f, i, { reqId: `f${i}` });
    expect(scanSkipping(f, 'f0')).toEqual(['f0', 'f1', 'f2']);
    expect(drain(f)).toEqual(['f0', 'f1', 'f2']);
  });

  it('a tenant put off gives its turn to another tenant of its class, whose entry is shown no earlier among the classes than its own key', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    burst(q, 'a', 4);
    unit(q, 900, { reqId: 'b-late', tenant: 'b' });
    // A batch entry whose key (its arrival plus one aging step) falls between a's and b's.
    unit(q, 500 - AGING, { reqId: 'batch', className: 'batch', priority: 1 });
    const seen = scanSkipping(q, 'a0');
    // b takes a's turn, but not ahead of the older batch entry (the aging bound); a's rest, put
    // off for the scan, follow b's.
    expect(seen).toEqual(['a0', 'batch', 'b-late', 'a1', 'a2', 'a3']);
  });

  it('a request granted a second time (its first backend refused it unstarted) is not charged again', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    const again = req({ reqId: 'a0', tenant: 'a', uncachedTokens: 100, expectedOutputTokens: 0 });
    q.push({ req: again, queuedAt: 0, key: q.keyFor(again, 0), alreadyCharged: true, state: 'queued' });
    entry(q, 1, { reqId: 'a1', tenant: 'a', uncachedTokens: 100, expectedOutputTokens: 0 });
    entry(q, 2, { reqId: 'b0', tenant: 'b', uncachedTokens: 100, expectedOutputTokens: 0 });
    entry(q, 3, { reqId: 'b1', tenant: 'b', uncachedTokens: 100, expectedOutputTokens: 0 });
    // a0's work was charged at its first grant: a is still even with b after it, and goes first on
    // the tie (charged again, b0 would come before a1).
    expect(drain(q)).toEqual(['a0', 'a1', 'b0', 'b1']);
  });

  it("fairness is by work, not request count: a tenant's large requests use its share faster", () => {
    const q = new SlagateQueue({ agingMs: AGING });
    for (let i = 0; i < 4; i++)
      entry(q, i, { reqId: `big${i}`, tenant: 'big', uncachedTokens: 300, expectedOutputTokens: 0 });
    for (let i = 0; i < 6; i++)
      entry(q, i, { reqId: `small${i}`, tenant: 'small', uncachedTokens: 100, expectedOutputTokens: 0 });
    const order = drain(q);
    // By the time big has had 2 requests (600 tokens), small has had its first 6 (600 tokens).
    expect(order.indexOf('small5')).toBeLessThan(order.indexOf('big2'));
  });

  it('a tenant back from idle banks no credit: its counter is lifted to the waiting ones', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    for (let i = 0; i < 3; i++)
      entry(q, i, { reqId: `a${i}`, tenant: 'a', uncachedTokens: 100, expectedOutputTokens: 0 });
    entry(q, 0, { reqId: 'b0', tenant: 'b', uncachedTokens: 100, expectedOutputTokens: 0 });
    expect(drain(q)).toEqual(['a0', 'b0', 'a1', 'a2']);
    // A was served 300 tokens, B 100; B is idle now, then returns with four requests while A
    // queues more: without the lift, B would be owed 200 tokens and go twice in a row.
    for (let i = 3; i < 6; i++)
      entry(q, 100 + i, { reqId: `a${i}`, tenant: 'a', uncachedTokens: 100, expectedOutputTokens: 0 });
    for (let i = 1; i < 4; i++)
      entry(q, 200 + i, { reqId: `b${i}`, tenant: 'b', uncachedTokens: 100, expectedOutputTokens: 0 });
    const order = drain(q);
    expect(order.slice(0, 2).sort()).toEqual(['a3', 'b1']);
  });

  it('work served while a tenant was alone is no debt at the next backlog: counters start afresh once the queue empties', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // Light load: H's thousand requests each leave at once, nobody else waiting; L's one too.
    for (let i = 0; i < 1000; i++) {
      entry(q, i, { reqId: `h${i}`, tenant: 'h', uncachedTokens: 1000 });
      drain(q);
    }
    entry(q, 1000, { reqId: 'l0', tenant: 'l', uncachedTokens: 1000 });
    drain(q);
    // Overload: L is backlogged, H's request joins; one leaves per turn, and L keeps sending.
    entry(q, 2000, { reqId: 'l1', tenant: 'l', uncachedTokens: 1000 });
    entry(q, 2000, { reqId: 'h-late', tenant: 'h', uncachedTokens: 1000 });
    const left: string[] = [];
    for (let i = 0; i < 3; i++) {
      entry(q, 2001 + i, { reqId: `l${i + 2}`, tenant: 'l', uncachedTokens: 1000 });
      let taken = false;
      q.scan((e) => {
        if (taken) return 'stop';
        taken = true;
        left.push(e.req.reqId);
        return 'take';
      });
    }
    // H's request goes within the first turns, not after L has been served H's whole history.
    expect(left.slice(0, 2)).toContain('h-late');
  });

  it('removed entries never leave; depth and size follow; a protected request is given the worst sheddable place', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    const a = entry(q, 0, { reqId: 'a' });
    entry(q, 1, { reqId: 'b', className: 'batch', priority: 2, sheddable: true });
    const c = entry(q, 2, { reqId: 'c', className: 'batch', priority: 2, sheddable: true, prefillMs: 100 });
    expect(q.depthByClass()).toEqual(
      new Map([
        ['interactive', 1],
        ['batch', 2],
      ]),
    );
    expect(q.victimFor(req({ reqId: 'new' }))).toBe(c);
    q.remove(a);
    expect(q.size).toBe(2);
    expect(q.depthByClass().get('interactive')).toBe(0);
    expect(drain(q)).toEqual(['b', 'c']);
  });

  it("a full queue gives the place of the biggest holder's worst entry, never a tenant's own or a more urgent class's", () => {
    const q = new SlagateQueue({ agingMs: AGING });
    const a = [0, 1, 2].map((i) => entry(q, i, { reqId: `a${i}`, tenant: 'a', prefillMs: i }));
    entry(q, 3, { reqId: 'b0', tenant: 'b' });
    // b holds 1 (2 with a new one), a holds 3: a's worst-placed entry gives way.
    expect(q.victimFor(req({ reqId: 'b1', tenant: 'b' }))).toBe(a[2]);
    // a's own request takes nobody's place: it holds the most already.
    expect(q.victimFor(req({ reqId: 'a3', tenant: 'a' }))).toBeUndefined();
    // Once b would hold as many as a, no more.
    const b1 = entry(q, 4, { reqId: 'b1', tenant: 'b' });
    q.remove(a[2]!);
    expect(q.victimFor(req({ reqId: 'b2', tenant: 'b' }))).toBeUndefined();
    // Queued already, a request counts once and is never its own victim.
    expect(q.victimFor(b1.req, b1)).toBeUndefined();
    // A less urgent class does not take a more urgent class's place, whoever holds it.
    expect(q.victimFor(req({ reqId: 'c0', tenant: 'c', className: 'batch', priority: 2 }))).toBeUndefined();
    // What a tenant holds counts whole: its entries of a more urgent class and its retries too.
    const u = new SlagateQueue({ agingMs: AGING });
    for (let i = 0; i < 4; i++) entry(u, i, { reqId: `ua${i}`, tenant: 'a' });
    const small = [0, 1].map((i) =>
      entry(u, 10 + i, { reqId: `ub${i}`, tenant: 'b', className: 'standard', priority: 1 }),
    );
    // a holds 5 with its new request, b 2: none of b's gives way to a's.
    expect(
      u.victimFor(req({ reqId: 'ua4', tenant: 'a', className: 'standard', priority: 1 })),
    ).toBeUndefined();
    // With 4 retries waiting, b holds 6 places: one of its standard entries gives way to a's.
    expect(
      u.victimFor(
        req({ reqId: 'ua4', tenant: 'a', className: 'standard', priority: 1 }),
        undefined,
        new Map([['b', 4]]),
      ),
    ).toBe(small[1]);
    // The biggest holder has nothing c's batch request may displace (all interactive): the next
    // biggest, whose burst is of c's own class, gives way instead.
    const m = new SlagateQueue({ agingMs: AGING });
    for (let i = 0; i < 5; i++) entry(m, i, { reqId: `ma${i}`, tenant: 'a' });
    const burst = [0, 1, 2].map((i) =>
      entry(m, 10 + i, { reqId: `mb${i}`, tenant: 'b', className: 'batch', priority: 2, prefillMs: i }),
    );
    expect(m.victimFor(req({ reqId: 'mc', tenant: 'c', className: 'batch', priority: 2 }))).toBe(burst[2]);
    // Under fcfs, arrival order is the rule: no tenant's place is given up.
    const f = new FifoQueue();
    for (let i = 0; i < 3; i++) entry(f, i, { reqId: `fa${i}`, tenant: 'a' });
    expect(f.victimFor(req({ reqId: 'fb', tenant: 'b' }))).toBeUndefined();
  });

  it('many removals below the top are compacted away', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    const keep = entry(q, 0, { reqId: 'keep', prefillMs: 0 });
    const gone = Array.from({ length: 500 }, (_, i) => entry(q, 1 + i, { reqId: `g${i}` }));
    for (const g of gone) q.remove(g);
    expect(q.size).toBe(1);
    expect(drain(q)).toEqual([keep.req.reqId]);
    expect(q.size).toBe(0);
  });

  it('estimates how many queued entries would leave first', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    for (let i = 0; i < 3; i++)
      entry(q, 0, { reqId: `hi${i}`, className: 'urgent', priority: 0, prefillMs: 1 });
    for (let i = 0; i < 4; i++) entry(q, 0, { reqId: `me${i}`, priority: 1, prefillMs: 10 });
    for (let i = 0; i < 5; i++)
      entry(q, 0, { reqId: `other${i}`, priority: 1, tenant: 'other', prefillMs: 10 });
    const probe = req({ priority: 1, prefillMs: 20 });
    // 3 of a more urgent class, my 4 smaller keys, and the other tenant's turns: min(5, 4 + 1).
    expect(q.aheadOf(probe, q.keyFor(probe, 0))).toBe(3 + 4 + 5);
  });

  it('counts the entries of another class of the same priority that would leave first, by key', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // Two classes of priority 0 (as interactive and completion are by default) compete by key.
    for (let i = 0; i < 6; i++) entry(q, 0, { reqId: `c${i}`, className: 'completion', prefillMs: 1 });
    for (let i = 0; i < 2; i++) entry(q, 0, { reqId: `late${i}`, className: 'completion', prefillMs: 400 });
    const probe = req({ className: 'interactive', prefillMs: 20 });
    const key = q.keyFor(probe, 0);
    expect(q.aheadOf(probe, key)).toBe(6);
    // And that is the order they leave in.
    entry(q, 0, { reqId: 'probe', className: 'interactive', prefillMs: 20 });
    expect(drain(q).indexOf('probe')).toBe(6);
  });

  it('counts the entries of a less urgent class that have aged past a new request, by key', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // Batch (priority 2) entries keyed 2 × AGING later than they came; queued long enough ago,
    // they leave before an interactive request that comes now.
    for (let i = 0; i < 5; i++) entry(q, 0, { reqId: `old${i}`, className: 'batch', priority: 2 });
    for (let i = 0; i < 3; i++) entry(q, 2_500, { reqId: `new${i}`, className: 'batch', priority: 2 });
    const probe = req({ reqId: 'probe', priority: 0 });
    const key = q.keyFor(probe, 2_500);
    expect(q.aheadOf(probe, key)).toBe(5);
    const e: QueueEntry = { req: probe, queuedAt: 2_500, key, state: 'queued' };
    q.push(e);
    expect(drain(q).indexOf('probe')).toBe(5);
  });

  it('a scan shows entries in leaving order; a passed one keeps its place, and is not charged to its tenant', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    // Tenant a: two entries; tenant b: one. Equal counters: the smallest key leaves first.
    entry(q, 0, { reqId: 'a1', tenant: 'a', prefillMs: 1 });
    entry(q, 0, { reqId: 'a2', tenant: 'a', prefillMs: 2 });
    entry(q, 0, { reqId: 'b1', tenant: 'b', prefillMs: 3 });
    const seen: string[] = [];
    q.scan((e) => {
      seen.push(e.req.reqId);
      // a1 waits (for a busy backend, say); a2 behind it of the same tenant goes.
      return e.req.reqId === 'a1' ? 'pass' : e.req.reqId === 'a2' ? 'take' : 'stop';
    });
    // a1 passed without a charge, so tenant a (a2 taken: charged) is now behind b by work.
    expect(seen).toEqual(['a1', 'a2', 'b1']);
    expect(q.size).toBe(2);
    expect(drain(q)).toEqual(['b1', 'a1']);
  });

  it('an entry refused as it is shown (taken out removed) is not charged to its tenant', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    entry(q, 0, { reqId: 'a1', tenant: 'a', prefillMs: 1 });
    entry(q, 0, { reqId: 'a2', tenant: 'a', prefillMs: 2 });
    entry(q, 0, { reqId: 'b1', tenant: 'b', prefillMs: 3 });
    const seen: string[] = [];
    q.scan((e) => {
      seen.push(e.req.reqId);
      if (e.req.reqId !== 'a1') return 'stop';
      // The scheduler's guard refuses it at its grant: nothing was served.
      e.state = 'removed';
      return 'take';
    });
    // Tenant a was served nothing, so it is level with b and its smaller key goes next.
    expect(seen).toEqual(['a1', 'a2']);
    expect(q.size).toBe(2);
    expect(drain(q)).toEqual(['a2', 'b1']);
  });

  it('a scan that passes everything leaves the queue as it was', () => {
    const q = new SlagateQueue({ agingMs: AGING });
    for (const [id, t, p] of [
      ['x', 'a', 5],
      ['y', 'b', 1],
      ['z', 'a', 3],
    ] as const)
      entry(q, 0, { reqId: id, tenant: t, prefillMs: p });
    const seen: string[] = [];
    q.scan((e) => {
      seen.push(e.req.reqId);
      return 'pass';
    });
    // Tenant a first (equal counters), its smallest key first; nothing charged by passing.
    expect(seen).toEqual(['z', 'x', 'y']);
    expect(q.size).toBe(3);
    expect(drain(q)).toEqual(['z', 'y', 'x']);
  });
});

describe('FifoQueue', () => {
  it('is arrival order whatever the class or size', () => {
    const q = new FifoQueue();
    entry(q, 0, { reqId: 'first', priority: 2, prefillMs: 500 });
    entry(q, 1, { reqId: 'second', prefillMs: 1 });
    const third = entry(q, 2, { reqId: 'third' });
    q.remove(third);
    expect(q.size).toBe(2);
    expect(q.aheadOf(req(), 0)).toBe(2);
    expect(drain(q)).toEqual(['first', 'second']);
  });

  it('a scan passes over entries without moving them, and takes in arrival order', () => {
    const q = new FifoQueue();
    for (const [i, id] of ['first', 'second', 'third'].entries()) entry(q, i, { reqId: id });
    q.scan((e) => (e.req.reqId === 'first' ? 'pass' : e.req.reqId === 'second' ? 'take' : 'stop'));
    expect(q.size).toBe(2);
    expect(drain(q)).toEqual(['first', 'third']);
  });
});
