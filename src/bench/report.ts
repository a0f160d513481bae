// vLLM's printed result table and saved-JSON layout (vllm/benchmarks/serve.py), so a slagate run
// and a `vllm bench serve` run compare line by line. Rows are Python's "{:<40} {:<10}" /
// "{:<40} {:<10.2f}" (trailing spaces included); section headers are centred in 50 characters
// with the left pad rounded down, as Python's "^" alignment does.
import type { RequestRecord } from './client.ts';
import type { BenchMetrics, Distribution, MetricName, Slo } from './metrics.ts';

export interface RunInfo {
  /** YYYYMMDD-HHMMSS, local time, as vLLM writes it. */
  date: string;
  /** vLLM's backend names: "openai-chat" for chat, "openai" for completions. */
  backend: string;
  label: string | null;
  modelId: string;
  tokenizerId: string;
  /** Requests issued. */
  numPrompts: number;
  /**
   * Requests of the arrival schedule never sent: the concurrency cap held them until the duration
   * was over (--duration with --concurrency). Null without a schedule (an unlimited rate).
   */
  notSent: number | null;
  requestRate: number;
  burstiness: number;
  maxConcurrency: number | null;
  durationS: number;
  workload: string;
  seed: number;
  slo: Slo | null;
  /** Metrics with a section in the table and keys in the JSON, in order. */
  selectedMetrics: readonly MetricName[];
}

const SECTION: Record<MetricName, [string, string]> = {
  ttft: ['TTFT', 'Time to First Token'],
  tpot: ['TPOT', 'Time per Output Token (excl. 1st token)'],
  itl: ['ITL', 'Inter-token Latency'],
  e2el: ['E2EL', 'End-to-end Latency'],
};

function centre(text: string, fill: string, width = 50): string {
  const pad = Math.max(0, width - text.length);
  const left = Math.floor(pad / 2);
  return fill.repeat(left) + text + fill.repeat(pad - left);
}

function row(label: string, value: string | number): string {
  return `${label.padEnd(40)} ${String(value).padEnd(10)}`;
}

/** A figure to two decimals; `n/a` for one not measured. */
function rowF(label: string, value: number | null): string {
  return row(label, value === null ? 'n/a' : value.toFixed(2));
}

/** vLLM's spelling of a percentile in labels and keys (99 → "99", 99.9 → "99.9"): JS's own. */
export function percentileWord(p: number): string {
  return String(p);
}

/** Python's str() of a float: 10 → "10.0", 0.5 → "0.5", Infinity → "inf". */
export function pyFloat(x: number): string {
  if (x === Number.POSITIVE_INFINITY) return 'inf';
  return Number.isInteger(x) ? x.toFixed(1) : String(x);
}

export function formatTable(m: BenchMetrics, info: RunInfo): string {
  const lines = [
    centre(' Serving Benchmark Result ', '='),
    row('Successful requests:', m.completed),
    row('Failed requests:', m.failed),
  ];
  if (info.notSent !== null && info.notSent > 0)
    lines.push(row('Not sent (cap held past duration):', info.notSent));
  if (info.maxConcurrency !== null) lines.push(row('Maximum request concurrency:', info.maxConcurrency));
  if (info.requestRate !== Number.POSITIVE_INFINITY) {
    lines.push(rowF('Request rate configured (RPS):', info.requestRate));
  }
  lines.push(
    rowF('Benchmark duration (s):', info.durationS),
    row('Total input tokens:', m.totalInput),
    row('Total generated tokens:', m.totalOutput),
    rowF('Request throughput (req/s):', m.requestThroughput),
  );
  if (m.requestGoodput !== null) lines.push(rowF('Request goodput (req/s):', m.requestGoodput));
  lines.push(
    rowF('Output token throughput (tok/s):', m.outputThroughput),
    rowF('Peak output token throughput (tok/s):', m.maxOutputTokensPerS),
    rowF('Peak concurrent requests:', m.maxConcurrentRequests),
    rowF('Total token throughput (tok/s):', m.totalTokenThroughput),
  );
  for (const name of info.selectedMetrics) {
    const [short, header] = SECTION[name];
    const d: Distribution = m[name];
    lines.push(
      centre(header, '-'),
      rowF(`Mean ${short} (ms):`, d.mean),
      rowF(`Median ${short} (ms):`, d.median),
    );
    for (const [p, v] of d.percentiles) lines.push(rowF(`P${percentileWord(p)} ${short} (ms):`, v));
  }
  lines.push('='.repeat(50));
  return `${lines.join('\n')}\n`;
}

/**
 * The saved JSON: vLLM's keys in vLLM's order, then slagate's additions (workload, seed, slo,
 * good_completed, slo_attainment). With `detailed`, the per-request arrays vLLM writes under
 * --save-detailed, plus each request's HTTP status and gateway headers.
 */
export function resultJson(
  m: BenchMetrics,
  info: RunInfo,
  records: readonly RequestRecord[],
  detailed: boolean,
): Record<string, unknown> {
  const out: Record<string, unknown> = {
    date: info.date,
    endpoint_type: info.backend,
    backend: info.backend,
    label: info.label,
    model_id: info.modelId,
    tokenizer_id: info.tokenizerId,
    num_prompts: info.numPrompts,
    request_rate: info.requestRate === Number.POSITIVE_INFINITY ? 'inf' : info.requestRate,
    burstiness: info.burstiness === Number.POSITIVE_INFINITY ? 'inf' : info.burstiness,
    max_concurrency: info.maxConcurrency,
    duration: info.durationS,
    completed: m.completed,
    failed: m.failed,
    total_input_tokens: m.totalInput,
    total_output_tokens: m.totalOutput,
    request_throughput: m.requestThroughput,
    request_goodput: m.requestGoodput,
    output_throughput: m.outputThroughput,
    total_token_throughput: m.totalTokenThroughput,
  };
  if (detailed) {
    out.input_lens = records.map((r) => r.promptLen);
    out.output_lens = records.map((r) => (r.success ? r.outputLen : 0));
    out.ttfts = records.map((r) => r.ttft);
    out.itls = records.map((r) => r.itl);
  }
  out.latencies = records.map((r) => r.latency);
  if (detailed) out.start_times = records.map((r) => r.startTime);
  out.queue_times = records.map((r) => r.queueTime);
  if (detailed) out.errors = records.map((r) => r.error);
  out.max_output_tokens_per_s = m.maxOutputTokensPerS;
  out.max_concurrent_requests = m.maxConcurrentRequests;
  out.rtfx = 0;
  for (const name of info.selectedMetrics) {
    const d = m[name];
    out[`mean_${name}_ms`] = d.mean;
    out[`median_${name}_ms`] = d.median;
    out[`std_${name}_ms`] = d.std;
    for (const [p, v] of d.percentiles) out[`p${percentileWord(p)}_${name}_ms`] = v;
  }
  out.workload = info.workload;
  out.seed = info.seed;
  out.not_sent = info.notSent;
  out.slo = info.slo;
  // No SLO given (or one of no targets): nothing was judged, so neither count is a 0.
  const judged = m.requestGoodput !== null;
  out.good_completed = judged ? m.goodCompleted : null;
  out.slo_attainment = !judged || records.length === 0 ? null : m.goodCompleted / records.length;
  if (detailed) {
    out.statuses = records.map((r) => r.status);
    out.response_headers = records.map((r) => r.headers);
    out.class_hints = records.map((r) => r.classHint ?? null);
  }
  return out;
}
