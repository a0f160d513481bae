// The order in which waiting requests leave the gateway's queue. Two disciplines behind one
// interface: `SlagateQueue` (class priority, then shortest predicted prefill, with aging; fair by
// work between the tenants of a class) and `FifoQueue` (first come, first served: the baseline).
// Retries are not here: the scheduler keeps them apart and serves them first.
//
// SlagateQueue's order, in one formula. Each entry gets a fixed key when it is queued:
//
//   key = queued_at + aging_ms × priority + min(prefill_ms, slack_ms / 2)
//
// (prefill_ms: its predicted prefill work on the best backend; slack_ms: its class TTFT target
// minus its predicted time to first token there.) Smaller keys leave first. Because the key is
// fixed while time moves on, waiting is aging: a request can only be overtaken by one that
// arrives less than aging_ms × (priority − lowest priority) + min(prefill_ms, slack_ms / 2) after
// it, so nothing starves; among requests of one class that arrive close together the shortest
// prefill goes first; and size alone never costs a request more than half of its slack.
//
// Fairness between tenants of one class (virtual token counters, as in VTC): each tenant has a
// counter of the work it has been served in the class (uncached prompt tokens + expected output
// tokens, charged when a request is dispatched). The class's next request comes from the
// backlogged tenant with the smallest counter, and is that tenant's smallest key; classes then
// compete by those keys. A tenant that comes back after being idle has its counter lifted to the
// smallest counter of the tenants still waiting, so idleness banks no credit; and when the class's
// queue empties every counter starts afresh, so work served while nobody waited is no debt. With one tenant
// this is exactly the key order above; a tenant that bursts is served its share of the class's
// work while the others' requests keep their place.
//
// The two meet in one place, on purpose: a class competes by its least-served tenant's entry, not
// by its oldest. A tenant served more than the others waits for their turns in its class, and
// while it does, an entry of a less urgent class may pass its older entries (the aging bound
// holds between the entries that compete). It does not starve: every grant to the others raises
// their counters, so its turn in the class comes. Competing by the oldest entry instead would
// let a light tenant's fresh arrivals, served under a heavy tenant's old key, starve every less
// urgent class.
import { Heap } from './heap.ts';
import type { ScheduledRequest } from './types.ts';

export type EntryState = 'queued' | 'granted' | 'removed';

/**
 * What a scan does with the entry it is shown: it leaves now, it stays in its place, it stays and
 * its tenant's next ones in its class give their turns to the other tenants there, or the scan ends.
 */
export type Verdict = 'take' | 'pass' | 'skip' | 'stop';

export interface QueueEntry {
  readonly req: ScheduledRequest;
  /** performance.now() when it was queued. */
  readonly queuedAt: number;
  /**
   * The order key (FifoQueue: queuedAt). Set before the entry is pushed, and only then: a reload
   * that changes the order (the policy, aging_ms, a class's priority) makes a new queue, which keys
   * the entries again as they move into it (Scheduler.#discipline).
   */
  key: number;
  /** Its dispatch was charged already (a first attempt asked again): charged nothing this time. */
  readonly alreadyCharged?: boolean;
  state: EntryState;
}

/** What a queue's order is made of; fixed for the queue's life. */
export interface QueueOrder {
  readonly policy: 'slagate' | 'fcfs';
  readonly agingMs: number;
  /**
   * Each configured class's priority (lower is served first). A class not in it (a reload removed
   * it while its requests waited) keeps the priority its requests were given at arrival.
   */
  readonly priorities: ReadonlyMap<string, number>;
}

