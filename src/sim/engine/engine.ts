// One simulated vLLM v1 engine: continuous batching under a per-step token budget, chunked
// prefill, a KV block pool with automatic prefix caching, recompute preemption, and step
// durations from the profile's roofline. See README.md next to this file for what it leaves out.

import { blockHashes, hashBlock, ROOT_HASH, saltedRoot } from '../../prompt/chain-hash.ts';
import { type EngineClock, realClock } from './clock.ts';
import { Deque } from './deque.ts';
import { BlockPool } from './kv-cache.ts';
import type { GpuProfile, StepShape } from './profile-types.ts';
import { stepTimeMs } from './step-time.ts';
import { pickTokenId } from './token-ids.ts';
import type {
  Engine,
  EngineObserver,
  EngineRequestSpec,
  EngineSink,
  EngineStats,
  FinishReason,
} from './types.ts';

export interface EngineOptions {
  /** Wall milliseconds per simulated millisecond (0.1 runs ten times faster). */
  timeScale: number;
  observer?: EngineObserver;
  /** Time source and timers together, e.g. a VirtualClock for tests and sweeps. */
  clock?: EngineClock;
  /** Output token id at position `index` for `seed` (default pickTokenId: cl100k common words). */
  tokenId?: (seed: number, index: number) => number;
}

/**
 * A step that ends this many wall ms after its target starts the next step from "now" instead
 * of the target: a blocked event loop must not be replayed as a burst of back-to-back steps.
 */
const MAX_LAG_MS = 50;

type Place = 'waiting' | 'running' | 'gone';

interface Req {
  readonly id: string;
  readonly spec: EngineRequestSpec;
  readonly sink: EngineSink;
  readonly promptLen: number;
  /** Tokens to generate: maxTokens, or min(maxTokens, naturalLength) unless ignoreEos. */
  readonly limit: number;
  readonly slow: number;
  readonly arrivalMs: number;
  place: Place;
  /** The parent of its first block's hash: the root, or one named after its cache_salt. */
  readonly root: number;
  /** Chained hashes of the leading full blocks whose tokens are known (prompt, then output). */
  hashes: number[];
  /** Block table; block i holds tokens [i·B, (i+1)·B). */
  blocks: number[];
  /** Leading blocks registered in the prefix cache. */
  cachedBlocks: number;
  numComputed: number;
  /** Prompt plus generated tokens; the last generated one is not computed yet. */
  numTokens: number;
  outputs: number;
  /** Tokens scheduled in the step under way. */
  stepNew: number;
  scheduledMs: number;
  firstTokenMs: number;
  lastTokenMs: number;
}

class SimEngine implements Engine {
  private readonly p: GpuProfile;
  private readonly B: number;
  private readonly pool: BlockPool;
  private readonly clock: EngineClock;
  private readonly timeScale: number;
  private readonly observer: EngineObserver | undefined;
  private readonly tokenId: (seed: number, index: number) => number;
  private readonly byId = new Map<string, Req>();
  /** Admission order: running.pop() is the most recently admitted (the preemption victim). */
  private running: Req[] = [];
  /** FCFS; may hold `gone` entries (aborted while waiting), skipped when they reach the front. */
  private readonly waiting = new Deque<Req>();
  private waitingCount = 0;
  private scheduled: Req[] = [];
  private readonly scratch: Int32Array;
  private slowdown = 1;
  private phase: 'idle' | 'waking' | 'stepping' = 'idle';
  private cancelTimer: (() => void) | null = null;
  /** When the step under way ends (while `phase` is 'stepping'). */
  private stepEndMs = 0;
  /** Bumped by reset/close so a step that is being finished stops touching dropped state. */
  private epoch = 0;
  private closed = false;
  private readonly counters = {
    prefixCacheQueries: 0,
    prefixCacheHits: 0,
    preemptions: 0,
    promptTokens: 0,
    generationTokens: 0,
    steps: 0,
  };

  constructor(profile: GpuProfile, opts: EngineOptions) {
    if (!(opts.timeScale > 0)) throw new RangeError('timeScale must be > 0');
    this.p = profile;
    this.B = profile.blockSize;
    this.pool = new BlockPool(profile.numGpuBlocks, profile.blockSize);
    this.clock = opts.clock ?? realClock();
    this.timeScale = opts.timeScale;
    this.observer = opts.observer;
    this.tokenId = opts.tokenId ?? pickTokenId;
    this.scratch = new Int32Array(profile.blockSize);
  }

