import { describe, expect, it } from 'vitest';
import { ReplicaMetrics } from '../../src/sim/metrics.ts';
import { parseSampleLine, parseVllmMetrics } from '../../src/state/vllm-metrics.ts';

// An older vLLM (v0.8-style names: gpu_ prefixes, no kv_cache_usage_perc), two data-parallel engines,
// odd label order and escaping, a timestamp, a NaN, and other exporters' series around it.
const OLD_VLLM = String.raw`# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="org/model \"v2\", {chat}"} 7.0
vllm:num_requests_running{engine="1",model_name="org/model \"v2\", {chat}"} 5.0 1712345678000
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} NaN
vllm:num_requests_swapped{engine="0",model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.7
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 1.5e+06
vllm:gpu_prefix_cache_queries_total{engine="1",model_name="m"} 500000.0
vllm:gpu_prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 600000.0
vllm:gpu_prefix_cache_hits_total{engine="1",model_name="m"} 400000.0
vllm:cache_config_info{num_gpu_blocks="18000",block_size="32",cache_dtype="auto",engine="0"} 1.0
vllm:cache_config_info{num_gpu_blocks="18000",block_size="32",cache_dtype="auto",engine="1"} 1.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 3.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.71234e+09
`;

describe('vLLM /metrics parsing', () => {
  // Two data-parallel engines of 9,000 blocks each: the front end writes the server's total (it
  // sums the engines into its one cache config) on each engine's cache_config_info series.
  it('reads older vLLM names, sums engines, averages KV usage, ignores NaN and other series', () => {
    expect(parseVllmMetrics(OLD_VLLM)).toEqual({
      running: 12,
      waiting: 2,
      kvCacheUsage: 0.6,
      prefixQueries: 2_000_000,
      prefixHits: 1_000_000,
      prefixHitRateGauge: null,
      blockSize: 32,
      numGpuBlocks: 18_000,
      processStartS: 1_712_340_000,
    });
  });

  it('reads counters without the _total suffix and the v0 hit-rate gauge', () => {
    const m = parseVllmMetrics(
      [
        'vllm:num_requests_running 3',
        'vllm:prefix_cache_queries{model_name="m"} 100',
        'vllm:prefix_cache_hits{model_name="m"} 25',
        'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.42',
      ].join('\n'),
    );
    expect(m.running).toBe(3);
    expect(m.waiting).toBeNull();
    expect(m.prefixQueries).toBe(100);
    expect(m.prefixHits).toBe(25);
    expect(m.prefixHitRateGauge).toBe(0.42);
    expect(m.kvCacheUsage).toBeNull();
    expect(m.blockSize).toBeNull();
  });

  it('prefers the current name when both are exported, so nothing counts twice', () => {
    const m = parseVllmMetrics(
      [
        'vllm:kv_cache_usage_perc{engine="0"} 0.25',
        'vllm:gpu_cache_usage_perc{engine="0"} 0.9',
        'vllm:prefix_cache_queries_total{engine="0"} 10',
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 99',
      ].join('\n'),
    );
    expect(m.kvCacheUsage).toBe(0.25);
    expect(m.prefixQueries).toBe(10);
  });

  it('reads the simulator’s exposition (the current vLLM names)', () => {
    const metrics = new ReplicaMetrics({
      model: 'meta-llama/Llama-3.1-8B-Instruct',
      frontendOverheadS: 0,
      createdS: 1_700_000_000.5,
    });
    const text = metrics.render({
      running: 4,
      waiting: 9,
      kvCacheUsage: 0.3125,
      prefixCacheQueries: 12_000,
      prefixCacheHits: 3_000,
      preemptions: 0,
      promptTokens: 1,
      generationTokens: 2,
      numGpuBlocks: 27_000,
      blockSize: 16,
      steps: 0,
    });
    expect(parseVllmMetrics(text)).toEqual({
      running: 4,
      waiting: 9,
      kvCacheUsage: 0.3125,
      prefixQueries: 12_000,
      prefixHits: 3_000,
      prefixHitRateGauge: null,
      blockSize: 16,
      numGpuBlocks: 27_000,
      processStartS: 1_700_000_000.5,
    });
  });

  it('sample lines: escapes, special values, malformed input', () => {
    expect(parseSampleLine('a{x="1\\"2\\\\3\\n",y="}"} +Inf')).toEqual({
      name: 'a',
      labels: { x: '1"2\\3\n', y: '}' },
      value: Number.POSITIVE_INFINITY,
    });
    expect(parseSampleLine('a -Inf')?.value).toBe(Number.NEGATIVE_INFINITY);
    expect(parseSampleLine('a{x="unterminated} 1')).toBeNull();
    expect(parseSampleLine('a{x=1} 1')).toBeNull();
    expect(parseSampleLine('a notanumber')).toBeNull();
    expect(parseSampleLine('a')).toBeNull();
    expect(parseVllmMetrics('').running).toBeNull();
  });
});
