// The canonical prompt: a request's tool definitions and chat messages (role, name, content,
// tool calls, in order), or its completion prompt, rendered the same way every time and cut into
// chained blocks (chain-hash.ts), so that a block's hash names everything before it: the same
// system prompt followed by different questions gives the same leading hashes, and a conversation
// continued over several turns keeps the hashes of its earlier turns.
//
// Block geometry is fixed: `BLOCK_CHARS_PER_TOKEN` characters of canonical text per token of
// `router.block_size_tokens`, so hashes never change with any estimate. Turning blocks and
// characters into tokens is the calibrated estimate's job (`TokenEstimate`). Nothing here runs a
// tokenizer: the whole pass is one read of the prompt's characters.
//
// Rendering, for chat: per message `<role>[:<name>]\n<content>\n\n`, with the tool definitions as
// `tools\n<JSON of tools>\n\n` after the leading system (or developer) messages, where chat
// templates put them (Qwen, Hermes: the system prompt first, then the tools), so that one system
// prompt with different tools shares its blocks, and different system prompts with one tool list
// share none. A chain with tools starts from a root of its own (TOOLS_TAG): Llama 3.x's template
// writes `Environment: ipython` into the system header, before the system prompt, whenever tools
// are given, so the same system prompt with tools and without shares no block there; under a
// template that does not, the cost is a missed hit, where one chain would be a false one. A content array's consecutive text parts are one text, joined by '\n' as
// vLLM joins them for a template that takes a string (so parts and the same text as a string hash
// alike); any other part (an image) is a digest of its JSON followed by a fixed run of filler
// standing for its tokens (`media`), '\n' between it and its neighbours; an assistant's tool calls
// follow as their JSON; each text, tool calls and tool call id stands between a marker of its kind
// and one of its length (hashed, not counted as text), its own NULs doubled, so no content can
// forge a boundary. For completions:
// the first prompt's text as it is (several prompts are separate sequences to vLLM, each from its
// own start; the first one's blocks stand for them all, the others are counted). Token-id prompts
// are hashed as ids, vLLM's own way. Every chain starts from a root named after the model and the
// request's cache_salt (`cacheRoot`), which key vLLM's cache as well as the tokens do.
import { blockHashes, namedRoot, ROOT_HASH, saltedRoot, TextBlocks } from './chain-hash.ts';

/** Characters of canonical text per token of a block (the endpoint picker's approximation: 4). */
export const BLOCK_CHARS_PER_TOKEN = 4;

/**
 * Tokens a part that is not text (an image) is taken for until the backends' counts teach
 * otherwise: LLaVA-1.5's 24 × 24 patches. The block stream gives every such part this many
 * tokens' worth of filler, whatever its size, so the geometry never depends on an estimate.
 */
export const MEDIA_PART_TOKENS = 576;
/** Names a chain with tool definitions (promptBlocks): no rendering key (each holds '=') or salt tag is this. */
const TOOLS_TAG = '\u0000tools';
const MEDIA_FILLER = '\u0001'.repeat(MEDIA_PART_TOKENS * BLOCK_CHARS_PER_TOKEN);
/**
 * A string in a media part or an earlier turn's reasoning longer than this is named by its length
 * and a hash, not hashed into the blocks as it is: it is not text the backend prefills, and hashed
 * whole, its characters made blocks the prefix index then credited as cached tokens.
 */
const OPAQUE_STRING_WHOLE = 64;
/** …and one longer than this (a data URL) by a hash of samples of it, not of all of it. */
const MEDIA_STRING_WHOLE = 4096;
const MEDIA_SAMPLES = 32;
const MEDIA_SAMPLE_CHARS = 128;
/** Media parts of one prompt given the filler; later ones are their digest alone. */
const MAX_FILLED_MEDIA = 16;
/** More tokens than this for one part is taken for a miscount, not learnt from. */
const MAX_MEDIA_PART_TOKENS = 100_000;

