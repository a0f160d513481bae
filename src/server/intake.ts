// The server stage of an inference request: who sends it, in which class, what it asks for, and
// whether any backend could serve it at all. Each refusal is a thrown GatewayError (401, 400, 404);
// what is learnt goes into the admission record as it is learnt, so a refusal's line says how far
// the request got.
import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import type { SlaClass } from '../config/index.ts';
import { GatewayError } from '../errors/index.ts';
import {
  cacheRoot,
  EXPECTED_OUTPUT_TOKENS,
  type PromptBlocks,
  type PromptSource,
  promptBlocks,
  promptFloors,
  renderingKey,
} from '../prompt/canonical.ts';
import type { RequestRecord } from '../telemetry/admission-log.ts';
import type { AssembleKind, ClientMode } from '../upstream/index.ts';
import { type Identity, namedTenant } from './auth.ts';
import { upstreamSalt } from './cache-salt.ts';
import { type Endpoint, type InferenceRequest, parseInferenceRequest } from './inference-request.ts';
import type { Runtime } from './runtime.ts';

/**
 * What a request keeps of its intake while it is served: everything but its body (see
 * handleInference, inference.ts).
 */
export interface Served {
  readonly identity: Identity;
  readonly cls: SlaClass;
  /** The model served: the one the body names, or the gateway's only one when it names none. */
  readonly model: string;
  /** The canonical prompt's block hashes and size. */
  readonly prompt: PromptBlocks;
  /**
   * The block hashes the router and the prefix index go by: the prompt's, or none when the backend
   * will cut it (truncate_prompt_tokens keeps its last tokens: what it caches starts past the
   * leading blocks these name, which would count a hit that is not there and teach the index
   * blocks the backend never holds), or when it is estimated over the context length (sent for the
   * backend to judge, it is most likely refused and cached nowhere; taught at its grant, its
   * blocks, as many as the context and more, would push the prefixes the backend does hold out of
   * its index).
   */
  readonly blocks: readonly number[];
  /** Prompt tokens as the backend will count them (estimated, exact for token ids). */
  readonly promptTokens: number;
  /**
   * max_tokens (without one, EXPECTED_OUTPUT_TOKENS for chat and vLLM's default of 16 for
   * completions), times the completion prompts and `n`: vLLM generates for each.
   */
  readonly expectedOutputTokens: number;
  /**
   * The output one sequence is expected to take (several prompts' or choices' run side by side):
   * its tenant's learnt output per sequence, or its max_tokens when that is fewer (a ceiling is
   * not an expectation). What the router weighs a slow decode by.
   */
  readonly expectedTokensPerSequence: number;
  /** Tokens one block of the prompt stands for, at its tenant's estimate (the router's cached share). */
  readonly tokensPerBlock: number;
  /** InferenceRequest.readsPrefixCache: false, the backend prefills it whole wherever its blocks are. */
  readonly readsPrefixCache: boolean;
  /** Sequences vLLM generates for it, side by side: `n`, times the prompts of a completion. */
  readonly sequences: number;
  /** How the client is answered (InferenceRequest.mode), and the body an assembly builds. */
  readonly mode: ClientMode;
  readonly assembleKind: AssembleKind;
  /** The client asked for the usage chunk. */
  readonly wantsUsage: boolean;
  /**
   * The cache_salt the backend gets instead of the body's own (cache-salt.ts): its tenant's part,
   * then the client's salt; null leaves the body's salt, if any, as it is.
   */
  readonly cacheSalt: string | null;
  /**
   * No truncate_prompt_tokens: the backend counts the prompt the gateway rendered, and its count
   * teaches the characters-per-token estimate (a prompt it cut counts less than was rendered).
   */
  readonly countsRendered: boolean;
}

/** The intake of a request: what it keeps, and the parsed body, which it keeps until its payload is made. */
export interface Intake {
  readonly served: Served;
  readonly ir: InferenceRequest;
}

export function header(request: { readonly headers: IncomingHttpHeaders }, name: string): string | undefined {
  const v = request.headers[name];
  return typeof v === 'string' ? v : undefined;
}

/** Longest session id the router keeps as it is; a longer one is kept as its digest. */
export const SESSION_ID_CHARS = 64;

/**
 * The session header's value as the router keeps it. Invariant: what the router remembers per
 * session is bounded whatever a client sends. It keeps up to 65,536 sessions; unique ids near the
 * 16 KiB header limit would hold about 1 GB. A longer id becomes its SHA-256 (43 characters), the
 * same for every request that sends it, so affinity is unchanged. With tenants, the id is the
 * tenant's own: another tenant sending the same id is another session (it does not steer the
 * first one's requests, nor learn where they go).
 */
export function sessionKey(value: string | undefined, tenant: string | null = null): string | undefined {
  if (value === undefined) return undefined;
  const id =
    value.length <= SESSION_ID_CHARS ? value : createHash('sha256').update(value).digest('base64url');
  return tenant === null ? id : `${tenant}\u0000${id}`;
}

