// The relay's byte-level reading of a chunk agrees with its JSON reading: whatever isPlainOutput
// accepts, the parse would also find to be a chunk with choices carrying output, without usage or
// an error; and vLLM's ordinary token chunks are accepted (else the hot path never runs).
import { describe, expect, it } from 'vitest';
import { carriesOutput, isErrorPayload, isPlainOutput } from '../../src/upstream/chunk.ts';

const head = '"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m"';
const choice = (delta: string, finish = 'null') =>
  `{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${finish}}`;

const accepted: Record<string, string> = {
  'a chat token chunk': `{${head},"choices":[${choice('{"content":" word"}')}]}`,
  'the last token with its finish reason': `{${head},"choices":[${choice('{"content":"."}', '"stop"')}],"stop_reason":null}`,
  'a completions text chunk': `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}]}`,
  "vLLM's completions token chunk (usage null)": `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
  'content quoting the keys the bytes look for': `{${head},"choices":[${choice('{"content":"say \\"usage\\": and \\"error\\""}')}]}`,
  'content that is one escaped quote': `{${head},"choices":[${choice('{"content":"\\""}')}]}`,
  'two choices': `{${head},"choices":[${choice('{"content":"a"}')},{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":null}]}`,
};

const refused: Record<string, string> = {
  'the role chunk (empty content)': `{${head},"choices":[${choice('{"role":"assistant","content":""}')}]}`,
  'an empty delta': `{${head},"choices":[${choice('{}', '"stop"')}]}`,
  'the usage chunk': `{${head},"choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`,
  'continuous usage on a token chunk': `{${head},"choices":[${choice('{"content":"x"}')}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}`,
  'a null usage and a real one': `{${head},"choices":[${choice('{"content":"x"}')}],"usage":null,"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}`,
  'an in-band error': '{"error":{"message":"boom","type":"internal_error","code":500}}',
  'the flat error of older versions': '{"object":"error","message":"boom","type":"InternalError","code":500}',
  'a tool call without content': `{${head},"choices":[${choice('{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":1}"}}]}')}]}`,
  'spaced JSON': `{"choices": [{"index": 0, "delta": {"content": "x"}}]}`,
  'not an object': '"content"',
  'a truncated object': `{${head},"choices":[${choice('{"content":"x"}')}]`,
};

/** The relay's full reading: what the bytes must agree with. */
function parsedPlainOutput(data: string): boolean {
  const msg = JSON.parse(data);
  if (isErrorPayload(msg) || msg?.usage != null) return false;
  return Array.isArray(msg?.choices) && msg.choices.length > 0 && carriesOutput(msg.choices);
}

describe('isPlainOutput', () => {
  for (const [name, data] of Object.entries(accepted)) {
    it(`accepts ${name}, as the parse does`, () => {
      expect(parsedPlainOutput(data)).toBe(true);
      expect(isPlainOutput(Buffer.from(data))).toBe(true);
    });
  }
  for (const [name, data] of Object.entries(refused)) {
    it(`leaves ${name} to the parse`, () => {
      expect(isPlainOutput(Buffer.from(data))).toBe(false);
    });
  }
});