export type PromptSource =
  | { kind: 'chat'; messages: readonly unknown[]; tools?: unknown }
  | { kind: 'text'; texts: readonly string[] }
  | { kind: 'ids'; ids: readonly (readonly number[])[] };

export interface PromptBlocks {
  /** Chained hashes of the full blocks, in order. */
  readonly hashes: readonly number[];
  /** Characters of text the model reads as tokens (content, roles, tool JSON; not image data). */
  readonly textChars: number;
  /** Tokens of the prompt, exactly, when the client sent token ids; else null. */
  readonly exactTokens: number | null;
  /** Chat messages (for the template's tokens per message); 0 for completions. */
  readonly messages: number;
  /** Completion prompts given as text (each gets a BOS token). */
  readonly texts: number;
  /** Tokens one block stands for is exact (`block_size_tokens`), not estimated from characters. */
  readonly blockIsTokens: boolean;
  /** Content parts that are not text (images, audio): tokens the characters do not account for. */
  readonly mediaParts: number;
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** A message a chat template renders before the tool definitions. */
const isSystem = (m: unknown): boolean => isRecord(m) && (m.role === 'system' || m.role === 'developer');

const roots = new Map<string, number>();
const MAX_ROOTS = 256;

/**
 * The root of a request's chain: the endpoint (a chat's messages and a completion's text are
 * never the same tokens to vLLM: its template puts special tokens between messages), the model it
 * names (a LoRA adapter is a model name here), its tenant when the gateway has tenants, and its
 * cache_salt. A model's (and tenant's) root is remembered (the served models, already checked,
 * and the configured tenants are few); a salt's is hashed per request, never kept: a client
 * chooses its salts, and their size.
 *
 * Invariants: one tenant's blocks never match another's. The index learns from every request, and
 * what it matches reaches the client (x-slagate-prefix-hit, the predicted TTFT): with one chain for
 * all, a tenant could confirm another's prompt, block by block, from those headers. And no field
 * a client writes can stand for another: a completion's text for a chat's rendering (the endpoint
 * is in the root, where no text reaches), a salt for a rendering key (the salt hangs from its own
 * tag).
 */
export function cacheRoot(
  model: string,
  cacheSalt: unknown,
  tenant: string | null = null,
  rendering: string | null = null,
  endpoint: 'chat' | 'completion' = 'chat',
): number {
  const key = tenant === null ? `${endpoint}\u0000${model}` : `${endpoint}\u0000${tenant}\u0000${model}`;
  let root = roots.get(key);
  if (root === undefined) {
    const named = tenant === null ? namedRoot(model) : namedRoot(tenant, namedRoot(model));
    root = namedRoot(endpoint, named);
    if (roots.size < MAX_ROOTS) roots.set(key, root);
  }
  // Per request, like a salt: the fields that change how vLLM renders and tokenizes the prompt.
  if (rendering !== null) root = namedRoot(rendering, root);
  return typeof cacheSalt === 'string' ? saltedRoot(cacheSalt, root) : root;
}

/**
 * Request fields that change the tokens vLLM makes of the same messages or prompt (its chat
 * template and what it is given, the special tokens), each with its value when it is not vLLM's
 * default; null when none is. Two requests that differ here share no cached block however alike
 * their text, so they must not share a chain: a false hit would send a request where its prompt is
 * not held and tell the client so. A default sent explicitly reads as the default; the same kwargs
 * written in another key order are another chain: a missed hit, never a false one.
 */
export function renderingKey(kind: 'chat' | 'completion', body: Record<string, unknown>): string | null {
  let key: string | null = null;
  const add = (name: string, value: unknown) => {
    if (value === undefined || value === null) return;
    key = `${key ?? ''}\u0000${name}=${JSON.stringify(value) ?? ''}`;
  };
  if (kind === 'chat') {
    add('chat_template', body.chat_template);
    add('chat_template_kwargs', body.chat_template_kwargs);
    add('documents', body.documents);
    add('reasoning_effort', body.reasoning_effort);
    add('mm_processor_kwargs', body.mm_processor_kwargs);
    if (body.add_generation_prompt === false) add('add_generation_prompt', false);
    if (body.continue_final_message === true) add('continue_final_message', true);
    if (body.add_special_tokens === true) add('add_special_tokens', true);
  } else if (body.add_special_tokens === false) {
    add('add_special_tokens', false);
  }
  return key;
}

/**
 * Renders and hashes one prompt; `blockSizeTokens` is `router.block_size_tokens`, `root` the
 * chain's root (`cacheRoot`).
 */
export function promptBlocks(
  source: PromptSource,
  blockSizeTokens: number,
  chainRoot = ROOT_HASH,
): PromptBlocks {
  const hasTools = source.kind === 'chat' && source.tools !== undefined && source.tools !== null;
  const root = hasTools ? namedRoot(TOOLS_TAG, chainRoot) : chainRoot;
  if (source.kind === 'ids') {
    // Several id prompts are separate prompts to vLLM; the first one's blocks stand for them all.
    let total = 0;
    for (const p of source.ids) total += p.length;
    return {
      hashes: blockHashes(source.ids[0] ?? [], blockSizeTokens, [], root),
      textChars: 0,
      exactTokens: total,
      messages: 0,
      texts: 0,
      blockIsTokens: true,
      mediaParts: 0,
    };
  }
  const out = new CanonicalText(blockSizeTokens * BLOCK_CHARS_PER_TOKEN, root);
  if (source.kind === 'chat') {
    const { messages, tools } = source;
    // The reasoning chat templates render (Qwen3's, DeepSeek-R1's) is the current turn's: that of
    // the assistant messages after the last user message. An earlier turn's is hashed, not counted.
    let lastUser = -1;
    for (let k = 0; k < messages.length; k++) {
      const m = messages[k];
      if (isRecord(m) && m.role === 'user') lastUser = k;
    }
    let i = 0;
    if (tools !== undefined && tools !== null) {
      while (i < messages.length && isSystem(messages[i])) out.message(messages[i++], i > lastUser);
      out.text('tools\n');
      out.text(JSON.stringify(tools));
      out.text('\n\n');
    }
    for (; i < messages.length; i++) out.message(messages[i], i > lastUser);
  } else {
    source.texts.forEach((t, i) => {
      if (i === 0) out.text(t);
      else out.textChars += t.length;
    });
  }
  return {
    hashes: out.blocks.hashes,
    textChars: out.textChars,
    exactTokens: null,
    messages: source.kind === 'chat' ? source.messages.length : 0,
    texts: source.kind === 'text' ? source.texts.length : 0,
    blockIsTokens: false,
    mediaParts: out.mediaParts,
  };
}

class CanonicalText {
  readonly blocks: TextBlocks;
  textChars = 0;
  mediaParts = 0;

