import { describe, expect, it } from 'vitest';
import type { BenchMetrics, Distribution } from '../../src/bench/metrics.ts';
import { formatTable, pyFloat, type RunInfo, resultJson } from '../../src/bench/report.ts';

const dist = (base: number): Distribution => ({
  mean: base,
  median: base + 0.5,
  std: 1,
  percentiles: [
    [90, base + 1],
    [99.9, base + 2.004],
  ],
});

const METRICS: BenchMetrics = {
  completed: 1000,
  failed: 2,
  totalInput: 229711,
  totalOutput: 203068,
  requestThroughput: 32.4166,
  requestGoodput: 20.5,
  goodCompleted: 640,
  outputThroughput: 6582.874,
  totalTokenThroughput: 14029.437,
  maxOutputTokensPerS: 9100,
  maxConcurrentRequests: 64,
  ttft: dist(9600),
  tpot: dist(48.8),
  itl: dist(25.4),
  e2el: dist(20000),
};

const INFO: RunInfo = {
  date: '20250101-120000',
  backend: 'openai-chat',
  label: null,
  modelId: 'meta-llama/Llama-3.1-8B-Instruct',
  tokenizerId: 'cl100k_base',
  numPrompts: 1002,
  notSent: null,
  requestRate: 10,
  burstiness: 1,
  maxConcurrency: 64,
  durationS: 30.85,
  workload: 'sharegpt',
  seed: 0,
  slo: { ttft: 500, tpot: 50 },
  selectedMetrics: ['ttft', 'tpot', 'itl'],
};

describe('formatTable', () => {
  it("prints vLLM's layout line for line", () => {
    const lines = formatTable(METRICS, INFO).split('\n');
    // Expected lines typed from vLLM's printed output ("{:<40} {:<10}", headers centred in 50).
    expect(lines.slice(0, 16)).toEqual([
      '============ Serving Benchmark Result ============',
      'Successful requests:                     1000      ',
      'Failed requests:                         2         ',
      'Maximum request concurrency:             64        ',
      'Request rate configured (RPS):           10.00     ',
      'Benchmark duration (s):                  30.85     ',
      'Total input tokens:                      229711    ',
      'Total generated tokens:                  203068    ',
      'Request throughput (req/s):              32.42     ',
      'Request goodput (req/s):                 20.50     ',
      'Output token throughput (tok/s):         6582.87   ',
      'Peak output token throughput (tok/s):    9100.00   ',
      'Peak concurrent requests:                64.00     ',
      'Total token throughput (tok/s):          14029.44  ',
      '---------------Time to First Token----------------',
      'Mean TTFT (ms):                          9600.00   ',
    ]);
    expect(lines.slice(16, 19)).toEqual([
      'Median TTFT (ms):                        9600.50   ',
      'P90 TTFT (ms):                           9601.00   ',
      'P99.9 TTFT (ms):                         9602.00   ',
    ]);
    expect(lines[19]).toBe('-----Time per Output Token (excl. 1st token)------');
    expect(lines[24]).toBe('---------------Inter-token Latency----------------');
    expect(lines[29]).toBe('==================================================');
    expect(lines[30]).toBe('');
    expect(lines).toHaveLength(31);
  });

  it('leaves out the rate, concurrency and goodput rows when not set; adds E2EL when selected', () => {
    const text = formatTable(
      { ...METRICS, requestGoodput: null },
      {
        ...INFO,
        requestRate: Number.POSITIVE_INFINITY,
        maxConcurrency: null,
        slo: null,
        selectedMetrics: ['ttft', 'e2el'],
      },
    );
    expect(text).not.toContain('Request rate configured');
    expect(text).not.toContain('Maximum request concurrency');
    expect(text).not.toContain('goodput');
    expect(text).not.toContain('TPOT');
    expect(text).toContain('----------------End-to-end Latency----------------\nMean E2EL (ms):');
  });
});