export function intake(
  rt: Runtime,
  endpoint: Endpoint,
  request: { readonly headers: IncomingHttpHeaders; readonly identity: Identity },
  body: unknown,
  record: RequestRecord,
): Intake {
  // The record has the identity already (the front door's, from the request's head).
  const { identity } = request;
  const cls = rt.config.sla.classes[identity.class]!;

  const ir = parseInferenceRequest(endpoint, body);
  // A body that names no model gets the one the gateway serves, as vLLM gives it its one model. The
  // upstream body then names it (payload.ts): a backend's own default could be another model (its
  // base model when the configured name is an adapter), which the configured names do not offer.
  const model = ir.model ?? rt.models.only();
  record.set({
    model: model === null ? null : shownModel(model),
    stream: ir.stream,
    max_tokens: ir.maxTokens,
  });
  if (model === null) {
    throw new GatewayError(
      'invalid_request',
      `'model' is required: this gateway serves ${rt.models.names().join(', ')}.`,
      { param: 'model' },
    );
  }
  if (!rt.models.has(model)) {
    throw new GatewayError('model_not_found', `The model \`${shownModel(model)}\` does not exist.`, {
      param: 'model',
    });
  }
  const source = promptSource(ir);
  const blockSize = rt.config.router.block_size_tokens;
  const kind = ir.endpoint === 'chat' ? 'chat' : 'completion';
  // The index's chain names the salt the backend will see, so that it matches where the backend's
  // cache does: a reload that isolates a tenant, or gives it a new key, starts its chains afresh.
  const cacheSalt = upstreamSalt(identity.cacheSalt, ir.body.cache_salt);
  const prompt = promptBlocks(
    source,
    blockSize,
    cacheRoot(
      model,
      cacheSalt ?? ir.body.cache_salt,
      namedTenant(identity),
      renderingKey(kind, ir.body),
      kind,
    ),
  );
  // What the backend will prefill: vLLM keeps a prompt's last truncate_prompt_tokens tokens.
  const estimate = rt.tokens.of(identity.tenant);
  const wholeTokens = estimate.tokens(prompt);
  const maxLen = rt.models.maxModelLen(model);
  const promptTokens = keptTokens(ir, prompt, wholeTokens, maxLen);
  const fewestTokens = estimate.fewestTokens(prompt);
  const blocks = routedBlocks(ir, prompt, wholeTokens, fewestTokens, maxLen);
  record.set({ prompt_tokens_est: promptTokens, prefix_blocks: blocks.length });
  checkContext(ir, source, prompt, promptTokens, fewestTokens, maxLen);
  const perSequence = ir.outputLimit ?? EXPECTED_OUTPUT_TOKENS;
  const { sequences } = ir;
  const served: Served = {
    identity,
    cls,
    model,
    prompt,
    blocks,
    promptTokens,
    expectedOutputTokens: perSequence * sequences,
    expectedTokensPerSequence: Math.min(ir.outputLimit ?? Number.POSITIVE_INFINITY, estimate.outputTokens),
    tokensPerBlock: estimate.tokensPerBlock(prompt, blockSize),
    readsPrefixCache: ir.readsPrefixCache,
    sequences,
    mode: ir.mode,
    assembleKind: ir.assembleKind,
    wantsUsage: ir.wantsUsage,
    cacheSalt,
    // Not cut, and no documents (vLLM renders them into the prompt; their text is in no count).
    countsRendered: ir.body.truncate_prompt_tokens == null && ir.body.documents == null,
  };
  return { served, ir };
}

const NO_BLOCKS: readonly number[] = Object.freeze([]);

/**
 * How far over the context length an estimated prompt must be for the gateway to look closer.
 * Closer than that, the backend decides: it counts with the model's own tokenizer, and its 400
 * reaches the client with vLLM's message. The estimate's error is a few percent on prose and
 * larger on code or other scripts.
 */
export const CONTEXT_ESTIMATE_SLACK = 1.25;

/**
 * Invariant: a prompt that fits is never refused here. The estimate counts characters, and text
 * can hold far more of them per token than it assumes (whitespace and separator runs: up to 128
 * a token), so a prompt it puts over the context is refused only on a count that cannot exceed its
 * tokens (promptFloors); otherwise the backend judges it.
 */
function checkContext(
  ir: InferenceRequest,
  source: PromptSource,
  prompt: PromptBlocks,
  allTokens: number,
  fewestTokens: number,
  maxLen: number,
): void {
  const exact = prompt.exactTokens !== null;
  // vLLM checks each completion prompt on its own: the longest decides.
  const tokens = onePrompt(ir, exact, allTokens, 'longest');
  const fewest = onePrompt(ir, exact, fewestTokens, 'longest');
  const output = ir.outputLimit ?? 1;
  // vLLM cuts the prompt to its last truncate_prompt_tokens tokens (-1: to the context length)
  // before it checks the length.
  const fits = (least: number) => truncatedTokens(ir, least, maxLen) + output <= maxLen;
  if (fits(exact ? fewest : Math.floor(fewest / CONTEXT_ESTIMATE_SLACK))) return;
  // Counted no further than past the context: any floor beyond it fails alike (fits only grows
  // with the count, truncation included).
  if (!exact && fits(promptFloors(source, maxLen).reduce((a, b) => Math.max(a, b), 0))) return;
  const about = exact ? '' : 'about ';
  throw new GatewayError(
    'invalid_request',
    `This model's maximum context length is ${maxLen} tokens. However, you requested ` +
      `${about}${tokens + output} tokens (${about}${tokens} in the messages, ` +
      `${output} in the completion).`,
    { param: ir.endpoint === 'chat' ? 'messages' : 'prompt' },
  );
}

