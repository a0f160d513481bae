// /metrics of one simulated replica in vLLM's Prometheus text: the v1 engine's metric names,
// labels (`model_name`, `engine="0"`), histogram buckets and number formatting
// (prometheus_client: floats as Python prints them, counters with `_total` and a `_created`
// gauge). Rendered by hand: eight replicas in one process, scraped every second, should cost
// next to nothing.

import type { EngineObserver, EngineStats, FinishReason } from './engine/types.ts';

const TTFT_BUCKETS = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640,
  2560,
];
const ITL_BUCKETS = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
];
const REQUEST_BUCKETS = [
  0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680,
];

/** vLLM's FinishReason values; each gets a request_success series from the start. */
const FINISHED_REASONS = ['stop', 'length', 'abort', 'error'] as const;

class Histogram {
  /** Per-bucket counts, not cumulative; the last slot is +Inf. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;

  constructor(readonly bounds: readonly number[]) {
    this.counts = new Float64Array(bounds.length + 1);
  }

  observe(v: number): void {
    let i = 0;
    while (i < this.bounds.length && v > (this.bounds[i] as number)) i++;
    this.counts[i] = (this.counts[i] as number) + 1;
    this.sum += v;
    this.count++;
  }
}

/** A float as Python's prometheus_client prints it ("1.0", "0.25", "1.873e+06", "+Inf"). */
export function promFloat(v: number): string {
  if (v === Number.POSITIVE_INFINITY) return '+Inf';
  if (v === Number.NEGATIVE_INFINITY) return '-Inf';
  if (Number.isNaN(v)) return 'NaN';
  let s = Number.isInteger(v) && Math.abs(v) < 1e16 ? `${v}.0` : String(v);
  const dot = s.indexOf('.');
  // Go-style exponent for large positive values, as prometheus_client's floatToGoString does.
  if (v > 0 && dot > 6 && !s.includes('e')) {
    const mantissa = `${s[0]}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/\.?0+$/, '');
    s = `${mantissa}e+0${dot - 1}`;
  }
  return s;
}

export interface ReplicaMetricsOptions {
  model: string;
  /** Added to TTFT and E2E: vLLM measures both from the API server's arrival time. */
  frontendOverheadS: number;
  /** Unix seconds for the `_created` series. */
  createdS?: number;
}

/** The counters and histograms of a process that starts now. */
function freshSeries() {
  return {
    createdS: Date.now() / 1000,
    success: new Map<string, number>(FINISHED_REASONS.map((r) => [r, 0])),
    ttft: new Histogram(TTFT_BUCKETS),
    itl: new Histogram(ITL_BUCKETS),
    tpot: new Histogram(ITL_BUCKETS),
    e2e: new Histogram(REQUEST_BUCKETS),
    queue: new Histogram(REQUEST_BUCKETS),
    prefill: new Histogram(REQUEST_BUCKETS),
    decode: new Histogram(REQUEST_BUCKETS),
    inference: new Histogram(REQUEST_BUCKETS),
    // The simulator's own counts, on /sim/stats only (vLLM exports neither).
    added: 0,
    clientAborts: 0,
  };
}

export class ReplicaMetrics implements EngineObserver {
  private readonly labels: string;
  /** What this process has counted since it started; a crash (a new process) starts it again. */
  private s = freshSeries();

  constructor(private readonly opts: ReplicaMetricsOptions) {
    this.labels = `model_name="${escapeLabel(opts.model)}",engine="0"`;
    if (opts.createdS !== undefined) this.s.createdS = opts.createdS;
  }

  /** A new process (a crash): every counter and histogram from 0, created now. */
  restart(): void {
    this.s = freshSeries();
  }

  onRequestFinished(r: {
    reason: FinishReason;
    generationTokens: number;
    queueS: number;
    ttftS: number;
    e2eS: number;
    prefillS: number;
    decodeS: number;
  }): void {
    this.s.success.set(r.reason, (this.s.success.get(r.reason) ?? 0) + 1);
    this.s.e2e.observe(r.e2eS + this.opts.frontendOverheadS);
    this.s.queue.observe(r.queueS);
    // A request aborted before its first token has no prefill or decode interval.
    if (r.generationTokens === 0) return;
    this.s.prefill.observe(r.prefillS);
    this.s.decode.observe(r.decodeS);
    this.s.inference.observe(r.prefillS + r.decodeS);
    // vLLM's mean time per output token is 0 for a request of one token, and observed all the same.
    this.s.tpot.observe(r.generationTokens > 1 ? r.decodeS / (r.generationTokens - 1) : 0);
  }

  /**
   * TTFT is observed at the first token, as vLLM's iteration stats take it: a long answer's is not
   * late, and a request whose client leaves after its first token has one.
   */
  onFirstToken(ttftS: number): void {
    this.s.ttft.observe(ttftS + this.opts.frontendOverheadS);
  }

  /** A request reached the engine. */
  onAdded(): void {
    this.s.added++;
  }

  /**
   * The front end aborted a request (client gone, injected fault). vLLM's output processor drops
   * such a request before its stats are taken: no `request_success_total` label counts it, and no
   * latency histogram has it (vllm-project/vllm issues #31503 and #55634). Counted on /sim/stats.
   */
  onClientAbort(): void {
    this.s.clientAborts++;
  }

  /** The simulator's own counts since this process started (GET /sim/stats). */
  simStats(): { requests: number; client_aborts: number } {
    return { requests: this.s.added, client_aborts: this.s.clientAborts };
  }

  onInterTokenLatency(seconds: number): void {
    this.s.itl.observe(seconds);
  }

  /** The exposition text for the engine's current stats. */
  render(stats: EngineStats): string {
    const out: string[] = [];
    const L = this.labels;
    const gauge = (name: string, help: string, value: number) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name}{${L}} ${promFloat(value)}`);
    };
    const counter = (name: string, help: string, series: Array<[string, number]>) => {
      out.push(`# HELP ${name}_total ${help}`, `# TYPE ${name}_total counter`);
      for (const [extra, v] of series) out.push(`${name}_total{${L}${extra}} ${promFloat(v)}`);
      out.push(`# HELP ${name}_created ${help}`, `# TYPE ${name}_created gauge`);
      for (const [extra] of series) out.push(`${name}_created{${L}${extra}} ${promFloat(this.s.createdS)}`);
    };
    const histogram = (name: string, help: string, h: Histogram) => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
      let cumulative = 0;
      for (let i = 0; i <= h.bounds.length; i++) {
        cumulative += h.counts[i] as number;
        const le = i < h.bounds.length ? promFloat(h.bounds[i] as number) : '+Inf';
        out.push(`${name}_bucket{${L},le="${le}"} ${promFloat(cumulative)}`);
      }
      out.push(`${name}_count{${L}} ${promFloat(h.count)}`, `${name}_sum{${L}} ${promFloat(h.sum)}`);
      out.push(`# HELP ${name}_created ${help}`, `# TYPE ${name}_created gauge`);
      out.push(`${name}_created{${L}} ${promFloat(this.s.createdS)}`);
    };

    // prometheus_client's process collector, which vLLM's server exports in one process: when this
    // process started (a crash starts a new one).
    out.push(
      '# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.',
      '# TYPE process_start_time_seconds gauge',
      `process_start_time_seconds ${promFloat(this.s.createdS)}`,
    );
    gauge('vllm:num_requests_running', 'Number of requests in model execution batches.', stats.running);
    gauge('vllm:num_requests_waiting', 'Number of requests waiting to be processed.', stats.waiting);
    gauge('vllm:kv_cache_usage_perc', 'KV-cache usage. 1 means 100 percent usage.', stats.kvCacheUsage);
    counter('vllm:prefix_cache_queries', 'Prefix cache queries, in terms of number of queried tokens.', [
      ['', stats.prefixCacheQueries],
    ]);
    counter('vllm:prefix_cache_hits', 'Prefix cache hits, in terms of number of cached tokens.', [
      ['', stats.prefixCacheHits],
    ]);
    counter('vllm:num_preemptions', 'Cumulative number of preemptions from the engine.', [
      ['', stats.preemptions],
    ]);
    counter('vllm:prompt_tokens', 'Number of prefill tokens processed.', [['', stats.promptTokens]]);
    counter('vllm:generation_tokens', 'Number of generation tokens processed.', [
      ['', stats.generationTokens],
    ]);
    counter(
      'vllm:request_success',
      'Count of successfully processed requests.',
      [...this.s.success].map(([reason, n]): [string, number] => [`,finished_reason="${reason}"`, n]),
    );
    histogram(
      'vllm:time_to_first_token_seconds',
      'Histogram of time to first token in seconds.',
      this.s.ttft,
    );
    histogram('vllm:inter_token_latency_seconds', 'Histogram of inter-token latency in seconds.', this.s.itl);
    histogram(
      'vllm:request_time_per_output_token_seconds',
      'Histogram of time_per_output_token_seconds per request.',
      this.s.tpot,
    );
    histogram('vllm:e2e_request_latency_seconds', 'Histogram of e2e request latency in seconds.', this.s.e2e);
    histogram(
      'vllm:request_queue_time_seconds',
      'Histogram of time spent in WAITING phase for request.',
      this.s.queue,
    );
    histogram(
      'vllm:request_prefill_time_seconds',
      'Histogram of time spent in PREFILL phase for request.',
      this.s.prefill,
    );
    histogram(
      'vllm:request_decode_time_seconds',
      'Histogram of time spent in DECODE phase for request.',
      this.s.decode,
    );
    histogram(
      'vllm:request_inference_time_seconds',
      'Histogram of time spent in RUNNING phase for request.',
      this.s.inference,
    );
    out.push(
      '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig',
      '# TYPE vllm:cache_config_info gauge',
      `vllm:cache_config_info{block_size="${stats.blockSize}",cache_dtype="auto",enable_prefix_caching="True",` +
        `gpu_memory_utilization="0.9",num_gpu_blocks="${stats.numGpuBlocks}",engine="0"} 1.0`,
    );
    return `${out.join('\n')}\n`;
  }
}

function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}