describe('resultJson', () => {
  it("has vLLM's keys in vLLM's order, then slagate's", () => {
    const json = resultJson(METRICS, INFO, [], false);
    expect(Object.keys(json)).toEqual([
      'date',
      'endpoint_type',
      'backend',
      'label',
      'model_id',
      'tokenizer_id',
      'num_prompts',
      'request_rate',
      'burstiness',
      'max_concurrency',
      'duration',
      'completed',
      'failed',
      'total_input_tokens',
      'total_output_tokens',
      'request_throughput',
      'request_goodput',
      'output_throughput',
      'total_token_throughput',
      'latencies',
      'queue_times',
      'max_output_tokens_per_s',
      'max_concurrent_requests',
      'rtfx',
      'mean_ttft_ms',
      'median_ttft_ms',
      'std_ttft_ms',
      'p90_ttft_ms',
      'p99.9_ttft_ms',
      'mean_tpot_ms',
      'median_tpot_ms',
      'std_tpot_ms',
      'p90_tpot_ms',
      'p99.9_tpot_ms',
      'mean_itl_ms',
      'median_itl_ms',
      'std_itl_ms',
      'p90_itl_ms',
      'p99.9_itl_ms',
      'workload',
      'seed',
      'not_sent',
      'slo',
      'good_completed',
      'slo_attainment',
    ]);
    expect(json.request_rate).toBe(10);
    expect(json.p90_tpot_ms).toBe(49.8);
    expect(json.request_goodput).toBe(20.5);
    expect(
      resultJson(METRICS, { ...INFO, requestRate: Number.POSITIVE_INFINITY }, [], false).request_rate,
    ).toBe('inf');
  });

  it('an SLO of no targets judged nothing: its counts are null, not 0', () => {
    const unjudged = { ...METRICS, requestGoodput: null, goodCompleted: 0 };
    const json = resultJson(unjudged, { ...INFO, slo: {} }, [], false);
    expect(json.good_completed).toBeNull();
    expect(json.slo_attainment).toBeNull();
  });

  it('a statistic of nothing measured is n/a in the table and null in the JSON, not 0', () => {
    const none: Distribution = { mean: null, median: null, std: null, percentiles: [[99, null]] };
    const allFailed = { ...METRICS, completed: 0, ttft: none, tpot: none, itl: none };
    const info = INFO;
    const table = formatTable(allFailed, info);
    expect(table).toMatch(/Mean TTFT \(ms\):\s+n\/a\s*\n/);
    expect(table).toMatch(/P99 TTFT \(ms\):\s+n\/a\s*\n/);
    expect(table).not.toMatch(/TTFT \(ms\):\s+0\.00/);
    const json = resultJson(allFailed, info, [], false);
    expect(json.mean_ttft_ms).toBeNull();
    expect(json.p99_ttft_ms).toBeNull();
    expect(json.std_tpot_ms).toBeNull();
  });

  it('adds the per-request arrays when detailed', () => {
    const record = {
      index: 0,
      requestId: 'x',
      startTime: 0.5,
      queueTime: 0.1,
      ttft: 0.2,
      itl: [0.01],
      latency: 0.21,
      promptLen: 10,
      outputLen: 2,
      success: true,
      error: '',
      status: 200,
      headers: { 'x-slagate-backend': 'gpu-0' },
      classHint: 'interactive',
    };
    const json = resultJson(METRICS, INFO, [record], true);
    expect(json.input_lens).toEqual([10]);
    expect(json.output_lens).toEqual([2]);
    expect(json.ttfts).toEqual([0.2]);
    expect(json.itls).toEqual([[0.01]]);
    expect(json.start_times).toEqual([0.5]);
    expect(json.queue_times).toEqual([0.1]);
    expect(json.errors).toEqual(['']);
    expect(json.response_headers).toEqual([{ 'x-slagate-backend': 'gpu-0' }]);
    expect(json.statuses).toEqual([200]);
    expect(json.class_hints).toEqual(['interactive']);
  });

  it("spells floats as Python's str() does in the pre-run lines", () => {
    expect(pyFloat(Number.POSITIVE_INFINITY)).toBe('inf');
    expect(pyFloat(10)).toBe('10.0');
    expect(pyFloat(0.5)).toBe('0.5');
  });
});