/**
 * The prompt tokens the backend prefills: each completion prompt cut on its own, so that two
 * prompts under truncate_prompt_tokens are not cut together.
 */
function keptTokens(ir: InferenceRequest, prompt: PromptBlocks, allTokens: number, maxLen: number): number {
  const each = eachPrompt(ir, prompt.exactTokens !== null, allTokens);
  if (each === null) return truncatedTokens(ir, allTokens, maxLen);
  let kept = 0;
  for (const t of each) kept += truncatedTokens(ir, Math.round(t), maxLen);
  return kept;
}

/**
 * The blocks to route by (Intake.blocks): the prompt's, unless the backend will cut the prompt
 * they name (the first of several completion prompts: theirs are its blocks) or the longest
 * prompt is over the context even at the fewest tokens it plausibly holds (checkContext's
 * measure: a prompt that passes it goes to a backend, and a conversation near the context whose
 * estimate runs a little high must keep its backend, not go cold there and at every later turn).
 * vLLM cuts and checks each completion prompt on its own.
 */
function routedBlocks(
  ir: InferenceRequest,
  prompt: PromptBlocks,
  allTokens: number,
  fewestTokens: number,
  maxLen: number,
): readonly number[] {
  const exact = prompt.exactTokens !== null;
  const first = onePrompt(ir, exact, allTokens, 'first');
  if (truncatedTokens(ir, first, maxLen) < first) return NO_BLOCKS;
  const fewest = onePrompt(ir, exact, fewestTokens, 'longest');
  const least = exact ? fewest : Math.floor(fewest / CONTEXT_ESTIMATE_SLACK);
  if (truncatedTokens(ir, least, maxLen) > maxLen) return NO_BLOCKS;
  return prompt.hashes;
}

/**
 * `tokens` of one prompt as the backend keeps them: vLLM cuts a prompt to its last
 * truncate_prompt_tokens tokens (-1: to the context length) before it checks or prefills it.
 */
export function truncatedTokens(ir: InferenceRequest, tokens: number, maxLen: number): number {
  const cut = ir.body.truncate_prompt_tokens;
  if (cut === -1) return Math.min(tokens, maxLen);
  if (typeof cut === 'number' && Number.isInteger(cut) && cut > 0) return Math.min(tokens, cut);
  return tokens;
}

/**
 * Each completion prompt's tokens when a request has several: exact for token ids, for texts the
 * estimate `allTokens` shared out by characters (unrounded). Null for chat or a single prompt,
 * whose tokens are `allTokens`.
 */
function eachPrompt(ir: InferenceRequest, exact: boolean, allTokens: number): number[] | null {
  const parts = ir.promptParts;
  if (ir.endpoint === 'chat' || parts.length <= 1) return null;
  if (exact) return parts.map((p) => p.length);
  let total = 0;
  for (const p of parts) total += p.length;
  return total === 0 ? null : parts.map((p) => (allTokens * p.length) / total);
}

/** Tokens of the longest, or the first, of a request's completion prompts (all of them for one). */
function onePrompt(
  ir: InferenceRequest,
  exact: boolean,
  allTokens: number,
  which: 'longest' | 'first',
): number {
  const each = eachPrompt(ir, exact, allTokens);
  if (each === null) return allTokens;
  let size = each[0] as number;
  if (which === 'longest') for (const t of each) size = Math.max(size, t);
  return Math.ceil(size);
}

/** What the canonical prompt is rendered from (the body was validated by parseInferenceRequest). */
function promptSource(ir: InferenceRequest): PromptSource {
  if (ir.endpoint === 'chat') {
    return { kind: 'chat', messages: ir.body.messages as unknown[], tools: ir.body.tools };
  }
  const first = ir.promptParts[0];
  if (typeof first === 'string') return { kind: 'text', texts: ir.promptParts as string[] };
  return { kind: 'ids', ids: ir.promptParts as (readonly number[])[] };
}

/** Longest model name the log and an error message repeat: a client's string, bounded there. */
const SHOWN_MODEL_CHARS = 256;

/** The model as the admission record and a refusal show it: a name past the bound cut, marked with '…'. */
function shownModel(model: string): string {
  return model.length <= SHOWN_MODEL_CHARS ? model : `${model.slice(0, SHOWN_MODEL_CHARS)}…`;
}
