// The non-streamed body folded from a reasoning model's stream. vLLM names the reasoning channel
// `reasoning` (current releases) or `reasoning_content` (earlier ones) in both the stream's deltas
// and the non-streamed message; its parsers return no content (null) when the model wrote only
// reasoning. The assembled body must say what vLLM's own non-streamed answer says.
import { describe, expect, it } from 'vitest';
import { Assembler, assemblable, type StreamChunk } from '../../src/upstream/assemble.ts';

const head = { id: 'chatcmpl-r', object: 'chat.completion.chunk', created: 9, model: 'm' };

function chunk(delta: Record<string, unknown>, finish: string | null = null): StreamChunk {
  return {
    ...head,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish, stop_reason: null }],
  };
}

function message(chunks: StreamChunk[]): Record<string, unknown> {
  const a = new Assembler('chat');
  for (const c of chunks) a.add(c);
  const body = JSON.parse(a.body().toString()) as { choices: { message: Record<string, unknown> }[] };
  return body.choices[0]!.message;
}

/** A completion chunk of one token: `text`, its stream offset and its logprob. */
function completionChunk(
  text: string,
  offset: number,
  logprob: number,
  finish: string | null = null,
): StreamChunk {
  return {
    ...head,
    object: 'text_completion',
    choices: [
      {
        index: 0,
        text,
        logprobs: {
          text_offset: [offset],
          token_logprobs: [logprob],
          tokens: [text],
          top_logprobs: [{ [text]: logprob }],
        },
        finish_reason: finish,
        stop_reason: null,
      },
    ],
  };
}

describe('a reasoning model answered non-streamed', () => {
  it('keeps the reasoning under the name the backend streamed it with (`reasoning`)', () => {
    const m = message([
      chunk({ role: 'assistant', content: '' }),
      chunk({ reasoning: 'Think' }),
      chunk({ reasoning: 'ing.' }),
      chunk({ content: 'Yes' }, 'stop'),
    ]);
    expect(m).toEqual({
      role: 'assistant',
      content: 'Yes',
      refusal: null,
      annotations: null,
      audio: null,
      function_call: null,
      tool_calls: [],
      reasoning: 'Thinking.',
    });
    // vLLM's message model's order: the reasoning channel last.
    expect(Object.keys(m).at(-1)).toBe('reasoning');
  });

  it('and under `reasoning_content` for a backend that streams that name', () => {
    const m = message([
      chunk({ role: 'assistant', content: '' }),
      chunk({ reasoning_content: 'Hm' }),
      chunk({ content: 'No' }, 'stop'),
    ]);
    expect(m.reasoning_content).toBe('Hm');
    expect(m.content).toBe('No');
    expect('reasoning' in m).toBe(false);
  });

  it('gives no content (null) when the model wrote only reasoning, as vLLM does', () => {
    const m = message([
      chunk({ role: 'assistant', content: '' }),
      chunk({ reasoning: 'Still thinking' }, 'length'),
    ]);
    expect(m.content).toBeNull();
    expect(m.reasoning).toBe('Still thinking');
  });

  it('a model without reasoning keeps an empty content as the empty string', () => {
    const m = message([chunk({ role: 'assistant', content: '' }, 'length')]);
    expect(m.content).toBe('');
    expect(m.reasoning_content).toBeNull();
  });
});

describe('the role', () => {
  it("is the one the stream's first chunk names (vLLM's --response-role, or the last message's without a generation prompt)", () => {
    expect(message([chunk({ role: 'user', content: '' }), chunk({ content: ' there' }, 'stop')]).role).toBe(
      'user',
    );
    expect(message([chunk({ role: 'assistant', content: '' }), chunk({ content: 'x' }, 'stop')]).role).toBe(
      'assistant',
    );
  });
});

