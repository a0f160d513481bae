// A non-streamed answer built from a stream. The gateway always asks the backend for a stream, so
// that every request has a measured TTFT and TPOT; when the client asked for one JSON body, the
// chunks are folded into the body vLLM itself would have sent (key order and nulls of vLLM's
// pydantic models, as src/sim/wire.ts writes them), and only that body reaches the client.
//
// A reasoning model's channel keeps the name the backend streamed it with: `reasoning` in current
// vLLM, `reasoning_content` in earlier releases (the message carries the same name as the deltas).
// vLLM's reasoning parsers give no content (null, not "") when the model wrote only reasoning.
//
// Several choices (n > 1, several completion prompts) are folded by their index into the body's
// choices, in index order. A choice's tool calls are folded by their own index (the first delta
// that names a call carries its id, type and function name; its arguments come in pieces), and a
// completion's logprobs are the chunks' four parallel lists joined, but for the text offsets, which
// the body chains from each token's own length, as vLLM's non-streamed body does (logprobsOf). Shapes it does not cover are sent
// upstream non-streamed and relayed as they come (`assemblable` says which): a chat's logprobs
// (vLLM's chat stream drops the chunks its tool and reasoning parsers hold back, logprobs and all:
// `<tool_call>`, a call's name, `<think>`; its non-streamed body lists every token), tools with
// several sequences (vLLM's chat stream shared one tool parser among the choices until 2026-03, and
// lost their calls), the prompt's logprobs, echo, best_of and beam search, the deprecated
// `functions`, vLLM's token-id and prompt-text extras, the transfer parameters of disaggregated
// prefill. The usage is the backend's final one, every field of it; the fingerprint the one a
// chunk carried.
//
// Where vLLM's own non-streamed body differs: a call's arguments are the text the model streamed,
// where vLLM's `tool_choice: "required"` re-serialises them (Python's json.dumps: the same JSON,
// other spacing); a message of tool calls alone has content null, where vLLM's named and required
// tool choices write "" (its `auto` writes null, as OpenAI does); and a call whose stream named no
// id gets one made here, as vLLM makes one.

import { randomUUID } from 'node:crypto';

export type AssembleKind = 'chat' | 'completion';

/** Request fields whose presence makes a non-streamed request pass through unassembled. */
// Chat's echo and beam search too: vLLM's stream of an echo hands a message's content parts to a
// string field (an in-band error where its non-streamed answer succeeds), and a beam search streams
// nothing until the search ends (past a first-token timeout set for a stream).
const CHAT_UNCOVERED = [
  'logprobs',
  'top_logprobs',
  'prompt_logprobs',
  'functions',
  'echo',
  'use_beam_search',
] as const;
const COMPLETION_UNCOVERED = ['prompt_logprobs', 'echo', 'best_of', 'use_beam_search'] as const;
// The transfer parameters of disaggregated prefill: vLLM returns them in the non-streamed body only
// (no stream chunk carries them), so such a request must reach the backend as sent.
// `return_prompt_text`: the prompt's text, which a stream carries on its first chunk only.
const VLLM_EXTRAS = [
  'return_tokens_as_token_ids',
  'return_token_ids',
  'return_prompt_text',
  'kv_transfer_params',
  'ec_transfer_params',
] as const;

/**
 * Integer fields whose 0 still asks for something: vLLM tests them with `is not None`, and 0 means
 * the sampled token's logprob (completion `logprobs`) or the prompt's (`prompt_logprobs`). Chat's
 * `logprobs` is a boolean there, so its 0 reads as false.
 */
const ZERO_ASKS: Readonly<Record<AssembleKind, ReadonlySet<string>>> = {
  chat: new Set(['prompt_logprobs']),
  completion: new Set(['prompt_logprobs']),
};

function set(v: unknown, zeroAsks = false): boolean {
  return v !== undefined && v !== null && v !== false && (v !== 0 || zeroAsks);
}

/**
 * Whether a non-streamed request of this shape can be answered from a stream. Several choices (n,
 * several completion prompts) can: their chunks name their choice, and the body lists them in
 * index order.
 */
