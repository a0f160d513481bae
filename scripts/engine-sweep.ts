// Calibration sweep of the simulated engine alone (no HTTP): C closed-loop clients on a virtual
// clock, each sending a request as soon as its previous one finished. Prints p50 TTFT (client
// side, including the profile's frontend overhead), p50 TPOT and output throughput per level.
//
//   npx tsx scripts/engine-sweep.ts [profile] [concurrencies] [in-lo:in-hi] [out-lo:out-hi] [seconds]
//   npx tsx scripts/engine-sweep.ts llama3-8b-h100 1,4,16,64 100:300 100:300 120
//   npx tsx scripts/engine-sweep.ts llama3-8b-h100 burst1000      (vLLM PR #18566's ShareGPT burst)
//   npx tsx scripts/engine-sweep.ts llama3-8b-h100 load 50 - 10    (8 replicas, 50 req/s, 10 s, real timers)

import { monitorEventLoopDelay } from 'node:perf_hooks';
import { percentile } from '../src/bench/metrics.ts';
import { VirtualClock } from '../src/sim/engine/clock.ts';
import { createEngine } from '../src/sim/engine/engine.ts';
import { getProfile } from '../src/sim/profiles.ts';

function range(arg: string | undefined, dflt: [number, number]): [number, number] {
  if (arg === undefined) return dflt;
  const [lo, hi] = arg.split(':').map(Number);
  return [lo!, hi ?? lo!];
}

function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** numpy's linear median (src/bench/metrics.ts); NaN with no sample. */
function p50(xs: number[]): number {
  return xs.length === 0
    ? Number.NaN
    : percentile(
        [...xs].sort((a, b) => a - b),
        50,
      );
}

export interface SweepPoint {
  concurrency: number;
  ttftP50Ms: number;
  tpotP50Ms: number;
  outputTokPerS: number;
  requests: number;
  preemptions: number;
}

export function sweepPoint(
  profileName: string,
  concurrency: number,
  inLen: [number, number],
  outLen: [number, number],
  seconds: number,
): SweepPoint {
  const profile = getProfile(profileName);
  const clock = new VirtualClock();
  const engine = createEngine(profile, { timeScale: 1, clock });
  const rand = mulberry32(concurrency * 7919 + 1);
  const warmupMs = 5000;
  const endMs = warmupMs + seconds * 1000;
  const ttfts: number[] = [];
  const tpots: number[] = [];
  let outTokens = 0;
  let next = 0;
  const pick = ([lo, hi]: [number, number]) => lo + Math.floor(rand() * (hi - lo + 1));

  const send = (): void => {
    const sentMs = clock.now();
    if (sentMs >= endMs) return;
    const id = `r${next++}`;
    const promptTokens = Array.from({ length: pick(inLen) }, () => Math.floor(rand() * 100000));
    const n = pick(outLen);
    let firstMs = 0;
    // ±50% jitter on the frontend delay keeps closed-loop clients from phase-locking to steps.
    clock.setTimer(
      () => {
        engine.add(
          { id, promptTokens, maxTokens: n, naturalLength: n, ignoreEos: true, seed: next },
          {
            onToken(_t, index, finish) {
              const now = clock.now();
              if (index === 0) firstMs = now;
              if (sentMs >= warmupMs && now <= endMs) outTokens++;
              if (finish === null) return;
              if (sentMs >= warmupMs && now <= endMs) {
                ttfts.push(firstMs - sentMs);
                if (index > 0) tpots.push((now - firstMs) / index);
              }
              send();
            },
          },
        );
      },
      profile.frontendOverheadMs * (0.5 + rand()),
    );
  };
  for (let c = 0; c < concurrency; c++) send();
  clock.run(endMs + 60000);
  const stats = engine.stats();
  engine.close();
  return {
    concurrency,
    ttftP50Ms: p50(ttfts),
    tpotP50Ms: p50(tpots),
    outputTokPerS: outTokens / seconds,
    requests: ttfts.length,
    preemptions: stats.preemptions,
  };
}

export interface BurstResult {
  requestsPerS: number;
  outputTokPerS: number;
  meanTtftMs: number;
  medianTpotMs: number;
  medianItlMs: number;
}

/**
 * vLLM's `bench serve --request-rate inf`: `n` requests at t=0 with heavy-tailed chat lengths
 * (log-normal, σ = 1, means `inMean` / `outMean`, prompt ≤ 1024 and prompt + output ≤ 2048 as
 * vLLM's ShareGPT filter keeps them).
 */
