import { encode } from 'gpt-tokenizer/encoding/cl100k_base';
import { describe, expect, it } from 'vitest';
import {
  BEGIN_OF_TEXT,
  DOUBLE_NEWLINE,
  END_HEADER,
  EOT,
  START_HEADER,
  TokenizeError,
  Tokenizer,
} from '../../src/tokenizer/tokenizer.ts';

describe('Tokenizer', () => {
  it('counts like cl100k_base BPE', () => {
    const t = new Tokenizer();
    const text = 'The quick brown fox jumps over the lazy dog, twice: 42 times!';
    expect([...t.encode(text)]).toEqual(encode(text));
    expect(t.encode('Hello world').length).toBe(2);
  });

  it('applies the Llama 3 chat template with its special-token ids', () => {
    const t = new Tokenizer();
    const ids = t.encodeChat([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: '  Hi  ' },
    ]);
    const header = (role: string) => [START_HEADER, ...encode(role), END_HEADER, DOUBLE_NEWLINE];
    expect(ids).toEqual([
      BEGIN_OF_TEXT,
      ...header('system'),
      ...encode('Be brief.'),
      EOT,
      ...header('user'),
      ...encode('Hi'), // content is trimmed, as Llama 3's template does
      EOT,
      ...header('assistant'),
    ]);
    expect([START_HEADER, END_HEADER, EOT, DOUBLE_NEWLINE]).toEqual([128006, 128007, 128009, 271]);
    expect(t.encodeChat([{ role: 'user', content: 'Hi' }], false).at(-1)).toBe(EOT);
  });

  it('joins text parts with newlines and rejects other parts', () => {
    const t = new Tokenizer();
    const parts = t.encodeChat([
      {
        role: 'user',
        content: [
          { type: 'text', text: 'first' },
          { type: 'text', text: 'second' },
        ],
      },
    ]);
    expect(parts).toEqual(t.encodeChat([{ role: 'user', content: 'first\nsecond' }]));
    expect(() => t.encodeChat([{ role: 'user', content: [{ type: 'image_url' }] }])).toThrow(TokenizeError);
  });

  it('encodes special-token text inside content as plain text', () => {
    const t = new Tokenizer();
    const ids = [...t.encode('<|endoftext|>')];
    expect(ids.length).toBeGreaterThan(1);
    expect(t.decode(ids)).toBe('<|endoftext|>');
  });

  it('decodes prompts, special tokens included', () => {
    const t = new Tokenizer();
    expect(t.decode(t.encodePrompt('Hello world'))).toBe('<|begin_of_text|>Hello world');
  });

  it('caches encodings in an LRU bounded by cached tokens', () => {
    const t = new Tokenizer(20);
    const a = t.encode('one two three four five six seven eight');
    expect(a.length).toBe(8);
    expect(t.encode('one two three four five six seven eight')).toBe(a);
    const b = t.encode('alpha beta gamma delta epsilon zeta eta theta');
    expect(a.length + b.length).toBeLessThanOrEqual(20);
    t.encode('one two three four five six seven eight'); // touch: b is now least recently used
    const c = t.encode('red green blue cyan yellow black white grey');
    expect(a.length + b.length + c.length).toBeGreaterThan(20);
    expect(t.cacheStats()).toEqual({ entries: 2, tokens: a.length + c.length });
    expect(t.encode('one two three four five six seven eight')).toBe(a);
    expect(t.encode('alpha beta gamma delta epsilon zeta eta theta')).not.toBe(b);
  });
});

describe('countChat', () => {
  it('equals the length of encodeChat without building it', () => {
    const tok = new Tokenizer();
    const messages = [
      { role: 'system', content: 'You are a helpful assistant. '.repeat(20) },
      {
        role: 'user',
        content: [
          { type: 'text', text: 'first part' },
          { type: 'text', text: 'second' },
        ],
      },
      { role: 'assistant', content: null },
    ];
    expect(tok.countChat(messages)).toBe(tok.encodeChat(messages).length);
    expect(tok.countChat(messages, false)).toBe(tok.encodeChat(messages, false).length);
  });
});
