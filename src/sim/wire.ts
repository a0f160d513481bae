// The bytes vLLM's OpenAI server puts on the wire, as plain functions: response bodies, SSE
// chunks and the error envelope. Key order and the presence of nulls follow vLLM's pydantic
// models (chat chunks are dumped with exclude_unset, completion chunks with every field,
// usage chunks without nulls, full responses with every field).

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = errorType(status),
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

/** vLLM's `type` for a status (validation errors from FastAPI use the phrase "Bad Request"). */
export function errorType(status: number): string {
  switch (status) {
    case 400:
      return 'BadRequestError';
    case 404:
      return 'NotFoundError';
    case 405:
      return 'MethodNotAllowed';
    case 501:
      return 'NotImplementedError';
    case 503:
      return 'ServiceUnavailableError';
    default:
      return status >= 500 ? 'InternalServerError' : 'BadRequestError';
  }
}

/** `{"error":{"message","type","param","code"}}` with code = HTTP status (vLLM >= 0.10). */
export function errorBody(err: HttpError): string {
  return JSON.stringify({
    error: { message: err.message, type: err.type, param: err.param, code: err.status },
  });
}

export type Kind = 'chat' | 'completion';
export type Finish = 'stop' | 'length';

/** Everything but `choices` of a response or chunk is fixed per request: built once. */
export class ResponseFrame {
  private readonly chunkHead: string;

  constructor(
    readonly kind: Kind,
    readonly id: string,
    readonly created: number,
    readonly model: string,
  ) {
    const object = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    this.chunkHead = `{"id":${JSON.stringify(id)},"object":"${object}","created":${created},"model":${JSON.stringify(model)},`;
  }

  /** SSE event of the chat role chunk vLLM sends, for each choice, with the first output. */
  roleEvent(index = 0): string {
    return this.event(
      `"choices":[{"index":${index},"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
    );
  }

  /** SSE event carrying one token's text of choice `index`; its last one also carries the finish reason. */
  tokenEvent(text: string, finish: Finish | null, index = 0): string {
    const t = JSON.stringify(text);
    if (this.kind === 'chat') {
      const tail =
        finish === null ? '"finish_reason":null' : `"finish_reason":"${finish}","stop_reason":null`;
      return this.event(`"choices":[{"index":${index},"delta":{"content":${t}},"logprobs":null,${tail}}]}`);
    }
    const f = finish === null ? 'null' : `"${finish}"`;
    return this.event(
      `"choices":[{"index":${index},"text":${t},"logprobs":null,"finish_reason":${f},"stop_reason":null}],"usage":null}`,
    );
  }

  /** SSE event of the final usage chunk (only with stream_options.include_usage). */
  usageEvent(promptTokens: number, completionTokens: number): string {
    const usage = JSON.stringify(usageOf(promptTokens, completionTokens));
    return this.event(`"choices":[],"usage":${usage}}`);
  }

  /** The whole non-streamed response body: one choice per entry of `choices`, in order. */
  fullResponse(
    choices: readonly { text: string; finish: Finish }[],
    promptTokens: number,
    completionTokens: number,
  ): string {
    const usage = { ...usageOf(promptTokens, completionTokens), prompt_tokens_details: null };
    if (this.kind === 'chat') {
      return JSON.stringify({
        id: this.id,
        object: 'chat.completion',
        created: this.created,
        model: this.model,
        choices: choices.map(({ text, finish }, index) => ({
          index,
          message: {
            role: 'assistant',
            content: text,
            refusal: null,
            annotations: null,
            audio: null,
            function_call: null,
            tool_calls: [],
            reasoning_content: null,
          },
          logprobs: null,
          finish_reason: finish,
          stop_reason: null,
        })),
        service_tier: null,
        system_fingerprint: null,
        usage,
        prompt_logprobs: null,
        kv_transfer_params: null,
      });
    }
    return JSON.stringify({
      id: this.id,
      object: 'text_completion',
      created: this.created,
      model: this.model,
      choices: choices.map(({ text, finish }, index) => ({
        index,
        text,
        logprobs: null,
        finish_reason: finish,
        stop_reason: null,
        prompt_logprobs: null,
      })),
      service_tier: null,
      system_fingerprint: null,
      usage,
      kv_transfer_params: null,
    });
  }

  private event(rest: string): string {
    return `data: ${this.chunkHead}${rest}\n\n`;
  }
}

/** An error after the stream started: one event with the envelope (then [DONE]). */
export function errorEvent(err: HttpError): string {
  return `data: ${errorBody(err)}\n\n`;
}

export const DONE_EVENT = 'data: [DONE]\n\n';

function usageOf(promptTokens: number, completionTokens: number) {
  return {
    prompt_tokens: promptTokens,
    total_tokens: promptTokens + completionTokens,
    completion_tokens: completionTokens,
  };
}

export function modelList(model: string, maxModelLen: number, created: number, permissionId: string): string {
  return JSON.stringify({
    object: 'list',
    data: [
      {
        id: model,
        object: 'model',
        created,
        owned_by: 'vllm',
        root: model,
        parent: null,
        max_model_len: maxModelLen,
        permission: [
          {
            id: permissionId,
            object: 'model_permission',
            created,
            allow_create_engine: false,
            allow_sampling: true,
            allow_logprobs: true,
            allow_search_indices: false,
            allow_view: true,
            allow_fine_tuning: false,
            organization: '*',
            group: null,
            is_blocking: false,
          },
        ],
      },
    ],
  });
}

/** vLLM's two context-length messages (prompt alone too long; prompt + max_tokens too long). */
export function contextLengthError(maxModelLen: number, promptTokens: number, maxTokens?: number): HttpError {
  if (maxTokens === undefined) {
    return new HttpError(
      400,
      `This model's maximum context length is ${maxModelLen} tokens. However, your request has ` +
        `${promptTokens} input tokens. Please reduce the length of the input messages.`,
    );
  }
  return new HttpError(
    400,
    `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context ` +
      `length is ${maxModelLen} tokens and your request has ${promptTokens} input tokens ` +
      `(${maxTokens} > ${maxModelLen} - ${promptTokens}).`,
  );
}