  constructor(blockChars: number, root: number) {
    this.blocks = new TextBlocks(blockChars, root);
  }

  /** Text the model reads: hashed and counted. */
  text(s: string): void {
    this.blocks.add(s);
    this.textChars += s.length;
  }

  /** Bytes that name the prompt but are not read as text tokens (an image): hashed only. */
  opaque(s: string): void {
    this.blocks.add(s);
  }

  /**
   * Invariant: no content can render as a message boundary. Each piece a client writes (a text,
   * tool calls, a tool call id) is between markers naming its kind and its length (piece()), hashed
   * and not counted, so a user text holding "\n\nassistant\n…" is not taken for two messages, nor
   * a chat for a completion of its rendered text: vLLM's template puts special tokens there.
   */
  message(m: unknown, currentTurn = true): void {
    if (!isRecord(m)) return;
    // The role and name are the client's too (vLLM takes any role a template accepts): marked.
    this.piece('o', typeof m.role === 'string' ? m.role : '');
    if (typeof m.name === 'string') this.piece('n', `:${m.name}`);
    this.text('\n');
    // An assistant turn's reasoning, which vLLM hands to the chat template (interleaved thinking),
    // ahead of the turn's content as templates put it: counted as text the backend prefills in the
    // current turn (after the last user message), where templates render it; before it, named by
    // its digest as a media part is (most templates drop it there, and some keep it: a miscount
    // either way, never a prompt taken for another, and a long one costs the index few blocks).
    const reasoning = typeof m.reasoning === 'string' ? m.reasoning : m.reasoning_content;
    if (typeof reasoning === 'string' && m.role === 'assistant') {
      if (currentTurn) this.piece('r', reasoning);
      else this.opaque(`\u0000r${reasoning.length}\u0000${digestLongStrings('', reasoning) as string}`);
    }
    const c = m.content;
    if (typeof c === 'string') {
      this.piece('t', c);
    } else if (Array.isArray(c)) {
      // A run of text parts is one piece, as the same text sent as a string is.
      let run: string | null = null;
      let first = true;
      for (const part of c) {
        const text = partText(part);
        if (text !== null) {
          run = run === null ? text : `${run}\n${text}`;
          continue;
        }
        if (run !== null) {
          if (!first) this.text('\n');
          this.piece('t', run);
          run = null;
          first = false;
        }
        if (!first) this.text('\n');
        first = false;
        if (isRecord(part) && typeof part.type === 'string') this.media(part);
        // Neither text nor a typed part (vLLM refuses the request): named by its JSON after a marker
        // of its own and its length (what comes before it, an earlier turn's reasoning digest, has
        // no closing marker), nothing counted.
        else {
          const json = JSON.stringify(part) ?? '';
          this.opaque(`\u0000u${json.length}\u0000${json}`);
        }
      }
      if (run !== null) {
        if (!first) this.text('\n');
        this.piece('t', run);
      }
    }
    if (m.tool_calls !== undefined && m.tool_calls !== null) this.piece('c', JSON.stringify(m.tool_calls));
    if (typeof m.tool_call_id === 'string') this.piece('i', m.tool_call_id);
    this.text('\n\n');
  }