  add(spec: EngineRequestSpec, sink: EngineSink): void {
    if (this.closed) throw new Error('engine is closed');
    if (this.byId.has(spec.id)) throw new Error(`duplicate request id ${spec.id}`);
    const promptLen = spec.promptTokens.length;
    if (promptLen < 1) throw new RangeError('prompt must have at least one token');
    if (!(spec.maxTokens >= 1)) throw new RangeError('maxTokens must be >= 1');
    const limit = spec.ignoreEos ? spec.maxTokens : Math.max(1, Math.min(spec.maxTokens, spec.naturalLength));
    // A request that cannot fit the whole cache alone would preempt itself forever.
    if (Math.ceil((promptLen + limit) / this.B) > this.p.numGpuBlocks - 1) {
      throw new RangeError(
        `request needs ${promptLen + limit} tokens of KV; the cache holds ${(this.p.numGpuBlocks - 1) * this.B}`,
      );
    }
    const root = rootOf(spec.cacheSalt);
    const r: Req = {
      id: spec.id,
      spec,
      sink,
      promptLen,
      limit,
      slow: spec.slowFactor !== undefined && spec.slowFactor > 0 ? spec.slowFactor : 1,
      arrivalMs: this.clock.now(),
      place: 'waiting',
      root,
      hashes: blockHashes(spec.promptTokens, this.B, [], root),
      blocks: [],
      cachedBlocks: 0,
      numComputed: 0,
      numTokens: promptLen,
      outputs: 0,
      stepNew: 0,
      scheduledMs: Number.NaN,
      firstTokenMs: Number.NaN,
      lastTokenMs: Number.NaN,
    };
    this.byId.set(r.id, r);
    this.waiting.pushBack(r);
    this.waitingCount++;
    this.wake();
  }

  abort(id: string): boolean {
    const r = this.byId.get(id);
    if (r === undefined) return false;
    this.byId.delete(id);
    if (r.place === 'running') {
      const i = this.running.indexOf(r);
      if (i >= 0) this.running.splice(i, 1);
      this.pool.releaseAll(r.blocks);
      r.blocks = [];
    } else if (r.place === 'waiting') {
      this.waitingCount--;
    }
    r.place = 'gone';
    return true;
  }

  stats(): EngineStats {
    return {
      running: this.running.length,
      waiting: this.waitingCount,
      kvCacheUsage: this.pool.usage(),
      numGpuBlocks: this.p.numGpuBlocks,
      blockSize: this.B,
      ...this.counters,
    };
  }

  cachedPrefixTokens(tokens: readonly number[], cacheSalt?: string): number {
    const hashes = blockHashes(tokens, this.B, [], rootOf(cacheSalt));
    return this.pool.longestHit(hashes, hashes.length) * this.B;
  }

  setSlowdown(factor: number): void {
    if (!(factor > 0)) throw new RangeError('slowdown factor must be > 0');
    const was = this.slowdown;
    this.slowdown = factor;
    // Invariant: the speed changes at once, for the step under way too: its work not yet done is
    // timed anew at the new factor. (Timed once at its start, a step a slow fault stretched
    // ran on at that pace after the fault was reset, for up to the factor times a step.)
    if (this.phase === 'stepping' && this.cancelTimer !== null && factor !== was) {
      const now = this.clock.now();
      this.armStepEnd(now + (Math.max(0, this.stepEndMs - now) * factor) / was);
    }
  }

  reset(opts?: { restart?: boolean }): void {
    this.cancelTimer?.();
    this.cancelTimer = null;
    this.epoch++;
    for (const r of this.running) this.pool.releaseAll(r.blocks);
    for (const r of this.byId.values()) r.place = 'gone';
    this.byId.clear();
    this.running = [];
    this.scheduled = [];
    this.waiting.clear();
    this.waitingCount = 0;
    if (opts?.restart) {
      this.pool.clear();
      const c = this.counters;
      for (const k of Object.keys(c) as (keyof typeof c)[]) c[k] = 0;
    }
    this.phase = 'idle';
  }

  close(): void {
    this.reset();
    this.closed = true;
  }

  // --- step loop -------------------------------------------------------------------------

  private wake(): void {
    if (this.phase !== 'idle') return;
    this.phase = 'waking';
    this.cancelTimer = this.clock.setTimer(() => {
      this.cancelTimer = null;
      this.beginStep(this.clock.now());
    }, 0);
  }

  /** Schedules a batch starting at `startMs` and arms the timer for its end; idles if no work. */
  private beginStep(startMs: number): void {
    const shape = this.schedule();
    if (shape === null) {
      this.phase = 'idle';
      return;
    }
    this.phase = 'stepping';
    this.counters.steps++;
    let slow = 1;
    for (const r of this.scheduled) if (r.slow > slow) slow = r.slow;
    this.armStepEnd(startMs + stepTimeMs(this.p, shape) * this.slowdown * slow * this.timeScale);
  }