export function burst(profileName: string, n: number, inMean: number, outMean: number): BurstResult {
  const profile = getProfile(profileName);
  const clock = new VirtualClock();
  const engine = createEngine(profile, { timeScale: 1, clock });
  const rand = mulberry32(n);
  const logNormal = (mean: number): number => {
    const u = Math.max(rand(), 1e-12);
    const z = Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rand());
    return Math.max(4, Math.round(Math.exp(Math.log(mean) - 0.5 + z)));
  };
  const ttfts: number[] = [];
  const tpots: number[] = [];
  const itls: number[] = [];
  let outTokens = 0;
  let lastMs = 0;
  for (let i = 0; i < n; i++) {
    const inLen = Math.min(1024, logNormal(inMean));
    const outLen = Math.min(2048 - inLen, logNormal(outMean));
    const promptTokens = Array.from({ length: inLen }, () => Math.floor(rand() * 100000));
    let firstMs = 0;
    let prevMs = 0;
    clock.setTimer(() => {
      engine.add(
        { id: `b${i}`, promptTokens, maxTokens: outLen, naturalLength: outLen, ignoreEos: true, seed: i },
        {
          onToken(_t, index, finish) {
            const now = clock.now();
            outTokens++;
            if (index === 0) firstMs = now;
            else itls.push(now - prevMs);
            prevMs = now;
            if (finish === null) return;
            ttfts.push(firstMs);
            if (index > 0) tpots.push((now - firstMs) / index);
            lastMs = Math.max(lastMs, now);
          },
        },
      );
    }, profile.frontendOverheadMs);
  }
  clock.run();
  engine.close();
  return {
    requestsPerS: n / (lastMs / 1000),
    outputTokPerS: outTokens / (lastMs / 1000),
    meanTtftMs: ttfts.reduce((a, b) => a + b, 0) / ttfts.length,
    medianTpotMs: p50(tpots),
    medianItlMs: p50(itls),
  };
}

/**
 * Event-loop cost on real timers: `replicas` engines at time scale 1 share Poisson arrivals of
 * `rate` req/s (round robin) with `promptLen`-token prompts and 100–300 output tokens.
 */
export async function loadTest(
  profileName: string,
  replicas: number,
  rate: number,
  promptLen: number,
  seconds: number,
): Promise<{ p50DelayMs: number; p99DelayMs: number; maxDelayMs: number; finished: number; tokens: number }> {
  const profile = getProfile(profileName);
  const engines = Array.from({ length: replicas }, () => createEngine(profile, { timeScale: 1 }));
  const rand = mulberry32(rate);
  const h = monitorEventLoopDelay({ resolution: 1 });
  let finished = 0;
  let tokens = 0;
  let n = 0;
  const endAt = performance.now() + seconds * 1000;
  h.enable();
  await new Promise<void>((resolve) => {
    const arrive = (): void => {
      if (performance.now() >= endAt) {
        resolve();
        return;
      }
      const promptTokens = Array.from({ length: promptLen }, () => Math.floor(rand() * 100000));
      const out = 100 + Math.floor(rand() * 201);
      const i = n++;
      engines[i % replicas]!.add(
        { id: `l${i}`, promptTokens, maxTokens: out, naturalLength: out, ignoreEos: true, seed: i },
        {
          onToken(_t, _index, finish) {
            tokens++;
            if (finish !== null) finished++;
          },
        },
      );
      setTimeout(arrive, (-Math.log(1 - rand()) / rate) * 1000);
    };
    arrive();
  });
  h.disable();
  for (const e of engines) e.close();
  const ms = (ns: number) => ns / 1e6;
  return {
    p50DelayMs: ms(h.percentile(50)),
    p99DelayMs: ms(h.percentile(99)),
    maxDelayMs: ms(h.max),
    finished,
    tokens,
  };
}

const isMain = process.argv[1] !== undefined && import.meta.url.endsWith(process.argv[1].replace(/\\/g, '/'));
if (isMain) {
  const [, , name = 'llama3-8b-h100', conc = '1,4,16,64', inArg, outArg, secArg] = process.argv;
  if (conc === 'load') {
    const r = await loadTest(name, 8, Number(inArg ?? 50), 2000, Number(secArg ?? 10));
    console.log(
      `${name} 8 replicas load: ${JSON.stringify(r, (_k, v) => (typeof v === 'number' ? +v.toFixed(2) : v))}`,
    );
    process.exit(0);
  }
  if (conc.startsWith('burst')) {
    const r = burst(name, Number(conc.slice(5)) || 1000, 230, 203);
    console.log(
      `${name} burst: ${JSON.stringify(r, (_k, v) => (typeof v === 'number' ? +v.toFixed(2) : v))}`,
    );
    process.exit(0);
  }
  const inLen = range(inArg, [100, 300]);
  const outLen = range(outArg, [100, 300]);
  const seconds = Number(secArg ?? 120);
  console.log(`${name}  in ${inLen.join('-')}  out ${outLen.join('-')}  ${seconds}s virtual per point`);
  console.log('conc  ttft_p50_ms  tpot_p50_ms  out_tok_per_s  requests  preemptions');
  for (const c of conc.split(',').map(Number)) {
    const r = sweepPoint(name, c, inLen, outLen, seconds);
    console.log(
      `${String(c).padStart(4)}  ${r.ttftP50Ms.toFixed(1).padStart(11)}  ${r.tpotP50Ms.toFixed(2).padStart(11)}  ${r.outputTokPerS.toFixed(0).padStart(13)}  ${String(r.requests).padStart(8)}  ${String(r.preemptions).padStart(11)}`,
    );
  }
}
