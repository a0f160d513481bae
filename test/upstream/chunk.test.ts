// The relay's byte-level reading of a chunk agrees with its JSON reading: whatever isPlainOutput
// accepts, the parse would also find to be a chunk with choices carrying output, without usage or
// an error; and vLLM's ordinary token chunks are accepted (else the hot path never runs).
import { describe, expect, it } from 'vitest';
import { carriesOutput, isErrorPayload, isPlainOutput, OutputShape } from '../../src/upstream/chunk.ts';

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

describe('OutputShape', () => {
  const token = (text: string) => `{${head},"choices":[${choice(`{"content":"${text}"}`)}]}`;

  it('accepts the token chunks that follow the first, and every answer agrees with the parse', () => {
    const shape = new OutputShape();
    for (const text of [' The', ' word', '.', 'x', ' \\"quoted\\"', ' \\n', ' usage', 'error']) {
      const data = token(text);
      expect(parsedPlainOutput(data)).toBe(true);
      expect(shape.test(Buffer.from(data))).toBe(true);
    }
  });

  it('leaves to isPlainOutput what does not have the shape it learned', () => {
    const shape = new OutputShape();
    expect(shape.test(Buffer.from(token(' first')))).toBe(true);
    for (const [name, data] of Object.entries(refused)) {
      expect(shape.test(Buffer.from(data)), name).toBe(false);
    }
    // The same stream's role chunk: its shape, with an empty string.
    expect(shape.test(Buffer.from(token('')))).toBe(false);
    // The same start, a long text, and a shorter end that carries an error: the bytes after the
    // text differ, whatever lies where the learned end would be.
    const withError = `{${head},"choices":[{"index":0,"delta":{"content":"${'x'.repeat(80)}"}}],"error":1}`;
    expect(shape.test(Buffer.from(withError))).toBe(false);
  });

  it('accepts what isPlainOutput accepts, and beyond it only chunks the parse finds plain', () => {
    // Bytes spliced raw into the learned shape, unescaped: quotes, backslashes and braces that
    // change the structure or break the JSON. isPlainOutput accepts some broken JSON (an
    // unescaped quote inside the text): the shape may agree with it there, never go further.
    const alphabet = ['a', ' ', '"', '\\', '{', '}', ':', ',', 'usage', 'error', 'null', '"usage":null'];
    let seed = 7;
    const next = () => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed >>> 16; // the low bits of this generator repeat with a short period
    };
    const shape = new OutputShape();
    expect(shape.test(Buffer.from(token(' first')))).toBe(true);
    let accepted = 0;
    for (let i = 0; i < 5000; i++) {
      let text = '';
      const n = next() % 6;
      for (let k = 0; k < n; k++) text += alphabet[next() % alphabet.length];
      const data = Buffer.from(token(text));
      const bytes = isPlainOutput(data);
      const yes = shape.test(data);
      if (bytes) expect(yes, token(text)).toBe(true);
      if (!yes || bytes) continue;
      accepted++;
      let plain = false;
      try {
        plain = parsedPlainOutput(token(text));
      } catch {}
      expect(plain, token(text)).toBe(true);
    }
    // Texts such as `usage` or `error`, which isPlainOutput leaves to the parse.
    expect(accepted).toBeGreaterThan(10);
  });
});

describe('carriesOutput', () => {
  it("counts a reasoning model's reasoning as output under either of vLLM's names", () => {
    for (const name of ['reasoning', 'reasoning_content']) {
      const msg = JSON.parse(`{${head},"choices":[${choice(`{"${name}":" step"}`)}]}`);
      expect(carriesOutput(msg.choices), name).toBe(true);
      const empty = JSON.parse(`{${head},"choices":[${choice(`{"${name}":""}`)}]}`);
      expect(carriesOutput(empty.choices), `${name} empty`).toBe(false);
    }
  });
});
