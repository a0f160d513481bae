// What each tenant is using right now, for the tenant limits: requests in flight (admitted and not
// yet ended, queued ones included) and tokens admitted in the last minute (prompt + max_tokens).
// This instance's part is exact; the peers' part arrives with their snapshots (redis-sync.ts), so
// a limit holds across gateway instances up to one refresh interval of lag.
//
// Invariants: a usage lease subtracts exactly what it added, once (end() is idempotent); the token
// window's total always equals the sum of its buckets inside the window, and expiring a bucket or
// refunding a lease's tokens subtracts exactly, so the total never drifts; every tenant with a
// request in flight or tokens in the window is tracked (a limit that stopped applying past some
// count of tenants would let the next ones through unmetered), and idle ones are dropped when the
// table reaches MAX_TENANTS, so it holds at most the tenants active in the last minute: config
// names only (the authenticator gives no other), including those a reload removed while in use.

import { MAX_LEASE_COUNT } from './leases.ts';

/** Tenants tracked before idle ones are dropped. */
export const MAX_TENANTS = 4096;

/**
 * Tenants the peers' merged view holds at most (snapshot.ts): their snapshots carry only tenants
 * in use, config names, so this bounds memory against a corrupt snapshot, far above any config.
 */
export const MAX_REMOTE_TENANTS = 65_536;

export interface TenantUsage {
  /** Requests admitted and not yet ended, all live instances. */
  inflight: number;
  /** Tokens admitted in the last window (60 s), all live instances. */
  tokens: number;
}

export interface TenantLease {
  /**
   * Ends the lease. With `refund`, no backend's engine worked on the request (refused or cancelled
   * while it waited, no backend, every attempt refused a connection, or refused by the backends
   * before any work: ProxyResult.engineWorked): its tokens leave
   * the window too, as if never admitted. Otherwise, with `usedTokens` (prompt + completion, as
   * the backend counted them), what it used over what it was charged at admission is charged now:
   * a request without max_tokens is charged an estimate of its output, and may generate to the
   * end of the context.
   */
  end(refund?: boolean, usedTokens?: number | null): void;
}

/** The peers' summed usage of one tenant (from their snapshots). */
export interface RemoteTenant {
  inflight: number;
  tokens: number;
}

class TokenWindow {
  total = 0;
  readonly #buckets: Float64Array;
  readonly #bucketMs: number;
  #epoch = Number.NEGATIVE_INFINITY;

  constructor(bucketMs: number, buckets: number) {
    this.#bucketMs = bucketMs;
    this.#buckets = new Float64Array(buckets);
  }

