// Prompt token counting for the simulator and the gateway: real byte-pair encoding with OpenAI's cl100k_base
// (gpt-tokenizer). Llama 3's 128k vocabulary keeps cl100k's first 100k ranks and merges
// unchanged and adds 28k mostly non-English tokens, so on English text the two tokenizers
// produce the same or nearly the same ids; the simulator's prompt counts, prefix blocks and
// cache hits therefore line up with a real Llama-3 vLLM to within a few tokens.
//
// Chat prompts use Llama 3's chat template with its real special-token ids, so a prompt's
// token sequence (and hence which blocks a shared system prompt fills) has the same structure
// as on vLLM. Llama 3.1's template also injects a dated system preamble (~25 tokens); that is
// not reproduced.
//
// Encoding is the expensive part of a request, so every message content (and completion
// prompt) is cached in an LRU bounded by the total number of cached tokens: a long system
// prompt shared by many requests is encoded once.

import { decode, encode } from 'gpt-tokenizer/encoding/cl100k_base';

export const BEGIN_OF_TEXT = 128000;
export const START_HEADER = 128006;
export const END_HEADER = 128007;
export const EOT = 128009;
/** "\n\n" in cl100k_base and Llama 3. */
export const DOUBLE_NEWLINE = 271;

const SPECIAL_TEXT: ReadonlyMap<number, string> = new Map([
  [BEGIN_OF_TEXT, '<|begin_of_text|>'],
  [START_HEADER, '<|start_header_id|>'],
  [END_HEADER, '<|end_header_id|>'],
  [EOT, '<|eot_id|>'],
]);

/** Special-token strings inside user text are ordinary text, as in vLLM's chat rendering. */
const PLAIN_TEXT = { disallowedSpecial: new Set<string>() };

export type ContentPart = { type: string; text?: unknown };
export interface ChatMessageInput {
  role: string;
  content?: string | readonly ContentPart[] | null;
}

export class TokenizeError extends Error {}

export class Tokenizer {
  private readonly cache = new Map<string, Int32Array>();
  private cachedTokens = 0;

  /** @param maxCachedTokens bound on the sum of cached sequence lengths. */
  constructor(private readonly maxCachedTokens = 4_000_000) {}

  /** Token ids of `text`, no special tokens added. The array is shared: do not modify it. */
  encode(text: string): Int32Array {
    const hit = this.cache.get(text);
    if (hit !== undefined) {
      // Re-insert so Map order stays least-recently-used first.
      this.cache.delete(text);
      this.cache.set(text, hit);
      return hit;
    }
    const tokens = Int32Array.from(encode(text, PLAIN_TEXT));
    if (tokens.length <= this.maxCachedTokens) {
      this.cache.set(text, tokens);
      this.cachedTokens += tokens.length;
      for (const [key, value] of this.cache) {
        if (this.cachedTokens <= this.maxCachedTokens) break;
        this.cache.delete(key);
        this.cachedTokens -= value.length;
      }
    }
    return tokens;
  }

  /** Llama 3 chat template: BOS, then per message header + content + <|eot_id|>. */
  encodeChat(messages: readonly ChatMessageInput[], addGenerationPrompt = true): number[] {
    const out: number[] = [BEGIN_OF_TEXT];
    for (const m of messages) {
      pushHeader(out, this.encode(m.role));
      pushAll(out, this.encode(contentText(m.content).trim()));
      out.push(EOT);
    }
    if (addGenerationPrompt) pushHeader(out, this.encode('assistant'));
    return out;
  }

  /** encodeChat(messages).length without building the sequence (the encodings are cached). */
  countChat(messages: readonly ChatMessageInput[], addGenerationPrompt = true): number {
    // BOS, then per message: start header + role + end header + "\n\n" + content + <|eot_id|>.
    let n = 1;
    for (const m of messages)
      n += 4 + this.encode(m.role).length + this.encode(contentText(m.content).trim()).length;
    if (addGenerationPrompt) n += 3 + this.encode('assistant').length;
    return n;
  }

  /** A completion prompt as vLLM tokenizes it with add_special_tokens: BOS + text. */
  encodePrompt(prompt: string): number[] {
    const out: number[] = [BEGIN_OF_TEXT];
    pushAll(out, this.encode(prompt));
    return out;
  }

  decode(tokens: Iterable<number>): string {
    let text = '';
    let run: number[] = [];
    for (const t of tokens) {
      const special = SPECIAL_TEXT.get(t);
      if (special === undefined) {
        run.push(t);
        continue;
      }
      if (run.length > 0) text += decode(run);
      run = [];
      text += special;
    }
    if (run.length > 0) text += decode(run);
    return text;
  }

  cacheStats(): { entries: number; tokens: number } {
    return { entries: this.cache.size, tokens: this.cachedTokens };
  }
}

/** Text of a message content: a string, or text parts joined by newlines (vLLM's rule). */
export function contentText(content: ChatMessageInput['content']): string {
  if (content === undefined || content === null) return '';
  if (typeof content === 'string') return content;
  const texts: string[] = [];
  for (const part of content) {
    if (part.type !== 'text' || typeof part.text !== 'string') {
      throw new TokenizeError(`content part of type '${String(part.type)}' is not supported by this model`);
    }
    texts.push(part.text);
  }
  return texts.join('\n');
}

function pushHeader(out: number[], role: Int32Array): void {
  out.push(START_HEADER);
  pushAll(out, role);
  out.push(END_HEADER, DOUBLE_NEWLINE);
}

function pushAll(out: number[], tokens: ArrayLike<number>): void {
  for (let i = 0; i < tokens.length; i++) out.push(tokens[i] as number);
}

/** One tokenizer (and cache) per process: replicas of a fleet see the same prompts. */
export const sharedTokenizer = new Tokenizer();
