// The server stage of an inference request: who sends it, in which class, what it asks for, and
// whether any backend could serve it at all. Each refusal is a thrown GatewayError (401, 400, 404);
// what is learnt goes into the admission record as it is learnt, so a refusal's line says how far
// the request got.
import type { FastifyRequest } from 'fastify';
import type { SlaClass } from '../config/index.ts';
import { GatewayError } from '../errors/index.ts';
import type { RequestRecord } from '../telemetry/admission-log.ts';
import type { Identity } from './auth.ts';
import { type Endpoint, type InferenceRequest, parseInferenceRequest } from './inference-request.ts';
import type { Runtime } from './runtime.ts';

/**
 * Output tokens a request without max_tokens is expected to take, for the in-flight token counts
 * and the tenant token budget (ShareGPT's mean output is about 200 tokens; research/vllm.md F).
 */
export const EXPECTED_OUTPUT_TOKENS = 256;

export interface Intake {
  readonly identity: Identity;
  readonly cls: SlaClass;
  readonly ir: InferenceRequest;
  /** Prompt tokens as the backend will count them (estimated). */
  readonly promptTokens: number;
  /** max_tokens, or EXPECTED_OUTPUT_TOKENS without one. */
  readonly expectedOutputTokens: number;
}

export function header(request: FastifyRequest, name: string): string | undefined {
  const v = request.headers[name];
  return typeof v === 'string' ? v : undefined;
}

export function intake(
  rt: Runtime,
  endpoint: Endpoint,
  request: FastifyRequest,
  record: RequestRecord,
): Intake {
  const identity = rt.auth.identify(request.headers.authorization, header(request, 'x-slagate-class'));
  const cls = rt.config.sla.classes[identity.class]!;
  record.set({
    tenant: identity.tenant,
    class: identity.class,
    ttft_target_ms: cls.ttft_p99_ms,
    tpot_target_ms: cls.tpot_p99_ms,
  });

  const ir = parseInferenceRequest(endpoint, request.body);
  record.set({ model: ir.model, stream: ir.stream, max_tokens: ir.maxTokens });
  if (!rt.models.has(ir.model)) {
    throw new GatewayError('model_not_found', `The model \`${ir.model}\` does not exist.`, {
      param: 'model',
    });
  }
  const promptTokens = estimatePromptTokens(rt, ir);
  record.set({ prompt_tokens_est: promptTokens });
  const maxLen = rt.models.maxModelLen(ir.model);
  if (promptTokens + (ir.maxTokens ?? 1) > maxLen) {
    throw new GatewayError(
      'invalid_request',
      `This model's maximum context length is ${maxLen} tokens. However, you requested ` +
        `${promptTokens + (ir.maxTokens ?? 0)} tokens (about ${promptTokens} in the messages, ` +
        `${ir.maxTokens ?? 0} in the completion).`,
      { param: ir.endpoint === 'chat' ? 'messages' : 'prompt' },
    );
  }
  return { identity, cls, ir, promptTokens, expectedOutputTokens: ir.maxTokens ?? EXPECTED_OUTPUT_TOKENS };
}

/** Prompt tokens as the backend will count them (Llama 3 template, cl100k BPE), cached per text. */
function estimatePromptTokens(rt: Runtime, ir: InferenceRequest): number {
  if (ir.endpoint === 'completions') {
    let n = 0;
    // Token ids are used as given; text gets BOS, as vLLM's add_special_tokens default does.
    for (const p of ir.promptParts) n += typeof p === 'string' ? 1 + rt.tokenizer.encode(p).length : p.length;
    return n;
  }
  const messages = (ir.body.messages as { role: string }[]).map((m, i) => ({
    role: m.role,
    content: (ir.promptParts[i] as string | undefined) ?? '',
  }));
  return rt.tokenizer.countChat(messages);
}