  /**
   * A part that is not text: its JSON, with every long string (a data URL) replaced by its length
   * and a hash of evenly spaced samples of it, after a marker; then MEDIA_FILLER. Invariant: a part
   * costs the same blocks and the same hashing whatever its size (hashed whole, a 200 KB image was
   * some 800 index blocks, enough to push every text prefix of a backend out of its index, and a
   * millisecond of hashing), and its hash still changes with its content: two images alike in
   * length and in all 32 samples of 128 characters are taken for one, which costs a misrouted
   * request, never a wrong answer (the backend's cache keys on the image itself).
   */
  media(part: Record<string, unknown>): void {
    const named = JSON.stringify(part, digestLongStrings);
    this.opaque(`\u0000m${named.length}\u0000${named}`);
    // The filler's hashing is bounded per request, not per part: past MAX_FILLED_MEDIA parts a
    // part is its digest alone (a request of thousands of tiny parts is not thousands of fillers).
    if (this.mediaParts < MAX_FILLED_MEDIA) this.opaque(MEDIA_FILLER);
    this.mediaParts++;
  }

  /**
   * A client's text between two markers, hashed and not counted: its kind before it, its length
   * after it. The length goes after: two texts that open alike (one document followed by different
   * questions, in one message) share the blocks of that opening, as their tokens share vLLM's
   * cache; a length before the text made every block of such texts differ from their first.
   * Invariant: the hashed stream reads one way from its start, so two message lists share blocks
   * only as far as they are alike. Each marker is one NUL, a name or a length, one NUL; a NUL of the
   * client's is hashed doubled, so inside a text a single NUL always starts its closing marker and
   * no content spells one (a text holding a boundary's markers shared all but the last block of
   * another conversation, and its insert made that conversation's blocks look cached where they
   * were not). Counted as the client wrote it.
   */
  piece(kind: string, s: string): void {
    this.opaque(`\u0000${kind}\u0000`);
    this.blocks.add(s.indexOf('\u0000') < 0 ? s : s.replaceAll('\u0000', '\u0000\u0000'));
    this.textChars += s.length;
    this.opaque(`\u0000${s.length}\u0000`);
  }
}

/**
 * The text of a content part vLLM reads as text (a plain string among the parts, `text`, the
 * Responses API's `input_text` and `output_text`, an assistant's `refusal`, a `thinking` part's
 * thinking), else null.
 */
export function partText(part: unknown): string | null {
  if (typeof part === 'string') return part;
  if (!isRecord(part)) return null;
  switch (part.type) {
    case 'text':
    case 'input_text':
    case 'output_text':
      return typeof part.text === 'string' ? part.text : null;
    case 'refusal':
      return typeof part.refusal === 'string' ? part.refusal : null;
    case 'thinking':
      return typeof part.thinking === 'string' ? part.thinking : null;
    default:
      return null;
  }
}

/**
 * JSON.stringify's replacer for a media part: a string over OPAQUE_STRING_WHOLE characters becomes
 * its length and a hash (of samples of it, past MEDIA_STRING_WHOLE), a few characters whatever its
 * size. Invariant: what is not text the backend prefills adds at most a block or so to the stream.
 */
function digestLongStrings(_key: string, v: unknown): unknown {
  if (typeof v !== 'string' || v.length <= OPAQUE_STRING_WHOLE) return v;
  if (v.length <= MEDIA_STRING_WHOLE) return `${v.length}:${namedRoot(v).toString(36)}`;
  const stride = (v.length - MEDIA_SAMPLE_CHARS) / (MEDIA_SAMPLES - 1);
  let sampled = '';
  for (let i = 0; i < MEDIA_SAMPLES; i++) {
    const at = Math.floor(i * stride);
    sampled += v.slice(at, at + MEDIA_SAMPLE_CHARS);
  }
  return `${v.length}:${namedRoot(sampled).toString(36)}`;
}

/**
 * A value learnt from samples: their running mean over the first 1/alpha, then an exponentially
 * weighted one, so it follows a change of traffic; `initial` until the first sample.
 */
class Learnt {
  value: number;
  samples = 0;
  readonly #alpha: number;