  /** Ends the step under way at `endMs` (in place of the end it had). */
  private armStepEnd(endMs: number): void {
    this.cancelTimer?.();
    this.stepEndMs = endMs;
    this.cancelTimer = this.clock.setTimer(() => {
      this.cancelTimer = null;
      this.endStep(endMs);
    }, endMs - this.clock.now());
  }

  private endStep(endMs: number): void {
    const epoch = this.epoch;
    this.finishStep();
    if (this.epoch !== epoch) return;
    const now = this.clock.now();
    this.beginStep(now - endMs > MAX_LAG_MS ? now : endMs);
  }

  /**
   * vLLM v1 scheduling: RUNNING requests first (1 token per decode, the next chunk for an
   * unfinished prefill), then WAITING ones in FCFS order while budget and max_num_seqs allow.
   * Returns null when nothing can be scheduled.
   */
  private schedule(): StepShape | null {
    const B = this.B;
    const pool = this.pool;
    const scheduled = this.scheduled;
    scheduled.length = 0;
    let budget = this.p.maxNumBatchedTokens;
    let prefillTokens = 0;
    let decodeSeqs = 0;
    let contextTokens = 0;
    let prefillAttnPairs = 0;
    let preempted = false;

    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const r = this.running[i]!;
      const numNew = Math.min(r.numTokens - r.numComputed, budget);
      if (numNew <= 0) continue;
      const need = Math.ceil((r.numComputed + numNew) / B) - r.blocks.length;
      let selfPreempted = false;
      while (need > pool.numFree) {
        const victim = this.running.pop()!;
        this.preempt(victim);
        preempted = true;
        if (victim === r) {
          selfPreempted = true;
          break;
        }
      }
      if (selfPreempted) break;
      for (let k = 0; k < need; k++) r.blocks.push(pool.allocate());
      this.cacheFullBlocks(r, r.numComputed + numNew);
      const decoding = r.outputs > 0 && numNew === 1 && r.numComputed === r.numTokens - 1;
      if (decoding) decodeSeqs++;
      else {
        prefillTokens += numNew;
        prefillAttnPairs += attnPairs(r.numComputed, numNew);
      }
      r.stepNew = numNew;
      contextTokens += r.numComputed + numNew;
      budget -= numNew;
      scheduled.push(r);
    }

    // vLLM admits nothing in a step that had to preempt.
    while (!preempted && budget > 0 && this.running.length < this.p.maxNumSeqs) {
      const r = this.waiting.peekFront();
      if (r === undefined) break;
      if (r.place === 'gone') {
        this.waiting.shift();
        continue;
      }
      // At least the last token is computed, so a full hit still recomputes its last block.
      const reads = r.spec.skipReadingPrefixCache !== true;
      const hitBlocks = reads ? pool.longestHit(r.hashes, Math.floor((r.numTokens - 1) / B)) : 0;
      const hitTokens = hitBlocks * B;
      const numNew = Math.min(r.numTokens - hitTokens, budget);
      const need = Math.ceil((hitTokens + numNew) / B) - hitBlocks;
      let evictableHits = 0;
      for (let j = 0; j < hitBlocks; j++) {
        if (pool.refCountOf(pool.lookup(r.hashes[j]!)) === 0) evictableHits++;
      }
      if (need + evictableHits > pool.numFree) break;
      this.waiting.shift();
      this.waitingCount--;
      // vLLM (since 0.11, PR #25787) counts a request's lookup once: a re-admission after
      // preemption mostly hits its own freed blocks, and would lift the hit rate of a fleet that
      // preempts (an overloaded one) over what its routing earned.
      // A request that skips the cache read is not a lookup (vLLM returns before recording one).
      if (Number.isNaN(r.scheduledMs) && reads) {
        this.counters.prefixCacheQueries += r.numTokens;
        this.counters.prefixCacheHits += hitTokens;
      }
      for (let j = 0; j < hitBlocks; j++) {
        const b = pool.lookup(r.hashes[j]!);
        pool.touch(b);
        r.blocks.push(b);
      }
      for (let k = 0; k < need; k++) r.blocks.push(pool.allocate());
      r.cachedBlocks = hitBlocks;
      r.numComputed = hitTokens;
      this.cacheFullBlocks(r, hitTokens + numNew);
      r.place = 'running';
      this.running.push(r);
      r.stepNew = numNew;
      prefillTokens += numNew;
      prefillAttnPairs += attnPairs(hitTokens, numNew);
      contextTokens += hitTokens + numNew;
      budget -= numNew;
      scheduled.push(r);
      if (Number.isNaN(r.scheduledMs)) {
        r.scheduledMs = this.clock.now();
        r.sink.onScheduled?.(r.scheduledMs);
      }
    }