describe('several choices', () => {
  it('folds each choice by its index, lists them in order, and takes the usage of the final chunk', () => {
    const a = new Assembler('chat');
    const chunk = (
      index: number,
      delta: Record<string, unknown>,
      finish: string | null = null,
      usage?: number,
    ) => ({
      id: 'chatcmpl-1',
      created: 1,
      model: 'm',
      choices: [{ index, delta, logprobs: null, finish_reason: finish }],
      ...(usage === undefined
        ? {}
        : { usage: { prompt_tokens: 5, completion_tokens: usage, total_tokens: 5 + usage } }),
    });
    a.add(chunk(1, { role: 'assistant', content: '' }));
    a.add(chunk(0, { role: 'assistant', content: '' }));
    a.add(chunk(1, { content: 'B1' }, null, 1));
    a.add(chunk(0, { content: 'A1' }, null, 1));
    a.add(chunk(0, { content: 'A2' }, 'length', 2));
    a.add(chunk(1, { content: 'B2' }, 'stop', 2));
    a.add({
      id: 'chatcmpl-1',
      choices: [],
      usage: { prompt_tokens: 5, completion_tokens: 4, total_tokens: 9 },
    });
    const body = JSON.parse(a.body().toString());
    expect(
      body.choices.map((c: { index: number; message: { content: string }; finish_reason: string }) => [
        c.index,
        c.message.content,
        c.finish_reason,
      ]),
    ).toEqual([
      [0, 'A1A2', 'length'],
      [1, 'B1B2', 'stop'],
    ]);
    expect(body.usage.completion_tokens).toBe(4);
    expect(a.chars).toBe(8);
  });

  it('names the reasoning channel alike on every choice, as the backend streamed it', () => {
    const a = new Assembler('chat');
    a.add({ id: 'x', choices: [{ index: 0, delta: { role: 'assistant', reasoning: 'think' } }] });
    a.add({ id: 'x', choices: [{ index: 0, delta: { content: 'A' }, finish_reason: 'stop' }] });
    a.add({
      id: 'x',
      choices: [{ index: 1, delta: { role: 'assistant', content: 'B' }, finish_reason: 'stop' }],
    });
    const body = JSON.parse(a.body().toString());
    const keys = body.choices.map((c: { message: Record<string, unknown> }) =>
      Object.keys(c.message).filter((k) => k.startsWith('reasoning')),
    );
    expect(keys).toEqual([['reasoning'], ['reasoning']]);
    expect(body.choices[1].message.reasoning).toBeNull();
  });
});

describe("the backend's own fields", () => {
  it('keeps every field of the final usage, in vLLM order first, and the fingerprint a chunk carried', () => {
    const a = new Assembler('chat');
    a.add({ ...chunk({ role: 'assistant', content: '' }), system_fingerprint: 'vllm-0.11-abc' });
    a.add(chunk({ content: 'Yes' }, 'stop'));
    a.add({
      ...head,
      choices: [],
      usage: {
        completion_tokens: 1,
        prompt_tokens: 5,
        total_tokens: 6,
        completion_tokens_details: { reasoning_tokens: 0 },
      } as StreamChunk['usage'],
    });
    const body = JSON.parse(a.body().toString()) as Record<string, unknown>;
    expect(body.system_fingerprint).toBe('vllm-0.11-abc');
    expect(Object.keys(body.usage as object)).toEqual([
      'prompt_tokens',
      'total_tokens',
      'completion_tokens',
      'prompt_tokens_details',
      'completion_tokens_details',
    ]);
    expect(body.usage).toMatchObject({ completion_tokens_details: { reasoning_tokens: 0 } });
    // A stream that carried none keeps vLLM's null.
    const plain = new Assembler('completion');
    plain.add({
      ...head,
      object: 'text_completion',
      choices: [{ index: 0, text: 'x', finish_reason: 'stop' }],
    });
    expect(JSON.parse(plain.body().toString()).system_fingerprint).toBeNull();
  });
});