export function assemblable(kind: AssembleKind, body: Record<string, unknown>): boolean {
  const uncovered = kind === 'chat' ? CHAT_UNCOVERED : COMPLETION_UNCOVERED;
  const zero = ZERO_ASKS[kind];
  for (const k of uncovered) if (set(body[k], zero.has(k))) return false;
  for (const k of VLLM_EXTRAS) if (set(body[k])) return false;
  // Tools with several sequences (n > 1): see the header comment.
  if (kind === 'chat' && set(body.tools) && typeof body.n === 'number' && body.n > 1) return false;
  return true;
}

interface Choice {
  index?: unknown;
  delta?: {
    role?: unknown;
    content?: unknown;
    reasoning?: unknown;
    reasoning_content?: unknown;
    tool_calls?: unknown;
  } | null;
  text?: unknown;
  logprobs?: unknown;
  finish_reason?: unknown;
  stop_reason?: unknown;
}

/** One tool call's deltas folded: vLLM's DeltaToolCall, by its index. */
interface ToolCallState {
  id: string | null;
  type: string | null;
  name: string;
  arguments: string;
}

/** The four parallel lists of a completion's logprobs, in vLLM's order. */
const COMPLETION_LOGPROB_LISTS = ['text_offset', 'token_logprobs', 'tokens', 'top_logprobs'] as const;

export interface StreamChunk {
  id?: unknown;
  created?: unknown;
  model?: unknown;
  choices?: unknown;
  usage?: {
    prompt_tokens?: unknown;
    completion_tokens?: unknown;
    total_tokens?: unknown;
    prompt_tokens_details?: unknown;
  } | null;
  error?: unknown;
  object?: unknown;
  system_fingerprint?: unknown;
}

/** One choice's share of the stream (its index names it: vLLM sends one choice per chunk). */
interface ChoiceState {
  text: string;
  /** The reasoning channel as streamed under each of its two names (null: never seen). */
  reasoning: string | null;
  reasoningContent: string | null;
  finish: unknown;
  stop: unknown;
  /** The role its first chunk named (vLLM's response role, or the last message's). */
  role: string | null;
  /** Its tool calls by their index (chat). */
  calls: Map<number, ToolCallState> | null;
  /** A completion's logprobs lists by name, joined (null: no chunk carried logprobs). */
  logprobs: Map<string, unknown[]> | null;
}

/** A choice nothing has been folded into yet. */
function newChoice(): ChoiceState {
  return {
    text: '',
    reasoning: null,
    reasoningContent: null,
    finish: null,
    stop: null,
    role: null,
    calls: null,
    logprobs: null,
  };
}

export class Assembler {
  readonly kind: AssembleKind;
  #id: unknown = null;
  #created: unknown = null;
  #model: unknown = null;
  /** By choice index: one for each sequence (n, times the prompts of a completion). */
  readonly #choices = new Map<number, ChoiceState>();
  #chars = 0;
  #usage: NonNullable<StreamChunk['usage']> | null = null;
  #finalUsage: NonNullable<StreamChunk['usage']> | null = null;
  /** The backend's fingerprint, from whichever chunk carried one (null: none did). */
  #fingerprint: string | null = null;

  constructor(kind: AssembleKind) {
    this.kind = kind;
  }