    if (scheduled.length === 0) return null;
    return { prefillTokens, decodeSeqs, seqs: scheduled.length, contextTokens, prefillAttnPairs };
  }

  /** Recompute preemption: drop the KV (hashes stay cached) and requeue at the front. */
  private preempt(r: Req): void {
    this.pool.releaseAll(r.blocks);
    r.blocks = [];
    r.cachedBlocks = 0;
    r.numComputed = 0;
    r.place = 'waiting';
    this.waiting.pushFront(r);
    this.waitingCount++;
    this.counters.preemptions++;
  }

  /** Advances every request of the step that is still here and emits the tokens it produced. */
  private finishStep(): void {
    const now = this.clock.now();
    let finishedAny = false;
    // A reset from a callback replaces this.scheduled; the loop keeps walking the old batch,
    // whose requests are all `gone` by then.
    for (const r of this.scheduled) {
      if (r.place !== 'running') continue;
      r.numComputed += r.stepNew;
      r.stepNew = 0;
      if (r.numComputed < r.numTokens) continue;
      if (this.emit(r, now)) finishedAny = true;
    }
    if (finishedAny) this.running = this.running.filter((r) => r.place === 'running');
  }

  /**
   * Registers the blocks that `upTo` tokens fill, hashing output blocks on the way. Called when a
   * step is scheduled, for what it will compute, as vLLM's allocate_slots caches blocks: a request
   * admitted later in the same step (or a later chunk) hits them, instead of computing the same
   * prefix again beside them.
   */
  private cacheFullBlocks(r: Req, upTo: number): void {
    const B = this.B;
    const full = Math.floor(upTo / B);
    for (let j = r.cachedBlocks; j < full; j++) {
      if (j >= r.hashes.length) {
        // A prompt shorter than a block hashed none: the first block output fills starts the chain
        // at the root, as blockHashes starts every prompt's (the next turn's prompt holds it).
        const parent = j === 0 ? r.root : r.hashes[j - 1]!;
        const base = j * B;
        for (let k = 0; k < B; k++) this.scratch[k] = this.tokenAt(r, base + k);
        r.hashes.push(hashBlock(parent, this.scratch, 0, B));
      }
      this.pool.cache(r.blocks[j]!, r.hashes[j]!);
    }
    if (full > r.cachedBlocks) r.cachedBlocks = full;
  }

  private tokenAt(r: Req, pos: number): number {
    return pos < r.promptLen ? r.spec.promptTokens[pos]! : this.tokenId(r.spec.seed, pos - r.promptLen);
  }

  /** Samples the next token of `r`; returns true when it was the last one. */
  private emit(r: Req, now: number): boolean {
    const index = r.outputs;
    const tokenId = this.tokenId(r.spec.seed, index);
    r.outputs++;
    r.numTokens++;
    this.counters.generationTokens++;
    if (index === 0) {
      r.firstTokenMs = now;
      this.counters.promptTokens += r.promptLen;
      this.observer?.onFirstToken?.((now - r.arrivalMs) / 1000);
    } else {
      this.observer?.onInterTokenLatency?.((now - r.lastTokenMs) / 1000);
    }
    r.lastTokenMs = now;
    if (r.outputs < r.limit) {
      r.sink.onToken(tokenId, index, null);
      return false;
    }
    // naturalLength counts the tokens before EOS, so when it equals maxTokens the cap hits first.
    const reason: FinishReason = r.outputs >= r.spec.maxTokens ? 'length' : 'stop';
    r.place = 'gone';
    this.byId.delete(r.id);
    this.pool.releaseAll(r.blocks);
    r.blocks = [];
    r.sink.onToken(tokenId, index, reason);
    this.observer?.onRequestFinished?.({
      id: r.id,
      reason,
      promptTokens: r.promptLen,
      generationTokens: r.outputs,
      queueS: (r.scheduledMs - r.arrivalMs) / 1000,
      ttftS: (r.firstTokenMs - r.arrivalMs) / 1000,
      e2eS: (now - r.arrivalMs) / 1000,
      prefillS: (r.firstTokenMs - r.scheduledMs) / 1000,
      decodeS: (now - r.firstTokenMs) / 1000,
    });
    return true;
  }
}

export function createEngine(profile: GpuProfile, opts: EngineOptions): Engine {
  return new SimEngine(profile, opts);
}

/** Causal attention's query-context pairs for `n` new tokens after `c` computed ones. */
function attnPairs(c: number, n: number): number {
  return n * c + (n * (n + 1)) / 2;
}

/** The parent of a prompt's first block: vLLM mixes a cache_salt into that block's hash. */
function rootOf(cacheSalt: string | undefined): number {
  return cacheSalt === undefined ? ROOT_HASH : saltedRoot(cacheSalt);
}
