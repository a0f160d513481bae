import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { promFloat, ReplicaMetrics } from '../../src/sim/metrics.ts';
import { getProfile } from '../../src/sim/profiles.ts';
import { SimReplica } from '../../src/sim/replica.ts';
import { openStream, post, send } from './http-helpers.ts';

const PROFILE = getProfile('llama3-8b-h100');
const MODEL = PROFILE.model;
const L = `model_name="${MODEL}",engine="0"`;

const TTFT = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640,
  2560,
];
const ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
const REQUEST = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];

const EMPTY_STATS = {
  running: 3,
  waiting: 2,
  kvCacheUsage: 0.25,
  numGpuBlocks: 27000,
  blockSize: 16,
  prefixCacheQueries: 1873000,
  prefixCacheHits: 912000,
  preemptions: 0,
  promptTokens: 961234,
  generationTokens: 402117,
  steps: 10,
};

/** Value of the one sample whose name+labels start with `prefix`. */
function sample(text: string, prefix: string): number {
  const lines = text.split('\n').filter((l) => l.startsWith(prefix));
  expect(lines, prefix).toHaveLength(1);
  return Number((lines[0] as string).split(' ').at(-1));
}

function bucketBounds(text: string, name: string): string[] {
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}_bucket{`))
    .map((l) => /le="([^"]+)"/.exec(l)?.[1] as string);
}

describe('promFloat', () => {
  it('prints numbers as prometheus_client does', () => {
    expect(promFloat(0)).toBe('0.0');
    expect(promFloat(12)).toBe('12.0');
    expect(promFloat(0.25)).toBe('0.25');
    expect(promFloat(2560)).toBe('2560.0');
    expect(promFloat(961234)).toBe('961234.0');
    expect(promFloat(1873000)).toBe('1.873e+06');
    expect(promFloat(1795973601.473)).toBe('1.795973601473e+09');
    expect(promFloat(Number.POSITIVE_INFINITY)).toBe('+Inf');
  });
});

describe('ReplicaMetrics', () => {
  it('exposes every vLLM metric with its labels and buckets', () => {
    const text = new ReplicaMetrics({ model: MODEL, frontendOverheadS: 0 }).render(EMPTY_STATS);
    const types = Object.fromEntries(
      text
        .split('\n')
        .filter((l) => l.startsWith('# TYPE '))
        .map((l) => l.slice(7).split(' ') as [string, string]),
    );
    expect(types).toMatchObject({
      'vllm:num_requests_running': 'gauge',
      'vllm:num_requests_waiting': 'gauge',
      'vllm:kv_cache_usage_perc': 'gauge',
      'vllm:prefix_cache_queries_total': 'counter',
      'vllm:prefix_cache_hits_total': 'counter',
      'vllm:num_preemptions_total': 'counter',
      'vllm:prompt_tokens_total': 'counter',
      'vllm:generation_tokens_total': 'counter',
      'vllm:request_success_total': 'counter',
      'vllm:cache_config_info': 'gauge',
      'vllm:time_to_first_token_seconds': 'histogram',
      'vllm:inter_token_latency_seconds': 'histogram',
      'vllm:e2e_request_latency_seconds': 'histogram',
      'vllm:request_queue_time_seconds': 'histogram',
    });
    expect(sample(text, `vllm:num_requests_running{${L}}`)).toBe(3);
    expect(sample(text, `vllm:num_requests_waiting{${L}}`)).toBe(2);
    expect(sample(text, `vllm:kv_cache_usage_perc{${L}}`)).toBe(0.25);
    expect(text).toContain(`vllm:prefix_cache_queries_total{${L}} 1.873e+06\n`);
    expect(sample(text, `vllm:prefix_cache_hits_total{${L}}`)).toBe(912000);
    expect(sample(text, `vllm:prompt_tokens_total{${L}}`)).toBe(961234);
    expect(sample(text, `vllm:generation_tokens_total{${L}}`)).toBe(402117);
    for (const reason of ['stop', 'length', 'abort']) {
      expect(sample(text, `vllm:request_success_total{${L},finished_reason="${reason}"}`)).toBe(0);
    }
    expect(text).toContain(
      'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",' +
        'gpu_memory_utilization="0.9",num_gpu_blocks="27000",engine="0"} 1.0\n',
    );
    const les = (bounds: number[]) => [...bounds.map(promFloat), '+Inf'];
    expect(bucketBounds(text, 'vllm:time_to_first_token_seconds')).toEqual(les(TTFT));
    expect(bucketBounds(text, 'vllm:inter_token_latency_seconds')).toEqual(les(ITL));
    expect(bucketBounds(text, 'vllm:e2e_request_latency_seconds')).toEqual(les(REQUEST));
    expect(bucketBounds(text, 'vllm:request_queue_time_seconds')).toEqual(les(REQUEST));
    expect(bucketBounds(text, 'vllm:time_to_first_token_seconds').slice(0, 3)).toEqual([
      '0.001',
      '0.005',
      '0.01',
    ]);
  });

  it('fills cumulative buckets, adding the front-end time to TTFT and E2E', () => {
    const m = new ReplicaMetrics({ model: MODEL, frontendOverheadS: 0.01 });
    m.onRequestFinished({
      reason: 'stop',
      generationTokens: 11,
      queueS: 0.2,
      ttftS: 0.025,
      e2eS: 1.2,
      prefillS: 0.01,
      decodeS: 1.0,
    });
    m.onFirstToken(0.025);
    m.onInterTokenLatency(0.02);
    m.onInterTokenLatency(0.2);
    const text = m.render(EMPTY_STATS);
    const ttft = (le: string) => sample(text, `vllm:time_to_first_token_seconds_bucket{${L},le="${le}"}`);
    expect([ttft('0.02'), ttft('0.04'), ttft('+Inf')]).toEqual([0, 1, 1]);
    expect(sample(text, `vllm:time_to_first_token_seconds_sum{${L}}`)).toBeCloseTo(0.035, 9);
    expect(sample(text, `vllm:e2e_request_latency_seconds_bucket{${L},le="1.0"}`)).toBe(0);
    expect(sample(text, `vllm:e2e_request_latency_seconds_bucket{${L},le="1.5"}`)).toBe(1);
    expect(sample(text, `vllm:request_queue_time_seconds_bucket{${L},le="0.3"}`)).toBe(1);
    expect(sample(text, `vllm:inter_token_latency_seconds_bucket{${L},le="0.025"}`)).toBe(1);
    expect(sample(text, `vllm:inter_token_latency_seconds_count{${L}}`)).toBe(2);
    expect(sample(text, `vllm:request_time_per_output_token_seconds_sum{${L}}`)).toBeCloseTo(0.1, 9);
    expect(sample(text, `vllm:request_success_total{${L},finished_reason="stop"}`)).toBe(1);
  });
});

describe('GET /metrics', () => {
  let replica: SimReplica;
  beforeAll(async () => {
    replica = await SimReplica.start({ profile: PROFILE, timeScale: 0.05 });
  });
  afterAll(() => replica.close());

  it('counts what the replica served', async () => {
    const body = { model: MODEL, prompt: 'The same prompt each time', max_tokens: 5, ignore_eos: true };
    const prompt = JSON.parse((await post(replica.url, '/tokenize', body)).text).count as number;
    for (let i = 0; i < 3; i++) expect((await post(replica.url, '/v1/completions', body)).status).toBe(200);
    const r = await send(replica.url, 'GET', '/metrics');
    expect(r.headers['content-type']).toBe('text/plain; version=0.0.4; charset=utf-8');
    const text = r.text;
    expect(sample(text, `vllm:prompt_tokens_total{${L}}`)).toBe(3 * prompt);
    expect(sample(text, `vllm:generation_tokens_total{${L}}`)).toBe(15);
    expect(sample(text, `vllm:request_success_total{${L},finished_reason="length"}`)).toBe(3);
    expect(sample(text, `vllm:time_to_first_token_seconds_count{${L}}`)).toBe(3);
    expect(sample(text, `vllm:inter_token_latency_seconds_count{${L}}`)).toBe(12);
    expect(sample(text, `vllm:prefix_cache_queries_total{${L}}`)).toBe(3 * prompt);
    expect(sample(text, `vllm:num_requests_running{${L}}`)).toBe(0);
    // The front-end delay alone puts every TTFT above its wall-clock share.
    const minTtft = (PROFILE.frontendOverheadMs * 0.05) / 1000;
    expect(sample(text, `vllm:time_to_first_token_seconds_sum{${L}}`)).toBeGreaterThan(3 * minTtft);
  });

  it("observes TTFT at the first token, a client abort after it included; a one-token answer's TPOT as 0", async () => {
    const count = async (name: string) =>
      sample((await send(replica.url, 'GET', '/metrics')).text, `${name}{${L}}`);
    const ttftBefore = await count('vllm:time_to_first_token_seconds_count');
    const s = await openStream(replica.url, '/v1/completions', {
      model: MODEL,
      prompt: 'A long story',
      max_tokens: 20000,
      ignore_eos: true,
      stream: true,
    });
    await s.until((t) => t.split('data: ').length > 3);
    // Still generating: its TTFT is observed already.
    expect(replica.engine.stats().running).toBe(1);
    expect(await count('vllm:time_to_first_token_seconds_count')).toBe(ttftBefore + 1);
    s.close();
    while (replica.engine.stats().running > 0) await new Promise((r) => setTimeout(r, 10));
    expect(await count('vllm:time_to_first_token_seconds_count')).toBe(ttftBefore + 1);

    const tpotBefore = await count('vllm:request_time_per_output_token_seconds_count');
    const zeroBefore = sample(
      (await send(replica.url, 'GET', '/metrics')).text,
      `vllm:request_time_per_output_token_seconds_bucket{${L},le="0.01"}`,
    );
    const one = { model: MODEL, prompt: 'One token', max_tokens: 1 };
    expect((await post(replica.url, '/v1/completions', one)).status).toBe(200);
    expect(await count('vllm:request_time_per_output_token_seconds_count')).toBe(tpotBefore + 1);
    expect(
      sample(
        (await send(replica.url, 'GET', '/metrics')).text,
        `vllm:request_time_per_output_token_seconds_bucket{${L},le="0.01"}`,
      ),
    ).toBe(zeroBefore + 1);
  });
});