  /** Folds one parsed data event in (the usage chunk included). */
  add(chunk: StreamChunk): void {
    if (this.#id === null && chunk.id !== undefined) {
      this.#id = chunk.id;
      this.#created = chunk.created ?? null;
      this.#model = chunk.model ?? null;
    }
    if (typeof chunk.system_fingerprint === 'string') this.#fingerprint = chunk.system_fingerprint;
    // With several choices, a chunk's own usage (continuous_usage_stats) counts its choice alone:
    // the final chunk's, which has no choices, is the request's, and is taken over any other.
    const hasChoices = Array.isArray(chunk.choices) && chunk.choices.length > 0;
    if (chunk.usage != null && typeof chunk.usage === 'object') {
      if (!hasChoices) this.#finalUsage = chunk.usage;
      else this.#usage = chunk.usage;
    }
    if (!hasChoices) return;
    for (const c of chunk.choices as (Choice | null)[]) {
      // As the relay does for a stream: a choice that is no object carries nothing to fold.
      if (c === null || typeof c !== 'object') continue;
      const index = typeof c.index === 'number' ? c.index : 0;
      let st = this.#choices.get(index);
      if (st === undefined) {
        st = newChoice();
        this.#choices.set(index, st);
      }
      if (this.kind === 'chat') {
        const d = c.delta;
        if (st.role === null && typeof d?.role === 'string') st.role = d.role;
        if (typeof d?.content === 'string') {
          st.text += d.content;
          this.#chars += d.content.length;
        }
        if (typeof d?.reasoning === 'string') {
          st.reasoning = (st.reasoning ?? '') + d.reasoning;
          this.#chars += d.reasoning.length;
        }
        if (typeof d?.reasoning_content === 'string') {
          st.reasoningContent = (st.reasoningContent ?? '') + d.reasoning_content;
          this.#chars += d.reasoning_content.length;
        }
        if (Array.isArray(d?.tool_calls)) this.#chars += foldCalls(st, d.tool_calls);
      } else if (typeof c.text === 'string') {
        st.text += c.text;
        this.#chars += c.text.length;
      }
      if (this.kind === 'completion' && c.logprobs != null && typeof c.logprobs === 'object')
        this.#chars += foldLogprobs(st, c.logprobs as Record<string, unknown>);
      if (c.finish_reason !== undefined && c.finish_reason !== null) {
        st.finish = c.finish_reason;
        st.stop = c.stop_reason ?? null;
      }
    }
  }

  /** Characters of text folded in so far (the body's size, give or take its JSON escapes). */
  get chars(): number {
    return this.#chars;
  }