  constructor(initial: number, alpha: number) {
    this.value = initial;
    this.#alpha = alpha;
  }

  learn(x: number): void {
    this.samples++;
    this.value += Math.max(this.#alpha, 1 / this.samples) * (x - this.value);
  }
}

/**
 * Output tokens a sequence is expected to take until its tenant's completions have taught a
 * figure, and a request without max_tokens is counted with in the tenant token budget (ShareGPT's
 * mean output is about 200 tokens; research/vllm.md F).
 */
export const EXPECTED_OUTPUT_TOKENS = 256;

/**
 * Characters per token, learnt from what the backends count (usage.prompt_tokens against the
 * characters the gateway rendered), and tokens per part that is not text, learnt the same way
 * from prompts that have such parts (Learnt). Until it has learnt anything it assumes `initial`
 * characters per token (English prose in Llama 3's and cl100k's BPE: about 4) and
 * MEDIA_PART_TOKENS per part.
 */
export class TokenEstimate {
  readonly #charsPerTokenLearnt: Learnt;
  readonly #mediaLearnt: Learnt;
  readonly #outputLearnt: Learnt;
  readonly #initial: number;
  /** Read in place of each figure until this one has learnt it from `priorUntil` prompts. */
  readonly #prior: TokenEstimate | null;
  readonly #priorUntil: number;

  constructor(
    initial = BLOCK_CHARS_PER_TOKEN,
    alpha = 0.02,
    prior: TokenEstimate | null = null,
    priorUntil = 0,
  ) {
    this.#charsPerTokenLearnt = new Learnt(initial, alpha);
    this.#mediaLearnt = new Learnt(MEDIA_PART_TOKENS, alpha);
    this.#outputLearnt = new Learnt(EXPECTED_OUTPUT_TOKENS, alpha);
    this.#initial = initial;
    this.#prior = prior;
    this.#priorUntil = priorUntil;
  }

