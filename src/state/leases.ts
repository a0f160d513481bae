// This instance's in-flight work per backend, as leases. Invariant: a counter equals the sum over
// the leases begun and not yet ended, because a lease subtracts exactly what it added, once, however
// many times end() is called. Other instances learn these counts from this instance's snapshot,
// which expires with its heartbeat, so a crashed instance's leases expire with it.

export interface InflightCounts {
  requests: number;
  promptTokens: number;
  /** Output tokens the requests are expected to produce (e.g. max_tokens or an estimate). */
  expectedOutputTokens: number;
  /** Uncached prompt tokens of requests that have not produced their first token yet. */
  pendingPrefillTokens: number;
}

export interface LeaseTokens {
  promptTokens: number;
  expectedOutputTokens: number;
  /** Prompt tokens the backend must compute (not in its prefix cache); defaults to promptTokens. */
  uncachedPromptTokens?: number;
}

export interface Lease {
  readonly backend: string;
  /** The first token arrived: this request's prefill no longer counts as pending. Idempotent. */
  prefillDone(): void;
  /** The request left the backend (any outcome). Idempotent. */
  end(): void;
}

export function zeroCounts(): InflightCounts {
  return { requests: 0, promptTokens: 0, expectedOutputTokens: 0, pendingPrefillTokens: 0 };
}

export function addCounts(into: InflightCounts, c: InflightCounts): void {
  into.requests += c.requests;
  into.promptTokens += c.promptTokens;
  into.expectedOutputTokens += c.expectedOutputTokens;
  into.pendingPrefillTokens += c.pendingPrefillTokens;
}

/**
 * A lease's tokens counted at most this many: sums of up to 2^21 such leases stay exact integers
 * (below 2^53), so adding and then subtracting one leaves every other lease's part intact.
 */
export const MAX_LEASE_COUNT = 2 ** 32;

/**
 * Non-negative integer at most MAX_LEASE_COUNT, so one bad caller value cannot poison a shared
 * counter: not a NaN, and not a finite 1e300, which absorbs every other lease's add and subtract
 * while it is open and leaves the counter off by their sum for good.
 */
function count(v: number | undefined, fallback: number): number {
  const n = v === undefined ? fallback : v;
  return Number.isFinite(n) && n > 0 ? Math.min(Math.round(n), MAX_LEASE_COUNT) : 0;
}

/** Told when a lease's prefill is counted as pending and when it stops being (after the counts change). */
export interface PrefillListener {
  dispatched(tokens: number): void;
  settled(): void;
}

/** Begins a lease on `counts`. */
export function beginLease(
  backend: string,
  counts: InflightCounts,
  tokens: LeaseTokens,
  prefill?: PrefillListener,
): Lease {
  const prompt = count(tokens.promptTokens, 0);
  const output = count(tokens.expectedOutputTokens, 0);
  const uncached = Math.min(prompt, count(tokens.uncachedPromptTokens, prompt));
  counts.requests++;
  counts.promptTokens += prompt;
  counts.expectedOutputTokens += output;
  counts.pendingPrefillTokens += uncached;
  prefill?.dispatched(uncached);
  let prefillPending = true;
  let open = true;
  const prefillDone = () => {
    if (!open || !prefillPending) return;
    prefillPending = false;
    counts.pendingPrefillTokens -= uncached;
    prefill?.settled();
  };
  return {
    backend,
    prefillDone,
    end() {
      if (!open) return;
      prefillDone();
      open = false;
      counts.requests--;
      counts.promptTokens -= prompt;
      counts.expectedOutputTokens -= output;
    },
  };
}
