// Synthetic workloads, each a pure function of its seed (nothing is downloaded). Every request
// carries its chat messages, the content's cl100k token count, the output length to ask for,
// and optional hints (SLA class, session, tenant). Parameters and their sources are in
// docs/benchmark-tool.md; the numbers below are the defaults documented there.
import { Rng } from '../sim/rng.ts';
import { syntheticText } from './text.ts';

export type WorkloadName = 'sharegpt' | 'prefix-shared' | 'mixed' | 'code';
export const WORKLOAD_NAMES: readonly WorkloadName[] = ['sharegpt', 'prefix-shared', 'mixed', 'code'];

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant';
  content: string;
}

export interface WorkloadRequest {
  /** Position in the workload's stream, from 0. */
  index: number;
  messages: ChatMessage[];
  /** cl100k tokens of the message contents (the server adds its chat template on top). */
  promptTokens: number;
  /** Output length to request (max_completion_tokens / max_tokens). */
  outputTokens: number;
  /** SLA class the request would belong to (sent as x-slagate-class only when asked). */
  classHint?: string;
  /** Conversation id (sent as x-session-id unless disabled). */
  sessionId?: string;
  tenant?: string;
}

export interface Workload {
  name: WorkloadName;
  /** Ask the server to ignore EOS so that output lengths follow the workload. */
  ignoreEos: boolean;
  /** The next request; the stream is endless and its first N requests depend only on the seed. */
  next(): WorkloadRequest;
}

// ShareGPT after vLLM's `is_valid_sequence` filter. The medians are fitted (not published) so
// that the filtered means reproduce vLLM PR #18566 (229,711 / 203,068 tokens over 1000 prompts
// ≈ 230 in / 203 out); the sigmas are our choice for heavy tails (input: the unfiltered
// Llumnix table implies σ ≈ 1.7–1.8; we use 1.5 since the filter trims the top).
export const SHAREGPT = {
  inputMedian: 176,
  inputSigma: 1.5,
  outputMedian: 130,
  outputSigma: 1.0,
  minLen: 4,
  maxPrompt: 1024,
  maxTotal: 2048,
};

// Tenants × users sharing long system prompts (llm-d / inference-perf shared-prefix synthetic:
// groups × prompts per group with a 1000–6000-token system prompt; Preble ToolBench: 85% shared
// prefix). Conversations are multi-turn and each turn resends the whole history.
export const PREFIX_SHARED = {
  tenants: 8,
  systemPromptTokens: 2000,
  /** Each tenant's system prompt length is systemPromptTokens · (1 ± spread), uniform. */
  systemPromptSpread: 0.1,
  usersPerTenant: 32,
  /** Conversations in progress at once; their turns interleave in the request stream. */
  activeConversations: 32,
  minTurns: 1,
  maxTurns: 6,
  questionMedian: 48,
  questionSigma: 0.6,
  questionMin: 8,
  questionMax: 256,
  outputMin: 100,
  outputMax: 300,
};

// Short chats (the ShareGPT fit above) with a share of long documents (4k–8k tokens) to
// summarise: the head-of-line-blocking case for prefill. The document share and sizes are a
// synthetic stress case, not a published trace.
export const MIXED = {
  documentShare: 0.15,
  documentMinTokens: 4096,
  documentMaxTokens: 8192,
  documentOutputMin: 128,
  documentOutputMax: 512,
};

// Azure LLM inference trace, code split: median ~1500 prompt / 13 output tokens (2023,
// Splitwise); output mean 23, p90 49 (2024, DynamoLLM), which a lognormal with median 15 and
// σ 0.92 reproduces. The prompt spread (σ 0.8) is our assumption.
export const CODE = {
  inputMedian: 1500,
  inputSigma: 0.8,
  inputMin: 64,
  inputMax: 8192,
  outputMedian: 15,
  outputSigma: 0.92,
  outputMin: 1,
  outputMax: 1024,
};

function clampRound(x: number, lo: number, hi: number): number {
  return Math.min(hi, Math.max(lo, Math.round(x)));
}

/** One (prompt, output) length pair that passes vLLM's ShareGPT filter. */
function sharegptLengths(rng: Rng, p: typeof SHAREGPT): [number, number] {
  for (;;) {
    const input = Math.round(rng.lognormal(p.inputMedian, p.inputSigma));
    const output = Math.round(rng.lognormal(p.outputMedian, p.outputSigma));
    if (input < p.minLen || output < p.minLen) continue;
    if (input > p.maxPrompt || input + output > p.maxTotal) continue;
    return [input, output];
  }
}

function sharegpt(seed: number, params: Partial<typeof SHAREGPT>): Workload {
  const p = { ...SHAREGPT, ...params };
  const rng = new Rng(seed).fork('sharegpt');
  let index = 0;
  return {
    name: 'sharegpt',
    ignoreEos: true,
    next() {
      const [input, output] = sharegptLengths(rng, p);
      return {
        index: index++,
        messages: [{ role: 'user', content: syntheticText(rng, input) }],
        promptTokens: input,
        outputTokens: output,
        classHint: 'interactive',
      };
    },
  };
}

interface Conversation {
  tenant: number;
  sessionId: string;
  turnsLeft: number;
  history: ChatMessage[];
  historyTokens: number;
}