export interface QueueDiscipline {
  readonly name: 'slagate' | 'fcfs';
  /** Whether this queue orders its entries as `order` would: if not, a reload changed the order. */
  ordersAs(order: QueueOrder): boolean;
  /** Live entries. */
  readonly size: number;
  push(e: QueueEntry): void;
  /**
   * Shows the entries in the order they would leave, one at a time. 'take' takes the entry out
   * (marked granted; the next one shown is the one that would leave next after it); 'pass' leaves
   * it queued with its key and place, and shows the one after it; 'skip' passes it and, under
   * slagate, gives its tenant's turns in its class, for the rest of the scan, to the class's other
   * tenants while they have entries left to show (each shown no earlier among the classes than its
   * own key; under fcfs, which has no tenants, it is 'pass'); 'stop' ends the scan. The
   * callback may settle the entry it is shown (and mark it 'removed' before taking it: it leaves
   * unserved, and its tenant is charged nothing), but must not push or remove entries.
   */
  scan(visit: (e: QueueEntry) => Verdict): void;
  /** The entry is leaving without a slot (refused, cancelled): forget it. */
  remove(e: QueueEntry): void;
  /** The key a new entry of `req` would get now. */
  keyFor(req: ScheduledRequest, now: number): number;
  /**
   * How many queued entries would leave before a new one of `req` (an estimate, see aheadOf);
   * with `only`, of the entries it accepts alone (those waiting for the backends `req` may use).
   */
  aheadOf(req: ScheduledRequest, key: number, only?: (e: QueueEntry) => boolean): number;
  depthByClass(): Map<string, number>;
  /** Live entries by the model they name (what a pump needs to know that none of them can go). */
  byModel(): ReadonlyMap<string, number>;
  /**
   * The queued entry a full queue gives up to take `req` in, if any: for a protected request, the
   * worst-placed entry of a sheddable class. Under slagate, failing that, of the tenants that hold
   * more places (their entries of every class and their `retries`) than `req`'s own tenant would
   * with `req`, the one holding the most that has an entry `req` may take the place of (of classes
   * no more urgent than its own; sheddable ones only, for a sheddable request) gives its
   * worst-placed such entry: a full queue is shared by the tenants as its order is, and one tenant's burst does
   * not keep the others out. `self`: `req`'s own entry when it is queued already (never its own
   * victim, and counted once).
   */
  victimFor(
    req: ScheduledRequest,
    self?: QueueEntry,
    retries?: ReadonlyMap<string, number>,
  ): QueueEntry | undefined;
}

const alive = (e: QueueEntry) => e.state === 'queued';

/** One more live entry of `model` in `counts`. */
function countIn(counts: Map<string, number>, model: string): void {
  counts.set(model, (counts.get(model) ?? 0) + 1);
}

/** One live entry of `model` fewer in `counts` (the model gone at none). */
function countOut(counts: Map<string, number>, model: string): void {
  const n = (counts.get(model) ?? 1) - 1;
  if (n > 0) counts.set(model, n);
  else counts.delete(model);
}

const byKey = (a: QueueEntry, b: QueueEntry) => a.key < b.key || (a.key === b.key && a.queuedAt < b.queuedAt);

/** The worst-placed live entry of `entries` that `keep` accepts. */
function worstOf(entries: Iterable<QueueEntry>, keep: (e: QueueEntry) => boolean): QueueEntry | undefined {
  let worst: QueueEntry | undefined;
  for (const e of entries) if (alive(e) && keep(e) && (worst === undefined || byKey(worst, e))) worst = e;
  return worst;
}

const sheddable = (e: QueueEntry) => e.req.sheddable;

/** Work a request is charged in its tenant's counter when it is dispatched. */
function work(req: ScheduledRequest): number {
  return Math.max(0, req.uncachedTokens) + Math.max(0, req.expectedOutputTokens);
}

interface TenantQueue {
  readonly heap: Heap<QueueEntry>;
  size: number;
  counter: number;
  /** Entries a scan in progress has passed over, lifted out of the heap until the scan ends. */
  lifted: number;
}

interface ClassQueue {
  readonly name: string;
  readonly priority: number;
  readonly tenants: Map<string, TenantQueue>;
  size: number;
}