  /**
   * Adds `tokens` to the newest bucket and returns its epoch. Invariant: the tokens are in that
   * bucket, which after a clock stepped back (less than the window) is not the bucket of `now`:
   * whoever takes them back names the epoch returned here, never a time.
   */
  add(now: number, tokens: number): number {
    this.advance(now);
    const n = this.#buckets.length;
    const i = mod(this.#epoch, n);
    this.#buckets[i] = (this.#buckets[i] as number) + tokens;
    this.total += tokens;
    return this.#epoch;
  }

  advance(now: number): void {
    const epoch = Math.floor(now / this.#bucketMs);
    const n = this.#buckets.length;
    if (epoch <= this.#epoch) {
      // A wall clock stepped back by more than the window starts it afresh (as SlidingWindow
      // does): otherwise a tenant over its budget then would stay refused until the clock caught up.
      if (epoch < this.#epoch - n) {
        this.#buckets.fill(0);
        this.total = 0;
        this.#epoch = epoch;
      }
      return;
    }
    const from = Math.max(this.#epoch + 1, epoch - n + 1);
    for (let e = from; e <= epoch; e++) {
      const i = mod(e, n);
      this.total -= this.#buckets[i] as number;
      this.#buckets[i] = 0;
    }
    this.#epoch = epoch;
  }

  /** Takes back `tokens` added to the bucket of `epoch` (add's answer), if it is still in the window. */
  remove(epoch: number, tokens: number): void {
    const n = this.#buckets.length;
    if (epoch > this.#epoch || epoch <= this.#epoch - n) return;
    const i = mod(epoch, n);
    const take = Math.min(tokens, this.#buckets[i] as number);
    this.#buckets[i] = (this.#buckets[i] as number) - take;
    this.total -= take;
  }

  /**
   * Milliseconds until at least `needed` tokens have left the window (this instance's buckets, the
   * oldest first); the whole window length when they never would.
   */
  msUntilFreed(now: number, needed: number): number {
    this.advance(now);
    const n = this.#buckets.length;
    let freed = 0;
    // The k-th oldest bucket holds epoch (newest − n + 1 + k) and leaves the window when the
    // newest epoch reaches newest + 1 + k.
    for (let k = 0; k < n; k++) {
      freed += this.#buckets[mod(this.#epoch + 1 + k, n)] as number;
      if (freed >= needed) return Math.max(0, (this.#epoch + 1 + k) * this.#bucketMs - now);
    }
    return n * this.#bucketMs;
  }
}

interface LocalTenant {
  inflight: number;
  window: TokenWindow;
}

/** Bounded as a backend lease's counts are (leases.ts), so that the window's sums stay exact. */
function bounded(n: number): number {
  return Number.isFinite(n) && n > 0 ? Math.min(n, MAX_LEASE_COUNT) : 0;
}

export class TenantUsageTable {
  readonly windowMs: number;
  readonly #local = new Map<string, LocalTenant>();
  readonly #bucketMs: number;
  readonly #buckets: number;
  readonly #sweepAt: number;

  constructor(
    shape: { bucketMs: number; buckets: number; sweepAt?: number } = { bucketMs: 1_000, buckets: 60 },
  ) {
    this.#bucketMs = shape.bucketMs;
    this.#buckets = shape.buckets;
    this.#sweepAt = shape.sweepAt ?? MAX_TENANTS;
    this.windowMs = shape.bucketMs * shape.buckets;
  }

  /** Tenants tracked now. */
  get size(): number {
    return this.#local.size;
  }

  /**
   * Counts one admitted request (and its tokens, now) until the lease ends. `clock` reads the time
   * an excess is charged at when the lease ends (the admission's `now` without it).
   */
  lease(tenant: string, tokens: number, now: number, clock: () => number = () => now): TenantLease {
    const t = this.#tenant(tenant, now);
    t.inflight++;
    const charged = bounded(tokens);
    const chargedEpoch = t.window.add(now, charged);
    let open = true;
    return {
      end(refund = false, usedTokens = null) {
        if (!open) return;
        open = false;
        t.inflight--;
        if (refund) {
          if (charged > 0) t.window.remove(chargedEpoch, charged);
        } else if (usedTokens !== null) {
          const excess = bounded(usedTokens - charged);
          if (excess > 0) t.window.add(clock(), excess);
        }
      },
    };
  }

  /** This instance's usage of `tenant`. */
  local(tenant: string, now: number): TenantUsage {
    const t = this.#local.get(tenant);
    if (t === undefined) return { inflight: 0, tokens: 0 };
    t.window.advance(now);
    return { inflight: t.inflight, tokens: t.window.total };
  }

  /**
   * When `needed` tokens of this instance's window will have expired, in ms from now. Tokens this
   * instance never saw (the tenant's usage on peers: only their totals are shared) are known to
   * leave within the window, so what the local window cannot free is the whole window away.
   */
  msUntilFreed(tenant: string, now: number, needed: number): number {
    return this.#local.get(tenant)?.window.msUntilFreed(now, needed) ?? this.windowMs;
  }

  /** Every tenant with usage, for the snapshot. */
  *entries(now: number): Iterable<[string, TenantUsage]> {
    for (const [name, t] of this.#local) {
      t.window.advance(now);
      if (t.inflight === 0 && t.window.total === 0) continue;
      yield [name, { inflight: t.inflight, tokens: t.window.total }];
    }
  }

  #tenant(name: string, now: number): LocalTenant {
    let t = this.#local.get(name);
    if (t === undefined) {
      if (this.#local.size >= this.#sweepAt) {
        for (const [other, u] of this.#local) {
          u.window.advance(now);
          if (u.inflight === 0 && u.window.total === 0) this.#local.delete(other);
        }
      }
      t = { inflight: 0, window: new TokenWindow(this.#bucketMs, this.#buckets) };
      this.#local.set(name, t);
    }
    return t;
  }
}

function mod(a: number, n: number): number {
  return ((a % n) + n) % n;
}