function prefixShared(seed: number, params: Partial<typeof PREFIX_SHARED>): Workload {
  const p = { ...PREFIX_SHARED, ...params };
  const root = new Rng(seed);
  const tenantRng = root.fork('tenants');
  const rng = root.fork('conversations');
  // The same tenant always sends the same system prompt text: that is the shared prefix.
  const systemPrompts = Array.from({ length: p.tenants }, (_, t) => {
    const spread = p.systemPromptTokens * p.systemPromptSpread;
    const tokens = Math.round(p.systemPromptTokens - spread + tenantRng.next() * 2 * spread);
    return { tokens, content: syntheticText(tenantRng.fork(`tenant-${t}`), tokens) };
  });
  let conversationCount = 0;
  const startConversation = (): Conversation => {
    const tenant = rng.int(0, p.tenants - 1);
    const user = rng.int(0, p.usersPerTenant - 1);
    return {
      tenant,
      sessionId: `t${tenant}-u${user}-c${conversationCount++}`,
      turnsLeft: rng.int(p.minTurns, p.maxTurns),
      history: [],
      historyTokens: 0,
    };
  };
  const active = Array.from({ length: p.activeConversations }, startConversation);
  let index = 0;
  return {
    name: 'prefix-shared',
    ignoreEos: true,
    next() {
      const slot = rng.int(0, active.length - 1);
      const conv = active[slot] as Conversation;
      const system = systemPrompts[conv.tenant] as { tokens: number; content: string };
      const questionTokens = clampRound(
        rng.lognormal(p.questionMedian, p.questionSigma),
        p.questionMin,
        p.questionMax,
      );
      const question: ChatMessage = { role: 'user', content: syntheticText(rng, questionTokens) };
      const outputTokens = rng.int(p.outputMin, p.outputMax);
      const request: WorkloadRequest = {
        index: index++,
        messages: [{ role: 'system', content: system.content }, ...conv.history, question],
        promptTokens: system.tokens + conv.historyTokens + questionTokens,
        outputTokens,
        classHint: 'interactive',
        sessionId: conv.sessionId,
        tenant: `tenant-${conv.tenant}`,
      };
      conv.turnsLeft--;
      if (conv.turnsLeft <= 0) {
        active[slot] = startConversation();
      } else {
        // The next turn resends this exchange. The assistant text is synthetic (of the
        // requested length), not what the server actually wrote, so the cacheable prefix of a
        // later turn is the system prompt plus everything before this answer.
        conv.history.push(question, { role: 'assistant', content: syntheticText(rng, outputTokens) });
        conv.historyTokens += questionTokens + outputTokens;
      }
      return request;
    },
  };
}

/** Chats as `sharegpt` makes them (with its parameters), and a share of long documents. */
function mixed(seed: number, params: Partial<typeof MIXED>, chat: Partial<typeof SHAREGPT> = {}): Workload {
  const p = { ...MIXED, ...params };
  const root = new Rng(seed);
  const chooser = root.fork('mix');
  const docs = root.fork('documents');
  const chats = sharegpt(seed, chat);
  let index = 0;
  return {
    name: 'mixed',
    ignoreEos: true,
    next() {
      if (chooser.next() < p.documentShare) {
        const tokens = docs.int(p.documentMinTokens, p.documentMaxTokens);
        return {
          index: index++,
          messages: [{ role: 'user', content: syntheticText(docs, tokens) }],
          promptTokens: tokens,
          outputTokens: docs.int(p.documentOutputMin, p.documentOutputMax),
          classHint: 'batch',
        };
      }
      return { ...chats.next(), index: index++ };
    },
  };
}

function code(seed: number, params: Partial<typeof CODE>): Workload {
  const p = { ...CODE, ...params };
  const rng = new Rng(seed).fork('code');
  let index = 0;
  return {
    name: 'code',
    ignoreEos: true,
    next() {
      const input = clampRound(rng.lognormal(p.inputMedian, p.inputSigma), p.inputMin, p.inputMax);
      const output = clampRound(rng.lognormal(p.outputMedian, p.outputSigma), p.outputMin, p.outputMax);
      return {
        index: index++,
        messages: [{ role: 'user', content: syntheticText(rng, input) }],
        promptTokens: input,
        outputTokens: output,
        classHint: 'completion',
      };
    },
  };
}

export interface WorkloadParams {
  sharegpt?: Partial<typeof SHAREGPT>;
  'prefix-shared'?: Partial<typeof PREFIX_SHARED>;
  mixed?: Partial<typeof MIXED>;
  code?: Partial<typeof CODE>;
}

export function createWorkload(name: WorkloadName, seed: number, params: WorkloadParams = {}): Workload {
  switch (name) {
    case 'sharegpt':
      return sharegpt(seed, params.sharegpt ?? {});
    case 'prefix-shared':
      return prefixShared(seed, params['prefix-shared'] ?? {});
    case 'mixed':
      return mixed(seed, params.mixed ?? {}, params.sharegpt ?? {});
    case 'code':
      return code(seed, params.code ?? {});
  }
}

export function takeRequests(workload: Workload, n: number): WorkloadRequest[] {
  return Array.from({ length: n }, () => workload.next());
}

/** The prompt for /v1/completions: the message contents in order, so shared prefixes stay shared. */
export function completionPrompt(messages: readonly ChatMessage[]): string {
  return messages.map((m) => m.content).join('\n\n');
}