export class SlagateQueue implements QueueDiscipline {
  readonly name = 'slagate' as const;
  #size = 0;
  #dead = 0;
  readonly #classes = new Map<string, ClassQueue>();
  readonly #agingMs: number;
  readonly #priorities: ReadonlyMap<string, number>;

  constructor(order: Pick<QueueOrder, 'agingMs'> & Partial<Pick<QueueOrder, 'priorities'>>) {
    this.#agingMs = order.agingMs;
    this.#priorities = order.priorities ?? new Map();
  }

  ordersAs(order: QueueOrder): boolean {
    if (order.policy !== 'slagate' || order.agingMs !== this.#agingMs) return false;
    if (order.priorities.size !== this.#priorities.size) return false;
    for (const [name, p] of order.priorities) if (this.#priorities.get(name) !== p) return false;
    return true;
  }

  /** The work counters of every tenant of each class with entries waiting (a copy). */
  counters(): Map<string, Map<string, number>> {
    const out = new Map<string, Map<string, number>>();
    for (const c of this.#classes.values()) {
      if (c.size === 0) continue;
      out.set(c.name, new Map([...c.tenants].map(([name, t]) => [name, t.counter])));
    }
    return out;
  }

  /**
   * Takes over the counters of another queue's (`counters()`, read before its entries moved here):
   * a reload that changes the order does not change what each tenant has been served. Called once
   * the moved entries are pushed, so no counter is lifted by the push of a tenant's first entry.
   * Tenants idle in a class that still has entries keep theirs too, for when they are back.
   */
  carry(counters: ReadonlyMap<string, ReadonlyMap<string, number>>): void {
    for (const [name, tenants] of counters) {
      const c = this.#classes.get(name);
      if (c === undefined || c.size === 0) continue;
      for (const [tenant, counter] of tenants) {
        let t = c.tenants.get(tenant);
        if (t === undefined) {
          t = { heap: new Heap(byKey, alive), size: 0, counter: 0, lifted: 0 };
          c.tenants.set(tenant, t);
        }
        t.counter = counter;
      }
    }
  }

  /** `req`'s class priority in this queue's order. */
  #priority(req: ScheduledRequest): number {
    return this.#priorities.get(req.className) ?? req.priority;
  }

  readonly #models = new Map<string, number>();

  get size(): number {
    return this.#size;
  }

  byModel(): ReadonlyMap<string, number> {
    return this.#models;
  }

  keyFor(req: ScheduledRequest, now: number): number {
    const slack =
      req.bestBackendMs === null ? req.ttftBudgetMs : Math.max(0, req.ttftBudgetMs - req.bestBackendMs);
    const size = req.prefillMs === null ? 0 : Math.min(Math.max(0, req.prefillMs), slack / 2);
    return now + this.#agingMs * this.#priority(req) + size;
  }

  push(e: QueueEntry): void {
    const c = this.#classQueue(e.req);
    let t = c.tenants.get(e.req.tenant);
    if (t === undefined) {
      t = { heap: new Heap(byKey, alive), size: 0, counter: 0, lifted: 0 };
      c.tenants.set(e.req.tenant, t);
    }
    if (t.size === 0) {
      // Back from idle: no credit for the time away (VTC's counter lift).
      const floor = minCounter(c, t);
      if (floor !== null && floor > t.counter) t.counter = floor;
    }
    t.heap.push(e);
    t.size++;
    c.size++;
    this.#size++;
    countIn(this.#models, e.req.model);
  }

  // A passed entry is lifted out of its tenant's heap, so that the tenant's next entry competes
  // in its place (charged nothing: only a dispatch is work served), and is pushed back with the
  // same key when the scan ends, whatever way it ends.
  scan(visit: (e: QueueEntry) => Verdict): void {
    const lifted: { e: QueueEntry; t: TenantQueue }[] = [];
    // Tenants a 'skip' put off: in its class, their entries are shown once no other tenant's are
    // left to show (or every other tenant's is put off too).
    let deferred: Set<TenantQueue> | null = null;
    try {
      for (let next = this.#select(deferred); next !== null; next = this.#select(deferred)) {
        // Out of its heap while it is visited, whatever the visit does to its state.
        next.t.heap.pop();
        const verdict = visit(next.e);
        if (verdict === 'stop') {
          next.t.heap.push(next.e);
          return;
        }
        if (verdict === 'take') {
          this.#take(next);
        } else {
          next.t.lifted++;
          lifted.push(next);
          if (verdict === 'skip') {
            deferred ??= new Set();
            deferred.add(next.t);
          }
        }
      }
    } finally {
      for (const { e, t } of lifted) {
        t.lifted--;
        if (e.state === 'queued') t.heap.push(e);
      }
    }
  }

  /**
   * Invariant: a tenant is charged for work served, so never for an entry taken out 'removed'
   * (refused), and once for a request granted twice because its first backend refused it unstarted.
   */
  #take(best: { e: QueueEntry; t: TenantQueue; c: ClassQueue }): void {
    if (best.e.state === 'queued') best.e.state = 'granted';
    best.t.size--;
    best.c.size--;
    this.#size--;
    countOut(this.#models, best.e.req.model);
    if (best.e.state === 'granted' && best.e.alreadyCharged !== true) best.t.counter += work(best.e.req);
    emptied(best.c);
  }

  /**
   * The next entry: per class the least-served tenant's smallest key, then the smallest across
   * classes. A tenant in `deferred` gives its turn in its class to the least-served tenant there
   * that is not (to the least-served deferred one when all are). Invariant: no entry is shown
   * before the entry another class would show next in the tenants' order (its least-served
   * tenant's head, unless that tenant is put off) when that entry's key is smaller (the aging
   * bound, as far as fairness between tenants leaves it). A class competes by the
   * later of the key its turn belongs to (the least-served tenant's head, deferred or not) and the
   * key of the entry that takes the turn: at its turn's key alone, a tenant served more took a
   * busy backend under the put-off tenant's old key, ahead of an older entry of a less urgent
   * class. The put-off tenant's own entries may then follow such an entry: put off, they gave up
   * their place for the pump. With no deferral (or one tenant) the order is exactly the one
   * without it.
   */
  #select(
    deferred: ReadonlySet<TenantQueue> | null,
  ): { e: QueueEntry; t: TenantQueue; c: ClassQueue } | null {
    let best: { e: QueueEntry; t: TenantQueue; c: ClassQueue; rank: QueueEntry } | null = null;
    for (const c of this.#classes.values()) {
      if (c.size === 0) continue;
      let turn: TenantQueue | null = null;
      let chosen: TenantQueue | null = null;
      let putOff: TenantQueue | null = null;
      for (const t of c.tenants.values()) {
        if (t.size - t.lifted <= 0) continue;
        if (turn === null || t.counter < turn.counter) turn = t;
        if (deferred?.has(t)) {
          if (putOff === null || t.counter < putOff.counter) putOff = t;
        } else if (chosen === null || t.counter < chosen.counter) chosen = t;
      }
      chosen ??= putOff;
      const place = turn?.heap.peek();
      const head = chosen?.heap.peek();
      if (chosen === null || head === undefined || place === undefined) continue;
      const rank = byKey(place, head) ? head : place;
      if (best === null || byKey(rank, best.rank)) best = { e: head, t: chosen, c, rank };
    }
    return best;
  }

  remove(e: QueueEntry): void {
    if (e.state !== 'queued') return;
    e.state = 'removed';
    const c = this.#classes.get(e.req.className);
    const t = c?.tenants.get(e.req.tenant);
    if (c === undefined || t === undefined) return;
    t.size--;
    c.size--;
    this.#size--;
    countOut(this.#models, e.req.model);
    emptied(c);
    // Removed entries stay in their heap until they surface; compact when they outnumber the rest.
    if (++this.#dead > 64 && this.#dead > this.#size) {
      for (const cq of this.#classes.values()) for (const tq of cq.tenants.values()) tq.heap.compact();
      this.#dead = 0;
    }
  }

  /**
   * Entries of more urgent classes (smaller priority); of every other class, those with a smaller
   * key (classes compete by key: a less urgent entry that has waited longer than its aging offset
   * leaves first); plus, in its own class, the tenant's own entries with a smaller key and, from
   * every other tenant, at most as many as the tenant's own plus one (the tenants take turns by
   * work). An estimate: aging and the exact counters move it.
   */
  aheadOf(req: ScheduledRequest, key: number, only?: (e: QueueEntry) => boolean): number {
    const counts = only === undefined ? alive : (e: QueueEntry) => alive(e) && only(e);
    // A tenant's entries `counts` accepts: its size when it accepts every live one.
    const sizeOf = (t: { heap: Heap<QueueEntry>; size: number }): number => {
      if (only === undefined) return t.size;
      let k = 0;
      for (const e of t.heap.values()) if (counts(e)) k++;
      return k;
    };
    let n = 0;
    for (const c of this.#classes.values()) {
      if (c.size === 0) continue;
      if (c.priority < this.#priority(req)) {
        if (only === undefined) n += c.size;
        else for (const t of c.tenants.values()) n += sizeOf(t);
        continue;
      }
      if (c.name !== req.className) {
        for (const t of c.tenants.values())
          for (const e of t.heap.values()) if (counts(e) && e.key < key) n++;
        continue;
      }
      const own = c.tenants.get(req.tenant);
      let mine = 0;
      if (own !== undefined) for (const e of own.heap.values()) if (counts(e) && e.key < key) mine++;
      n += mine;
      for (const [name, t] of c.tenants) if (name !== req.tenant) n += Math.min(sizeOf(t), mine + 1);
    }
    return n;
  }

  depthByClass(): Map<string, number> {
    const out = new Map<string, number>();
    for (const c of this.#classes.values()) out.set(c.name, c.size);
    return out;
  }

  victimFor(
    req: ScheduledRequest,
    self?: QueueEntry,
    retries?: ReadonlyMap<string, number>,
  ): QueueEntry | undefined {
    if (!req.sheddable) {
      let shed: QueueEntry | undefined;
      for (const c of this.#classes.values()) {
        for (const t of c.tenants.values()) {
          const worst = worstOf(t.heap.values(), (e) => e !== self && sheddable(e));
          if (worst !== undefined && (shed === undefined || byKey(shed, worst))) shed = worst;
        }
      }
      if (shed !== undefined) return shed;
    }
    // Each tenant's places: its entries of every class (the live counts, no scan) and its retries.
    const held = new Map<string, number>(retries);
    for (const c of this.#classes.values())
      for (const [name, t] of c.tenants) if (t.size > 0) held.set(name, (held.get(name) ?? 0) + t.size);
    // req's own tenant with req counted once (queued already, it is in its tenant's count).
    const own = (held.get(req.tenant) ?? 0) + (self === undefined ? 1 : 0);
    // The tenants holding more than that, most first: the first with an entry req may take the
    // place of gives it up. (Only the one holding the most was asked: when all of its entries were
    // of a more urgent class, or not sheddable for a sheddable req, a second tenant's burst kept
    // every other tenant out.)
    const over = [...held].filter(([name, n]) => name !== req.tenant && n > own).sort((x, y) => y[1] - x[1]);
    for (const [tenant] of over) {
      // Its worst-placed entry that req may take the place of: of a class no more urgent than
      // req's, and sheddable for a sheddable req.
      let victim: QueueEntry | undefined;
      for (const c of this.#classes.values()) {
        if (c.priority < this.#priority(req)) continue;
        const t = c.tenants.get(tenant);
        if (t === undefined || t.size === 0) continue;
        const worst = worstOf(t.heap.values(), (e) => e !== self && (!req.sheddable || e.req.sheddable));
        if (worst !== undefined && (victim === undefined || byKey(victim, worst))) victim = worst;
      }
      if (victim !== undefined) return victim;
    }
    return undefined;
  }

  #classQueue(req: ScheduledRequest): ClassQueue {
    let c = this.#classes.get(req.className);
    if (c === undefined) {
      c = { name: req.className, priority: this.#priority(req), tenants: new Map(), size: 0 };
      this.#classes.set(req.className, c);
    }
    return c;
  }
}

/**
 * Invariant: counters compare only the work served while tenants competed. When a class's queue
 * empties, nobody is waiting and every tenant starts afresh at the next backlog; otherwise a tenant
 * served heavily while alone (its requests never waited) carried that as debt, and at the next
 * overload a lighter tenant already backlogged was served alone until it had caught up, while the
 * heavy one's requests waited until the guard refused them. Dropping the tenants also bounds the map.
 */
function emptied(c: ClassQueue): void {
  if (c.size === 0) c.tenants.clear();
}

function minCounter(c: ClassQueue, except: TenantQueue): number | null {
  let min: number | null = null;
  for (const t of c.tenants.values()) {
    if (t !== except && t.size > 0 && (min === null || t.counter < min)) min = t.counter;
  }
  return min;
}

export class FifoQueue implements QueueDiscipline {
  readonly name = 'fcfs' as const;
  #size = 0;
  #dead = 0;
  readonly #heap = new Heap<QueueEntry>(byKey, alive);
  readonly #depth = new Map<string, number>();

  get size(): number {
    return this.#size;
  }

  keyFor(_req: ScheduledRequest, now: number): number {
    return now;
  }

  ordersAs(order: QueueOrder): boolean {
    return order.policy === 'fcfs';
  }

  push(e: QueueEntry): void {
    this.#heap.push(e);
    this.#size++;
    this.#depth.set(e.req.className, (this.#depth.get(e.req.className) ?? 0) + 1);
    countIn(this.#models, e.req.model);
  }

  readonly #models = new Map<string, number>();

  byModel(): ReadonlyMap<string, number> {
    return this.#models;
  }

  scan(visit: (e: QueueEntry) => Verdict): void {
    const lifted: QueueEntry[] = [];
    try {
      for (let e = this.#heap.pop(); e !== undefined; e = this.#heap.pop()) {
        // Out of the heap while it is visited, whatever the visit does to its state.
        const verdict = visit(e);
        if (verdict === 'stop') {
          this.#heap.push(e);
          return;
        }
        if (verdict === 'take') {
          if (e.state === 'queued') e.state = 'granted';
          this.#forget(e);
        } else {
          lifted.push(e);
        }
      }
    } finally {
      for (const e of lifted) if (e.state === 'queued') this.#heap.push(e);
    }
  }

  remove(e: QueueEntry): void {
    if (e.state !== 'queued') return;
    e.state = 'removed';
    this.#forget(e);
    if (++this.#dead > 64 && this.#dead > this.#size) {
      this.#heap.compact();
      this.#dead = 0;
    }
  }

  aheadOf(_req: ScheduledRequest, _key: number, only?: (e: QueueEntry) => boolean): number {
    if (only === undefined) return this.#size;
    let n = 0;
    for (const e of this.#heap.values()) if (alive(e) && only(e)) n++;
    return n;
  }

  depthByClass(): Map<string, number> {
    return new Map(this.#depth);
  }

  /** First come, first served: no tenant's place is given up for another's; only a sheddable one. */
  victimFor(req: ScheduledRequest, self?: QueueEntry): QueueEntry | undefined {
    return req.sheddable ? undefined : worstOf(this.#heap.values(), (e) => e !== self && sheddable(e));
  }

  #forget(e: QueueEntry): void {
    this.#size--;
    this.#depth.set(e.req.className, (this.#depth.get(e.req.className) ?? 1) - 1);
    countOut(this.#models, e.req.model);
  }
}
