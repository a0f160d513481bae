import type { Server } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { type Fleet, startFleet } from '../../src/sim/fleet.ts';
import { createLiveState } from '../../src/state/index.ts';
import { DEFAULT_KV_TOKENS } from '../../src/state/prefix-index.ts';
import { TelemetryScraper } from '../../src/state/scraper.ts';
import { closeServer, metricsServer, vllmPage } from './fixtures/metrics-server.ts';
import { trackHandles } from './handles.ts';

async function until(cond: () => boolean, timeoutMs: number, what: string): Promise<number> {
  const start = performance.now();
  while (!cond()) {
    if (performance.now() - start > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
  return performance.now() - start;
}

describe('vLLM telemetry scraper', () => {
  let fleet: Fleet | undefined;
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const c of cleanups.splice(0)) await c();
    await fleet?.close();
    fleet = undefined;
  });

  /** A backend whose /metrics answers `pages` in turn (the last one again and again). */
  async function pagesServer(pages: string[]): Promise<{ url: string; server: Server }> {
    let served = 0;
    return metricsServer(() => pages[Math.min(served++, pages.length - 1)]!);
  }

  /** A live state scraping `srv` as backend x every 20 ms, with the restarts it tells; both closed after the test. */
  function scraped(srv: { url: string; server: Server }) {
    cleanups.push(() => closeServer(srv.server));
    const restarts: string[] = [];
    const state = createLiveState(
      { store: 'memory' },
      {
        backends: [{ name: 'x', url: srv.url }],
        scrape: { intervalMs: 20 },
        onBackendRestart: (n) => restarts.push(n),
      },
    );
    cleanups.push(() => state.close());
    return { state, restarts };
  }

  it('scrapes the simulator’s /metrics and follows its engine', async () => {
    fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.01 });
    const replica = fleet.replicas[0]!;
    const scraper = new TelemetryScraper({ intervalMs: 50 }, [{ name: 'sim-0', url: fleet.urls[0]! }]);
    cleanups.push(() => scraper.close());
    await until(() => scraper.get('sim-0')?.scrapedAt !== null, 2_000, 'first scrape');
    let t = scraper.get('sim-0')!;
    const engine = replica.stats().engine;
    expect(t).toMatchObject({
      running: 0,
      waiting: 0,
      blockSize: engine.blockSize,
      numGpuBlocks: engine.numGpuBlocks,
    });
    expect(t.saturated).toBe(false);
    expect(t.ageMs!).toBeLessThan(scraper.staleAfterMs);

    // Two requests with the same long prompt: the second one hits the prefix cache.
    const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(40);
    for (let i = 0; i < 2; i++) {
      const res = await fetch(`${fleet.urls[0]}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: replica.profile.model, prompt, max_tokens: 4 }),
      });
      expect(res.status).toBe(200);
      await res.text();
    }
    const want = replica.stats().engine;
    expect(want.prefixCacheHits).toBeGreaterThan(0);
    await until(() => scraper.get('sim-0')?.prefixHits === want.prefixCacheHits, 2_000, 'counters');
    t = scraper.get('sim-0')!;
    expect(t.prefixQueries).toBe(want.prefixCacheQueries);
    expect(t.prefixHitRate!).toBeGreaterThan(0);
    expect(t.prefixHitRate!).toBeLessThanOrEqual(1);
  });

  it('a backend whose scrapes stop (refuse fault) turns saturated after the staleness threshold', async () => {
    fleet = await startFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 0.01 });
    const scraper = new TelemetryScraper({ intervalMs: 50, staleAfterMs: 150, timeoutMs: 100 }, [
      { name: 'a', url: fleet.urls[0]! },
      { name: 'b', url: fleet.urls[1]! },
    ]);
    cleanups.push(() => scraper.close());
    await until(() => !scraper.get('a')!.saturated && !scraper.get('b')!.saturated, 2_000, 'first scrapes');
    const lastGood = scraper.get('a')!.scrapedAt!;
    await fleet.replicas[0]!.fault({ mode: 'refuse' });
    const faultedAt = Date.now();
    const waited = await until(() => scraper.get('a')!.saturated, 3_000, 'saturated');
    // Not before the threshold, counted from the last good scrape before the fault (measured: on a
    // busy machine the scrape timer runs late, so it may be more than one interval back; a scrape
    // that still succeeds while the fault is set only delays saturation). 2 ms: Date's rounding.
    expect(waited).toBeGreaterThanOrEqual(150 - (faultedAt - lastGood) - 2);
    const a = scraper.get('a')!;
    expect(a.ageMs!).toBeGreaterThan(150);
    expect(a.lastError).not.toBeNull();
    expect(a.consecutiveFailures).toBeGreaterThan(0);
    // The last values are kept for inspection, flagged by `saturated`.
    expect(a.running).toBe(0);
    expect(scraper.get('b')!.saturated).toBe(false);
    await fleet.replicas[0]!.reset();
    await until(() => !scraper.get('a')!.saturated, 2_000, 'recovery');
    expect(scraper.get('a')!.lastError).toBeNull();
  });

  it('a wall clock stepped back does not keep a backend whose scrapes stopped fresh', async () => {
    fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.01 });
    // The wall clock the live state gives it, which NTP or a restored VM may step.
    let stepMs = 0;
    const scraper = new TelemetryScraper(
      { intervalMs: 50, staleAfterMs: 150, timeoutMs: 100, now: () => Date.now() + stepMs },
      [{ name: 'a', url: fleet.urls[0]! }],
    );
    cleanups.push(() => scraper.close());
    await until(() => !scraper.get('a')!.saturated, 2_000, 'first scrape');
    await fleet.replicas[0]!.fault({ mode: 'refuse' });
    stepMs = -3_600_000;
    await until(() => scraper.get('a')!.saturated, 3_000, 'saturated though the clock went back an hour');
    expect(scraper.get('a')!.ageMs!).toBeGreaterThan(150);
    await fleet.replicas[0]!.reset();
  });

  it('never-scraped, non-vLLM, hanging and closed backends are saturated', async () => {
    const plain = await metricsServer(() => 'process_cpu_seconds_total 1\n');
    const hanging = await metricsServer(() => '', { hang: true });
    const good = await metricsServer(() => 'vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n');
    cleanups.push(
      () => closeServer(plain.server),
      () => closeServer(hanging.server),
    );
    const scraper = new TelemetryScraper({ intervalMs: 50, staleAfterMs: 150, timeoutMs: 100 }, [
      { name: 'plain', url: plain.url },
      { name: 'hang', url: hanging.url },
      { name: 'good', url: `${good.url}/` },
      { name: 'closed', url: 'http://127.0.0.1:1' },
    ]);
    cleanups.push(() => scraper.close());
    // Before any answer everything is saturated: unknown is not idle.
    expect(scraper.get('good')).toMatchObject({ saturated: true, ageMs: null, scrapedAt: null });
    await until(() => scraper.get('good')!.running === 1, 2_000, 'good scrape');
    await until(() => scraper.get('hang')!.consecutiveFailures > 0, 2_000, 'timeout');
    expect(scraper.get('hang')!.lastError).toMatch(/timed out/);
    expect(scraper.get('plain')!.lastError).toMatch(/num_requests_running/);
    expect(scraper.get('closed')!.lastError).not.toBeNull();
    for (const name of ['plain', 'hang', 'closed']) expect(scraper.get(name)!.saturated).toBe(true);
    expect(scraper.get('good')!.saturated).toBe(false);
    await closeServer(good.server);
    await until(() => scraper.get('good')!.saturated, 2_000, 'good → saturated');
    expect(scraper.get('unknown')).toBeUndefined();
  });

  it('setTargets adds and removes backends; close leaves no timer or socket behind', async () => {
    const tracker = trackHandles();
    let scrapes = 0;
    const srv = await metricsServer(() => {
      scrapes++;
      return 'vllm:num_requests_running 2\n';
    });
    const hanging = await metricsServer(() => '', { hang: true });
    const state = createLiveState(
      { store: 'memory' },
      { backends: [{ name: 'x', url: srv.url }], scrape: { intervalMs: 1_000, timeoutMs: 5_000 } },
    );
    await until(() => state.telemetry('x')?.running === 2, 2_000, 'scrape x');
    state.setBackends([
      { name: 'y', url: srv.url },
      { name: 'h', url: hanging.url },
    ]);
    expect(state.telemetry('x')).toBeNull();
    await until(() => state.telemetry('y')?.running === 2, 2_000, 'scrape y');
    // A scrape is in flight on the hanging backend; close() must abort it, not wait 5 s.
    const started = performance.now();
    await state.close();
    expect(performance.now() - started).toBeLessThan(1_000);
    const after = scrapes;
    await new Promise((r) => setTimeout(r, 100));
    expect(scrapes).toBe(after);
    await closeServer(srv.server);
    await closeServer(hanging.server);
    await new Promise((r) => setTimeout(r, 50));
    tracker.stop();
    expect(tracker.live().TCPWRAP ?? 0).toBe(0);
    expect(tracker.live().Timeout ?? 0).toBe(0);
  });

  it('bounds the prefix index by the KV cache in tokens, each block weighing the tokens it was sent as', async () => {
    const srv = await metricsServer(
      () =>
        'vllm:num_requests_running 0\nvllm:cache_config_info{num_gpu_blocks="1000",block_size="16",engine="0"} 1.0\n',
    );
    cleanups.push(() => closeServer(srv.server));
    let perIndexBlock = 12.5;
    const live = createLiveState(
      { store: 'memory' },
      {
        backends: [{ name: 'x', url: srv.url }],
        scrape: { intervalMs: 1_000 },
        indexBlockTokens: () => perIndexBlock,
      },
    );
    cleanups.push(() => live.close());
    // Until scraped: a KV cache of DEFAULT_KV_TOKENS, assumed.
    expect(live.prefixSize('x').capacity).toBe(DEFAULT_KV_TOKENS);
    expect(live.prefixCapacityAssumed('x')).toBe(true);
    await until(() => live.prefixSize('x').capacity === 16_000, 2_000, 'cache config scraped');
    expect(live.prefixCapacityAssumed('x')).toBe(false);
    // Blocks sent without an estimate weigh the fleet's: 16,000 tokens of KV hold 1,280 of 12.5.
    const unique = Array.from({ length: 2_000 }, (_, i) => i + 1);
    live.prefixInsert('x', unique);
    expect(live.prefixSize('x')).toEqual({ blocks: 1_280, tokens: 16_000, capacity: 16_000 });
    // A tenant whose text is 2 characters a token: its blocks weigh 32 tokens each, whatever the
    // fleet's ratio, so 100 of them take the room of 256 of the fleet's (the oldest go).
    const cjk = Array.from({ length: 100 }, (_, i) => 10_000 + i);
    live.prefixInsert('x', cjk, undefined, 32);
    expect(live.prefixSize('x')).toEqual({ blocks: 1_280 - 256 + 100, tokens: 16_000, capacity: 16_000 });
    expect(live.prefixMatch('x', cjk)).toBe(100);
    // The most recent of the rest survive: the leading blocks of the chain (touched last).
    expect(live.prefixMatch('x', [1, 2, 3])).toBe(3);
    // A held block sent again takes the weight it is sent with now.
    perIndexBlock = 16;
    live.prefixInsert('x', cjk.slice(0, 10), undefined, 64);
    expect(live.prefixSize('x').tokens).toBeLessThanOrEqual(16_000);
    expect(live.prefixMatch('x', cjk.slice(0, 10))).toBe(10);
  });

  it("takes vLLM's 16-token KV blocks when the metrics give the block count alone", async () => {
    const srv = await metricsServer(
      () => 'vllm:num_requests_running 0\nvllm:cache_config_info{num_gpu_blocks="1000",engine="0"} 1.0\n',
    );
    cleanups.push(() => closeServer(srv.server));
    const live = createLiveState(
      { store: 'memory' },
      { backends: [{ name: 'x', url: srv.url }], scrape: { intervalMs: 1_000 }, indexBlockTokens: () => 64 },
    );
    cleanups.push(() => live.close());
    await until(() => live.prefixSize('x').capacity !== DEFAULT_KV_TOKENS, 2_000, 'cache config scraped');
    expect(live.prefixSize('x').capacity).toBe(16_000);
    // The block size is assumed: said so.
    expect(live.prefixCapacityAssumed('x')).toBe(true);
  });
  it('forgets what the index held on a backend whose engine restarted (its counters went down)', async () => {
    const counters = { x: [100, 50], y: [100, 50] };
    // The server's start time stays (an engine of several restarting under one API server): the
    // counters that fell are the only sign, and they are enough.
    const body = (name: 'x' | 'y') => () =>
      'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n' +
      `vllm:prefix_cache_queries_total ${counters[name][0]}\nvllm:prefix_cache_hits_total ${counters[name][1]}\n` +
      'process_start_time_seconds 1700000000\n';
    const x = await metricsServer(body('x'));
    const y = await metricsServer(body('y'));
    cleanups.push(
      () => closeServer(x.server),
      () => closeServer(y.server),
    );
    const state = createLiveState(
      { store: 'memory' },
      {
        backends: [
          { name: 'x', url: x.url },
          { name: 'y', url: y.url },
        ],
        scrape: { intervalMs: 20 },
      },
    );
    cleanups.push(() => state.close());
    await until(() => state.telemetry('x')?.prefixQueries === 100, 2_000, 'first scrape of x');
    await until(() => state.telemetry('y')?.prefixQueries === 100, 2_000, 'first scrape of y');
    const blocks = [11, 12, 13, 14];
    state.prefixInsert('x', blocks);
    state.prefixInsert('y', blocks);
    // Counters that only grow say nothing of a restart.
    counters.x = [140, 70];
    await until(() => state.telemetry('x')?.prefixQueries === 140, 2_000, 'x counting on');
    expect(state.prefixMatch('x', blocks)).toBe(4);
    // x restarts: a new process counts from 0, and holds nothing of what the old one cached.
    counters.x = [3, 1];
    await until(() => state.telemetry('x')?.prefixQueries === 3, 2_000, 'x after its restart');
    expect(state.prefixMatch('x', blocks)).toBe(0);
    expect(state.prefixMatch('y', blocks)).toBe(4);
    // What is sent there afterwards is learnt again.
    state.prefixInsert('x', blocks);
    expect(state.prefixMatch('x', blocks)).toBe(4);
  });

  it('sees a restart by its later process start time, when the counters have nothing to fall from', async () => {
    // A process that served nothing (its backend ejected, or idle) counts 0; its successor too.
    let start = 1_700_000_000.25;
    let waiting = 0;
    const srv = await metricsServer(() => vllmPage({ waiting, startS: start, prefix: [0, 0] }));
    const { state, restarts } = scraped(srv);
    await until(() => state.telemetry('x')?.waiting === 0, 2_000, 'first scrape');
    const blocks = [21, 22, 23];
    state.prefixInsert('x', blocks);
    // The same process, scraped again: nothing.
    waiting = 1;
    await until(() => state.telemetry('x')?.waiting === 1, 2_000, 'x scraped again');
    expect(state.prefixMatch('x', blocks)).toBe(3);
    expect(restarts).toEqual([]);
    // A new process: its start time is later, its counters at 0 as before.
    start += 40;
    waiting = 2;
    await until(() => state.telemetry('x')?.waiting === 2, 2_000, 'x after its restart');
    expect(restarts).toEqual(['x']);
    expect(state.prefixMatch('x', blocks)).toBe(0);
  });

  it('sees a restart by its start time on a page without the scheduler gauges (a server run with --disable-log-stats)', async () => {
    let start = 1_700_000_000.25;
    let served = 0;
    const srv = await metricsServer(() => {
      served++;
      return `# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds ${start}\n`;
    });
    const { state, restarts } = scraped(srv);
    await until(() => served >= 2, 2_000, 'two scrapes');
    const blocks = [31, 32, 33];
    state.prefixInsert('x', blocks);
    expect(restarts).toEqual([]);
    // No telemetry (each scrape fails for want of the gauges), but the start time moves: a restart.
    start += 40;
    const after = served;
    await until(() => served >= after + 2, 2_000, 'x after its restart');
    expect(restarts).toEqual(['x']);
    expect(state.prefixMatch('x', blocks)).toBe(0);
  });

  it('a restart seen on a page without the gauges leaves no baseline of the dead process for the next page', async () => {
    // The old process: 1,000 queried tokens, 900 hits, started at 100. Then a page with its
    // successor's start time alone; then that successor's page with its own counters.
    const pages = [
      'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:prefix_cache_queries_total 1000\nvllm:prefix_cache_hits_total 900\nprocess_start_time_seconds 100\n',
      'process_start_time_seconds 200\n',
      'vllm:num_requests_running 0\nvllm:num_requests_waiting 1\nvllm:prefix_cache_queries_total 3000\nvllm:prefix_cache_hits_total 1000\nprocess_start_time_seconds 200\n',
    ];
    const { state, restarts } = scraped(await pagesServer(pages));
    await until(() => state.telemetry('x')?.waiting === 1, 2_000, 'the new process scraped');
    // One restart, and the new process's own hit rate (1,000 of 3,000), not one across the two.
    expect(restarts).toEqual(['x']);
    expect(state.telemetry('x')?.prefixHitRate).toBeCloseTo(1 / 3, 6);
  });

  it("keeps a backend's KV size through a restart seen on a page without the gauges, and shows none of the dead process's figures", async () => {
    const pages = [
      'vllm:num_requests_running 2\nvllm:num_requests_waiting 0\nvllm:cache_config_info{num_gpu_blocks="50000",block_size="16"} 1\nprocess_start_time_seconds 100\n',
      'process_start_time_seconds 200\n',
    ];
    const { state, restarts } = scraped(await pagesServer(pages));
    await until(() => restarts.length === 1, 2_000, 'the restart');
    const t = state.telemetry('x')!;
    expect(t).toMatchObject({
      running: null,
      numGpuBlocks: 50_000,
      blockSize: 16,
      scrapedAt: null,
      saturated: true,
    });
  });

  it("reads vLLM v0's hit-rate gauge at -1 (prefix caching off) as no rate, not a rate of -1", async () => {
    const srv = await metricsServer(
      () => 'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_prefix_cache_hit_rate -1.0\n',
    );
    cleanups.push(() => closeServer(srv.server));
    const state = createLiveState(
      { store: 'memory' },
      { backends: [{ name: 'x', url: srv.url }], scrape: { intervalMs: 20 } },
    );
    cleanups.push(() => state.close());
    await until(() => state.telemetry('x')?.waiting === 0, 2_000, 'first scrape');
    expect(state.telemetry('x')?.prefixHitRate).toBeNull();
  });

  it("takes a new process's prefix hit rate afresh, not across the restart", async () => {
    // The old process: 900 hits in 1,000 queried tokens. The new one has already counted past it
    // (3,000 and 1,000) when the first scrape after the restart sees it: nothing fell, the start
    // time moved. Its rate is its own 1,000 / 3,000, not (1,000 − 900) / (3,000 − 1,000).
    let body =
      'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n' +
      'vllm:prefix_cache_queries_total 1000\nvllm:prefix_cache_hits_total 900\nprocess_start_time_seconds 1700000000\n';
    const srv = await metricsServer(() => body);
    cleanups.push(() => closeServer(srv.server));
    const state = createLiveState(
      { store: 'memory' },
      { backends: [{ name: 'x', url: srv.url }], scrape: { intervalMs: 20 } },
    );
    cleanups.push(() => state.close());
    await until(() => state.telemetry('x')?.prefixQueries === 1000, 2_000, 'the old process scraped');
    body =
      'vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n' +
      'vllm:prefix_cache_queries_total 3000\nvllm:prefix_cache_hits_total 1000\nprocess_start_time_seconds 1700000040\n';
    await until(() => state.telemetry('x')?.prefixQueries === 3000, 2_000, 'the new process scraped');
    expect(state.telemetry('x')?.prefixHitRate).toBeCloseTo(1 / 3, 6);
  });
});