  /** `own`'s value, or the prior's figure (`ofPrior`) until `own` has learnt from priorUntil samples. */
  #read(own: Learnt, ofPrior: (p: TokenEstimate) => number): number {
    return this.#prior !== null && own.samples < this.#priorUntil ? ofPrior(this.#prior) : own.value;
  }

  get charsPerToken(): number {
    return this.#read(this.#charsPerTokenLearnt, (p) => p.charsPerToken);
  }

  /** Prompts learnt from so far. */
  get samples(): number {
    return this.#charsPerTokenLearnt.samples;
  }

  /** Tokens a part that is not text is taken for. */
  get mediaTokens(): number {
    return this.#read(this.#mediaLearnt, (p) => p.mediaTokens);
  }

  /** Prompts with such parts learnt from so far. */
  get mediaSamples(): number {
    return this.#mediaLearnt.samples;
  }

  /**
   * Output tokens one sequence takes, learnt from completed requests (usage.completion_tokens per
   * sequence): what a request is expected to decode, where its max_tokens is only a ceiling
   * (clients send 32,768 and write a few hundred).
   */
  get outputTokens(): number {
    return this.#read(this.#outputLearnt, (p) => p.outputTokens);
  }

  /** Completed requests the output figure was learnt from so far. */
  get outputSamples(): number {
    return this.#outputLearnt.samples;
  }

  /** A completed request decoded `tokens` output tokens per sequence. */
  learnOutput(tokens: number): void {
    if (Number.isFinite(tokens) && tokens >= 0) this.#outputLearnt.learn(tokens);
  }

  /**
   * Prompt tokens of a rendered prompt: characters over the learnt ratio, plus the template's,
   * plus the learnt tokens of each part that is not text.
   */
  tokens(p: PromptBlocks): number {
    if (p.exactTokens !== null) return p.exactTokens;
    return Math.ceil(p.textChars / this.charsPerToken + p.mediaParts * this.mediaTokens) + templateTokens(p);
  }