describe('what is not assembled', () => {
  it("chat's echo and beam search, and a prompt text asked back: passed through as sent", () => {
    for (const extra of [{ echo: true }, { use_beam_search: true, n: 2 }, { return_prompt_text: true }]) {
      expect(assemblable('chat', { model: 'm', messages: [], ...extra }), JSON.stringify(extra)).toBe(false);
    }
    expect(assemblable('chat', { model: 'm', messages: [], echo: false })).toBe(true);
  });

  it("passes through disaggregated prefill's transfer parameters, which only vLLM's non-streamed body returns", () => {
    expect(assemblable('chat', { model: 'm', messages: [] })).toBe(true);
    expect(
      assemblable('chat', { model: 'm', messages: [], kv_transfer_params: { do_remote_decode: true } }),
    ).toBe(false);
    expect(assemblable('completion', { model: 'm', prompt: 'x', kv_transfer_params: {} })).toBe(false);
    expect(assemblable('completion', { model: 'm', prompt: 'x', ec_transfer_params: {} })).toBe(false);
  });
});

describe('tool calls and logprobs, folded from their deltas', () => {
  it("a call's id, type and name come from its first delta, its arguments in pieces; calls listed by index", () => {
    const a = new Assembler('chat');
    a.add(chunk({ role: 'assistant', content: '' }));
    a.add(chunk({ content: 'Checking.' }));
    a.add(
      chunk({
        tool_calls: [
          { index: 0, id: 'chatcmpl-tool-a', type: 'function', function: { name: 'weather', arguments: '' } },
        ],
      }),
    );
    a.add(chunk({ tool_calls: [{ index: 0, function: { arguments: '{"city": ' } }] }));
    // A second call whose first delta comes before the first call's last piece.
    a.add(
      chunk({
        tool_calls: [
          { index: 1, id: 'chatcmpl-tool-b', type: 'function', function: { name: 'time', arguments: '{}' } },
        ],
      }),
    );
    a.add(chunk({ tool_calls: [{ index: 0, function: { arguments: '"Oslo"}' } }] }, 'tool_calls'));
    const body = JSON.parse(a.body().toString());
    expect(body.choices[0].finish_reason).toBe('tool_calls');
    expect(body.choices[0].message).toMatchObject({
      content: 'Checking.',
      tool_calls: [
        {
          id: 'chatcmpl-tool-a',
          type: 'function',
          function: { name: 'weather', arguments: '{"city": "Oslo"}' },
        },
        { id: 'chatcmpl-tool-b', type: 'function', function: { name: 'time', arguments: '{}' } },
      ],
    });
    // vLLM's ToolCall: id, type, function (name, arguments), in that order.
    expect(Object.keys(body.choices[0].message.tool_calls[0])).toEqual(['id', 'type', 'function']);
    expect(a.chars).toBe('Checking.'.length + 'weather'.length + 16 + 'time'.length + 2);
  });

  it('calls alone leave content null, as vLLM and OpenAI write it; a call whose stream named no id gets one', () => {
    const a = new Assembler('chat');
    a.add(chunk({ role: 'assistant', content: '' }));
    a.add(chunk({ tool_calls: [{ index: 0, function: { name: 'f', arguments: '{"x":1}' } }] }, 'tool_calls'));
    const message = JSON.parse(a.body().toString()).choices[0].message;
    expect(message.content).toBeNull();
    expect(message.tool_calls).toHaveLength(1);
    expect(message.tool_calls[0].id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    expect(message.tool_calls[0]).toMatchObject({
      type: 'function',
      function: { name: 'f', arguments: '{"x":1}' },
    });
    // Without calls the message keeps vLLM's empty list.
    expect(message.function_call).toBeNull();
    const plain = new Assembler('chat');
    plain.add(chunk({ role: 'assistant', content: '' }));
    plain.add(chunk({ content: 'hi' }, 'stop'));
    expect(JSON.parse(plain.body().toString()).choices[0].message.tool_calls).toEqual([]);
  });

  it("a chat's logprobs are not folded (such a request passes through): the body keeps vLLM's null", () => {
    const a = new Assembler('chat');
    a.add(chunk({ role: 'assistant', content: '' }));
    a.add({
      ...head,
      choices: [
        {
          index: 0,
          delta: { content: 'Hi' },
          logprobs: { content: [{ token: 'Hi', logprob: -0.1 }] },
          finish_reason: 'stop',
        },
      ],
    });
    expect(JSON.parse(a.body().toString()).choices[0].logprobs).toBeNull();
    expect(assemblable('chat', { model: 'm', messages: [], logprobs: true })).toBe(false);
    expect(assemblable('chat', { model: 'm', messages: [], top_logprobs: 2 })).toBe(false);
  });

  it('tools with several sequences pass through; with one, or n: 1, they are assembled', () => {
    const tools = [{ type: 'function', function: { name: 'f' } }];
    expect(assemblable('chat', { model: 'm', messages: [], tools, n: 3 })).toBe(false);
    expect(assemblable('chat', { model: 'm', messages: [], tools, n: 1 })).toBe(true);
    expect(assemblable('chat', { model: 'm', messages: [], tools })).toBe(true);
    expect(assemblable('chat', { model: 'm', messages: [], n: 3 })).toBe(true);
  });

  it("completions: the four lists of each chunk joined, in vLLM's order", () => {
    const cmpl = completionChunk;
    const a = new Assembler('completion');
    a.add(cmpl(' once', 0, -1));
    a.add(cmpl(' upon', 5, -2, 'length'));
    // What the lists add to the body counts against its bound, with the text.
    const listChars = (text: string, offset: number, lp: number) =>
      JSON.stringify([offset]).length +
      JSON.stringify([lp]).length +
      JSON.stringify([text]).length +
      JSON.stringify([{ [text]: lp }]).length;
    expect(a.chars).toBe(' once upon'.length + listChars(' once', 0, -1) + listChars(' upon', 5, -2));
    const choice = JSON.parse(a.body().toString()).choices[0];
    expect(choice.text).toBe(' once upon');
    expect(choice.logprobs).toEqual({
      text_offset: [0, 5],
      token_logprobs: [-1, -2],
      tokens: [' once', ' upon'],
      top_logprobs: [{ ' once': -1 }, { ' upon': -2 }],
    });
    expect(Object.keys(choice.logprobs)).toEqual(['text_offset', 'token_logprobs', 'tokens', 'top_logprobs']);
  });

  it("completions: the text offsets chain each token's own length, as vLLM's body does, not the streamed text's", () => {
    // "🙂!" as three byte-level tokens: the emoji's two halves each read "�" alone, and the first
    // adds no text to the stream. Streamed offsets 0, 0, 1 (the stream's text so far: "", "🙂"
    // is two UTF-16 units but one code point to Python); the body's 0, 1, 2.
    const a = new Assembler('completion');
    // One token a chunk, its logprob -1, the token's text not always the chunk's.
    const chunk = (
      text: string,
      token: string,
      offset: number,
      finish: string | null = null,
    ): StreamChunk => {
      const c = completionChunk(text, offset, -1, finish);
      const choice = (c.choices as { logprobs: { tokens: string[]; top_logprobs: unknown[] } }[])[0]!;
      choice.logprobs.tokens = [token];
      choice.logprobs.top_logprobs = [null];
      return c;
    };
    a.add(chunk('', '\ufffd', 0));
    a.add(chunk('🙂', '\ufffd', 0));
    a.add(chunk('!', '!', 1, 'length'));
    const choice = JSON.parse(a.body().toString()).choices[0];
    expect(choice.text).toBe('🙂!');
    expect(choice.logprobs.text_offset).toEqual([0, 1, 2]);
  });

  it('skips a choice that is no object, as the relay does for a stream', () => {
    const a = new Assembler('completion');
    a.add({ ...head, object: 'text_completion', choices: [null] } as unknown as StreamChunk);
    a.add({
      ...head,
      object: 'text_completion',
      choices: [{ index: 0, text: 'ok', logprobs: null, finish_reason: 'stop', stop_reason: null }],
    });
    expect(JSON.parse(a.body().toString()).choices[0].text).toBe('ok');
  });
});
