// A non-streamed answer built from a stream. The gateway always asks the backend for a stream, so
// that every request has a measured TTFT and TPOT; when the client asked for one JSON body, the
// chunks are folded into the body vLLM itself would have sent (key order and nulls of vLLM's
// pydantic models, as src/sim/wire.ts writes them), and only that body reaches the client.
//
// A reasoning model's channel keeps the name the backend streamed it with: `reasoning` in current
// vLLM, `reasoning_content` in earlier releases (the message carries the same name as the deltas).
// vLLM's reasoning parsers give no content (null, not "") when the model wrote only reasoning.
//
// Shapes it does not cover are sent upstream non-streamed and relayed as they come (`assemblable`
// says which): logprobs of any kind, tool definitions (tool-call deltas), n > 1, several
// completion prompts, echo, best_of and beam search, vLLM's token-id extras, the transfer parameters
// of disaggregated prefill.

export type AssembleKind = 'chat' | 'completion';

/** Request fields whose presence makes a non-streamed request pass through unassembled. */
const CHAT_UNCOVERED = ['logprobs', 'top_logprobs', 'prompt_logprobs', 'tools', 'functions'] as const;
const COMPLETION_UNCOVERED = ['logprobs', 'prompt_logprobs', 'echo', 'best_of', 'use_beam_search'] as const;
// The transfer parameters of disaggregated prefill: vLLM returns them in the non-streamed body only
// (no stream chunk carries them), so such a request must reach the backend as sent.
const VLLM_EXTRAS = [
  'return_tokens_as_token_ids',
  'return_token_ids',
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
  completion: new Set(['logprobs', 'prompt_logprobs']),
};

function set(v: unknown, zeroAsks = false): boolean {
  return v !== undefined && v !== null && v !== false && (v !== 0 || zeroAsks);
}

/** Whether a non-streamed request of this shape can be answered from a stream. */
export function assemblable(kind: AssembleKind, body: Record<string, unknown>, prompts: number): boolean {
  const uncovered = kind === 'chat' ? CHAT_UNCOVERED : COMPLETION_UNCOVERED;
  const zero = ZERO_ASKS[kind];
  for (const k of uncovered) if (set(body[k], zero.has(k))) return false;
  for (const k of VLLM_EXTRAS) if (set(body[k])) return false;
  if (body.n !== undefined && body.n !== null && body.n !== 1) return false;
  return kind === 'chat' || prompts === 1;
}

interface Choice {
  index?: unknown;
  delta?: { role?: unknown; content?: unknown; reasoning?: unknown; reasoning_content?: unknown } | null;
  text?: unknown;
  finish_reason?: unknown;
  stop_reason?: unknown;
}

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
}

export class Assembler {
  readonly kind: AssembleKind;
  #id: unknown = null;
  #created: unknown = null;
  #model: unknown = null;
  #text = '';
  /** The reasoning channel as streamed under each of its two names (null: never seen). */
  #reasoning: string | null = null;
  #reasoningContent: string | null = null;
  #finish: unknown = null;
  #stop: unknown = null;
  #usage: NonNullable<StreamChunk['usage']> | null = null;
  /** The role the stream's first chunk named (vLLM's response role, or the last message's). */
  #role: string | null = null;

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
    if (chunk.usage != null && typeof chunk.usage === 'object') this.#usage = chunk.usage;
    if (!Array.isArray(chunk.choices)) return;
    for (const c of chunk.choices as Choice[]) {
      if (this.kind === 'chat') {
        const d = c.delta;
        if (this.#role === null && typeof d?.role === 'string') this.#role = d.role;
        if (typeof d?.content === 'string') this.#text += d.content;
        if (typeof d?.reasoning === 'string') this.#reasoning = (this.#reasoning ?? '') + d.reasoning;
        if (typeof d?.reasoning_content === 'string')
          this.#reasoningContent = (this.#reasoningContent ?? '') + d.reasoning_content;
      } else if (typeof c.text === 'string') {
        this.#text += c.text;
      }
      if (c.finish_reason !== undefined && c.finish_reason !== null) {
        this.#finish = c.finish_reason;
        this.#stop = c.stop_reason ?? null;
      }
    }
  }

  /** Characters of text folded in so far (the body's size, give or take its JSON escapes). */
  get chars(): number {
    return this.#text.length + (this.#reasoning?.length ?? 0) + (this.#reasoningContent?.length ?? 0);
  }

  /** The body vLLM would have sent for the same request, non-streamed. */
  body(): Buffer {
    const u = this.#usage;
    const usage =
      u === null
        ? null
        : {
            prompt_tokens: u.prompt_tokens ?? null,
            total_tokens: u.total_tokens ?? null,
            completion_tokens: u.completion_tokens ?? null,
            prompt_tokens_details: u.prompt_tokens_details ?? null,
          };
    if (this.kind === 'chat') {
      const reasoned = this.#reasoning !== null || this.#reasoningContent !== null;
      const message: Record<string, unknown> = {
        role: this.#role ?? 'assistant',
        content: reasoned && this.#text === '' ? null : this.#text,
        refusal: null,
        annotations: null,
        audio: null,
        function_call: null,
        tool_calls: [],
      };
      // The name the backend used, or else the earlier releases' null (as the simulator writes it).
      if (this.#reasoning !== null) message.reasoning = this.#reasoning;
      if (this.#reasoningContent !== null || this.#reasoning === null)
        message.reasoning_content = this.#reasoningContent;
      return Buffer.from(
        JSON.stringify({
          id: this.#id,
          object: 'chat.completion',
          created: this.#created,
          model: this.#model,
          choices: [
            {
              index: 0,
              message,
              logprobs: null,
              finish_reason: this.#finish,
              stop_reason: this.#stop,
            },
          ],
          service_tier: null,
          system_fingerprint: null,
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
        choices: [
          {
            index: 0,
            text: this.#text,
            logprobs: null,
            finish_reason: this.#finish,
            stop_reason: this.#stop,
            prompt_logprobs: null,
          },
        ],
        service_tier: null,
        system_fingerprint: null,
        usage,
        kv_transfer_params: null,
      }),
    );
  }
}