  /** The body vLLM would have sent for the same request, non-streamed: its choices in index order. */
  body(): Buffer {
    const u = this.#finalUsage ?? this.#usage;
    let usage: Record<string, unknown> | null = null;
    if (u !== null) {
      // vLLM's four fields in its order, then whatever else this backend's usage carries
      // (a release or fork with reasoning-token details, timings): the body says what it said.
      usage = {
        prompt_tokens: u.prompt_tokens ?? null,
        total_tokens: u.total_tokens ?? null,
        completion_tokens: u.completion_tokens ?? null,
        prompt_tokens_details: u.prompt_tokens_details ?? null,
      };
      for (const [k, v] of Object.entries(u)) if (!(k in usage)) usage[k] = v;
    }
    const indexes = [...this.#choices.keys()].sort((a, b) => a - b);
    // A stream with no choice at all (cut at once) still answers with the one choice vLLM's would.
    if (indexes.length === 0) indexes.push(0);
    const states = indexes.map((i) => [i, this.#choices.get(i) ?? newChoice()] as const);
    if (this.kind === 'chat') {
      // One name for the reasoning channel on every choice: the one the backend streamed it with.
      const names = {
        reasoning: states.some(([, st]) => st.reasoning !== null),
        reasoningContent: states.some(([, st]) => st.reasoningContent !== null),
      };
      return Buffer.from(
        JSON.stringify({
          id: this.#id,
          object: 'chat.completion',
          created: this.#created,
          model: this.#model,
          choices: states.map(([index, st]) => ({
            index,
            message: chatMessage(st, names),
            logprobs: null,
            finish_reason: st.finish,
            stop_reason: st.stop,
          })),
          service_tier: null,
          system_fingerprint: this.#fingerprint,
          usage,
          prompt_logprobs: null,
          kv_transfer_params: null,
        }),
      );
    }
    return Buffer.from(
      JSON.stringify({
        id: this.#id,
        object: 'text_completion',
        created: this.#created,
        model: this.#model,
        choices: states.map(([index, st]) => ({
          index,
          text: st.text,
          logprobs: logprobsOf(st),
          finish_reason: st.finish,
          stop_reason: st.stop,
          prompt_logprobs: null,
        })),
        service_tier: null,
        system_fingerprint: this.#fingerprint,
        usage,
        kv_transfer_params: null,
      }),
    );
  }
}

/**
 * A chat choice's message, as vLLM's pydantic model writes it; `names`: which names of the
 * reasoning channel any choice of the body streamed.
 */
function chatMessage(
  st: ChoiceState,
  names: { reasoning: boolean; reasoningContent: boolean },
): Record<string, unknown> {
  const reasoned = st.reasoning !== null || st.reasoningContent !== null;
  const calls = toolCalls(st);
  const message: Record<string, unknown> = {
    role: st.role ?? 'assistant',
    content: (reasoned || calls.length > 0) && st.text === '' ? null : st.text,
    refusal: null,
    annotations: null,
    audio: null,
    function_call: null,
    tool_calls: calls,
  };
  // The name the backend used, or else the earlier releases' null (as the simulator writes it).
  if (names.reasoning) message.reasoning = st.reasoning;
  if (names.reasoningContent || !names.reasoning) message.reasoning_content = st.reasoningContent;
  return message;
}

/** Folds a chunk's tool-call deltas into `st`; returns the characters they added. */
function foldCalls(st: ChoiceState, deltas: unknown[]): number {
  let chars = 0;
  for (const raw of deltas) {
    if (raw === null || typeof raw !== 'object') continue;
    const d = raw as { index?: unknown; id?: unknown; type?: unknown; function?: unknown };
    const index = typeof d.index === 'number' ? d.index : 0;
    st.calls ??= new Map();
    let call = st.calls.get(index);
    if (call === undefined) {
      call = { id: null, type: null, name: '', arguments: '' };
      st.calls.set(index, call);
    }
    if (call.id === null && typeof d.id === 'string') call.id = d.id;
    if (call.type === null && typeof d.type === 'string') call.type = d.type;
    const fn = d.function as { name?: unknown; arguments?: unknown } | null | undefined;
    if (typeof fn?.name === 'string') {
      call.name += fn.name;
      chars += fn.name.length;
    }
    if (typeof fn?.arguments === 'string') {
      call.arguments += fn.arguments;
      chars += fn.arguments.length;
    }
  }
  return chars;
}

/** vLLM's ToolCall list of a message, in the calls' index order. */
function toolCalls(st: ChoiceState): Record<string, unknown>[] {
  if (st.calls === null) return [];
  return [...st.calls.entries()]
    .sort(([a], [b]) => a - b)
    .map(([, c]) => ({
      id: c.id ?? `chatcmpl-tool-${randomUUID().replaceAll('-', '')}`,
      type: c.type ?? 'function',
      function: { name: c.name, arguments: c.arguments },
    }));
}

/**
 * Joins a completion chunk's four logprobs lists into `st`; returns the characters they add to the
 * body (their JSON), what they count against its bound.
 */
function foldLogprobs(st: ChoiceState, logprobs: Record<string, unknown>): number {
  st.logprobs ??= new Map();
  let chars = 0;
  for (const name of COMPLETION_LOGPROB_LISTS) {
    const part = logprobs[name];
    if (!Array.isArray(part)) continue;
    chars += JSON.stringify(part).length;
    const list = st.logprobs.get(name);
    if (list === undefined) st.logprobs.set(name, [...part]);
    else for (const item of part) list.push(item);
  }
  return chars;
}

/**
 * A completion choice's logprobs as vLLM's non-streamed body writes them; null when no chunk
 * carried any. Its text offsets are not the streamed ones: the body chains each token's own length
 * (in code points, as Python counts) from 0, where a stream gives the length of the text it had
 * sent; the two differ wherever a token's text alone is not what it added to the output (a byte
 * token of a character split in two reads "�" alone and adds nothing until the second).
 */
function logprobsOf(st: ChoiceState): Record<string, unknown> | null {
  if (st.logprobs === null) return null;
  const out: Record<string, unknown> = {};
  for (const name of COMPLETION_LOGPROB_LISTS) out[name] = st.logprobs.get(name) ?? [];
  const tokens = st.logprobs.get('tokens');
  if (tokens?.every((t) => typeof t === 'string')) {
    const offsets: number[] = [];
    let at = 0;
    for (const t of tokens as string[]) {
      offsets.push(at);
      for (const _ of t) at++;
    }
    out.text_offset = offsets;
  }
  return out;
}
