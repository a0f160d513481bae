// Reads the few vLLM /metrics series the gateway uses out of Prometheus text exposition, under
// both current and older vLLM names (research/vllm.md §B):
//   vllm:kv_cache_usage_perc            (until v0.10: vllm:gpu_cache_usage_perc)
//   vllm:prefix_cache_{queries,hits}    (before v0.9: vllm:gpu_prefix_cache_{queries,hits}),
//                                        with or without the `_total` suffix prometheus_client adds
//   vllm:gpu_prefix_cache_hit_rate      (v0 engine: a gauge instead of counters)
//   vllm:cache_config_info{block_size, num_gpu_blocks}
//   process_start_time_seconds          (prometheus_client's process collector: absent when the
//                                        server exports its metrics in multiprocess mode)
// Several series of one metric (data-parallel engines, several models) are summed, except KV usage,
// which is averaged (each engine has its own cache of the same size). A NaN or infinite sample is
// ignored; a metric with no usable sample is null.

export interface VllmMetrics {
  running: number | null;
  waiting: number | null;
  /** 0–1. */
  kvCacheUsage: number | null;
  /** Prefix cache lookups and hits, in tokens, since the engine started. */
  prefixQueries: number | null;
  prefixHits: number | null;
  /** Engine-reported hit rate, only from old engines that export no counters. */
  prefixHitRateGauge: number | null;
  blockSize: number | null;
  numGpuBlocks: number | null;
  /** When the server process started (Unix seconds); a later one is a new process. */
  processStartS: number | null;
}

type Field = Exclude<keyof VllmMetrics, 'blockSize' | 'numGpuBlocks' | 'processStartS'>;

/** Names in order of preference: the first one present wins, so mixed old/new text is not counted twice. */
const NAMES: Record<Field, readonly string[]> = {
  running: ['vllm:num_requests_running'],
  waiting: ['vllm:num_requests_waiting'],
  kvCacheUsage: ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'],
  prefixQueries: [
    'vllm:prefix_cache_queries_total',
    'vllm:prefix_cache_queries',
    'vllm:gpu_prefix_cache_queries_total',
    'vllm:gpu_prefix_cache_queries',
  ],
  prefixHits: [
    'vllm:prefix_cache_hits_total',
    'vllm:prefix_cache_hits',
    'vllm:gpu_prefix_cache_hits_total',
    'vllm:gpu_prefix_cache_hits',
  ],
  prefixHitRateGauge: ['vllm:gpu_prefix_cache_hit_rate'],
};
const AVERAGED: ReadonlySet<Field> = new Set(['kvCacheUsage', 'prefixHitRateGauge']);
const CACHE_INFO = 'vllm:cache_config_info';
const PROCESS_START = 'process_start_time_seconds';

const WANTED = new Set<string>([...Object.values(NAMES).flat(), CACHE_INFO]);

export function parseVllmMetrics(text: string): VllmMetrics {
  const samples = new Map<string, number[]>();
  let blockSize: number | null = null;
  let numGpuBlocks: number | null = null;
  let processStartS: number | null = null;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith(PROCESS_START)) {
      const sample = parseSampleLine(line);
      if (sample?.name === PROCESS_START && Number.isFinite(sample.value) && sample.value > 0)
        processStartS = sample.value;
      continue;
    }
    if (!line.startsWith('vllm:')) continue; // comments, blank lines, other exporters
    const sample = parseSampleLine(line);
    if (sample === null || !WANTED.has(sample.name)) continue;
    if (sample.name === CACHE_INFO) {
      const bs = Number(sample.labels.block_size);
      const nb = Number(sample.labels.num_gpu_blocks);
      if (Number.isFinite(bs) && bs > 0 && blockSize === null) blockSize = bs;
      // Not summed over engines: with data parallelism vLLM's front end adds every engine's blocks
      // into the one cache config it then writes once per engine, so each series holds the
      // server's total already.
      if (Number.isFinite(nb) && nb > 0) numGpuBlocks = Math.max(numGpuBlocks ?? 0, nb);
      continue;
    }
    if (!Number.isFinite(sample.value)) continue;
    let list = samples.get(sample.name);
    if (list === undefined) {
      list = [];
      samples.set(sample.name, list);
    }
    list.push(sample.value);
  }
  const pick = (field: Field): number | null => {
    for (const name of NAMES[field]) {
      const list = samples.get(name);
      if (list === undefined || list.length === 0) continue;
      const sum = list.reduce((a, b) => a + b, 0);
      return AVERAGED.has(field) ? sum / list.length : sum;
    }
    return null;
  };
  return {
    running: pick('running'),
    waiting: pick('waiting'),
    kvCacheUsage: pick('kvCacheUsage'),
    prefixQueries: pick('prefixQueries'),
    prefixHits: pick('prefixHits'),
    prefixHitRateGauge: pick('prefixHitRateGauge'),
    blockSize,
    numGpuBlocks,
    processStartS,
  };
}

export interface PromSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** `name{label="value",...} value [timestamp]`; null when the line is not a well-formed sample. */
export function parseSampleLine(line: string): PromSample | null {
  let i = 0;
  while (i < line.length && line[i] !== '{' && line[i] !== ' ' && line[i] !== '\t') i++;
  const name = line.slice(0, i);
  if (name === '') return null;
  const labels: Record<string, string> = {};
  if (line[i] === '{') {
    i++;
    for (;;) {
      while (line[i] === ' ' || line[i] === ',') i++;
      if (line[i] === '}') {
        i++;
        break;
      }
      const eq = line.indexOf('=', i);
      if (eq < 0 || line[eq + 1] !== '"') return null;
      const key = line.slice(i, eq).trim();
      let value = '';
      let j = eq + 2;
      for (; j < line.length && line[j] !== '"'; j++) {
        if (line[j] === '\\' && j + 1 < line.length) {
          j++;
          value += line[j] === 'n' ? '\n' : line[j];
        } else value += line[j];
      }
      if (j >= line.length) return null; // unterminated label value
      labels[key] = value;
      i = j + 1;
    }
  }
  const rest = line.slice(i).trim().split(/\s+/);
  const value = parsePromFloat(rest[0] ?? '');
  if (value === undefined) return null;
  return { name, labels, value };
}

function parsePromFloat(s: string): number | undefined {
  switch (s) {
    case '+Inf':
    case 'Inf':
      return Number.POSITIVE_INFINITY;
    case '-Inf':
      return Number.NEGATIVE_INFINITY;
    case 'NaN':
      return Number.NaN;
  }
  if (s === '') return undefined;
  const v = Number(s);
  return Number.isNaN(v) ? undefined : v;
}