  /**
   * The fewest tokens `p` plausibly holds: its characters at the learnt ratio or at the initial
   * one, whichever counts fewer. A ratio learnt from other traffic (another script, say) may be
   * far below this prompt's own; a refusal on length is judged on this count, not on tokens().
   * Parts that are not text count nothing here: their size varies by model and by image.
   */
  fewestTokens(p: PromptBlocks): number {
    if (p.exactTokens !== null) return p.exactTokens;
    return Math.ceil(p.textChars / Math.max(this.charsPerToken, this.#initial)) + templateTokens(p);
  }

  /** Tokens that one block of `p` stands for. */
  tokensPerBlock(p: PromptBlocks, blockSizeTokens: number): number {
    return p.blockIsTokens ? blockSizeTokens : this.textBlockTokens(blockSizeTokens);
  }

  /** Tokens that one block of text stands for, at the learnt ratio (`blockSizeTokens` × 4 characters). */
  textBlockTokens(blockSizeTokens: number): number {
    return (blockSizeTokens * BLOCK_CHARS_PER_TOKEN) / this.charsPerToken;
  }

  /** A backend counted `promptTokens` for this rendering. */
  learn(p: PromptBlocks, promptTokens: number): void {
    if (p.exactTokens !== null) return;
    // An image's tokens are in the count and not in the characters: they would teach a ratio far
    // too low. What the text does not account for, at the ratio learnt from text alone, is theirs.
    if (p.mediaParts > 0) {
      const perPart = (promptTokens - templateTokens(p) - p.textChars / this.charsPerToken) / p.mediaParts;
      if (!(perPart >= 1 && perPart <= MAX_MEDIA_PART_TOKENS)) return;
      this.#mediaLearnt.learn(perPart);
      return;
    }
    // Short prompts are mostly template: their ratio says little about the text.
    if (p.textChars < 256) return;
    const content = promptTokens - templateTokens(p);
    if (!(content > 0)) return;
    const ratio = p.textChars / content;
    if (!(ratio > 0.5 && ratio < 20)) return;
    this.#charsPerTokenLearnt.learn(ratio);
  }
}

/**
 * Pieces of text each at least one token, whatever the text around them: a special token written
 * out (`<|eot_id|>`, one token though it holds words), a word (letters with their combining marks,
 * and a contraction's apostrophe: o200k-style pre-tokenizers keep both in one piece), a run of
 * digits (one token per three).
 */
const FLOOR_PIECES = /(<\|[^|<>\s]{1,64}\|>)|([\p{L}\p{M}]+(?:['\u2019][\p{L}\p{M}]+)*)|(\p{N}+)/gu;

/**
 * The fewest tokens `text` can be in Llama 3's (and cl100k's, and o200k-style) BPE. Their
 * pre-tokenizers split text into pieces BPE never joins; no piece holds two of the words counted
 * here, letters and digits together, or more than three digits. So the words and digit groups are
 * at most the pieces, and the pieces at most the tokens. Prose counts about three quarters of its
 * tokens; whitespace, punctuation and code count less, never more: a run of 128 spaces is one
 * token, where a count of characters at four a token would take it for 32. Runs the regex over the
 * text: for a refusal, not every request. With `atMost`, stops once the count is past it (and
 * returns that count): a floor above the context length refuses the prompt whatever its exact
 * value, so the work is bounded by the context, not by the body (a 4 MiB run of one-letter words
 * is two million matches).
 */
export function tokenFloor(text: string, atMost = Number.POSITIVE_INFINITY): number {
  let n = 0;
  for (const m of text.matchAll(FLOOR_PIECES)) {
    n += m[3] === undefined ? 1 : Math.ceil(m[3].length / 3);
    if (n > atMost) break;
  }
  return n;
}

/**
 * The fewest tokens each prompt of `source` can be (one entry for chat): exact for token ids; for
 * text, the floor of the client's own text (message contents, completion prompts; roles and tool
 * JSON, whose rendering varies by template, count nothing, and neither do the template's own
 * tokens: some templates spend none on a system message), plus a completion prompt's BOS.
 * Invariant: every template renders at least what is counted here of a message. Of an assistant's
 * content, only what follows its last `</think>` counts: the templates of reasoning models
 * (DeepSeek-R1's, QwQ's, Qwen3's for earlier turns) render only that part.
 */
export function promptFloors(source: PromptSource, atMost = Number.POSITIVE_INFINITY): number[] {
  if (source.kind === 'ids') return source.ids.map((ids) => ids.length);
  if (source.kind === 'text') return source.texts.map((t) => tokenFloor(t, atMost) + 1);
  let n = 0;
  for (const m of source.messages) {
    if (n > atMost) break;
    if (!isRecord(m)) continue;
    const answer = m.role === 'assistant';
    const c = m.content;
    if (typeof c === 'string') n += tokenFloor(answer ? afterThinking(c) : c, atMost - n);
    else if (Array.isArray(c)) {
      for (const part of c) {
        if (n > atMost) break;
        const text = partText(part);
        if (text !== null) n += tokenFloor(answer ? afterThinking(text) : text, atMost - n);
      }
    }
  }
  return [n];
}

/** What follows the last `</think>` of an assistant's text (all of it when there is none). */
function afterThinking(text: string): string {
  const at = text.lastIndexOf('</think>');
  return at === -1 ? text : text.slice(at + '</think>'.length);
}

/**
 * Llama 3's chat template: BOS, a header and an end-of-turn per message (the role is in the text),
 * and the assistant header that opens the answer; each text completion prompt gets a BOS.
 */
function templateTokens(p: PromptBlocks): number {
  return p.messages > 0 ? 1 + 3 * p.messages + 3 : p.texts;
}
