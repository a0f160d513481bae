// The canonical prompt (src/prompt): the same prefix gives the same leading block hashes, and the
// token estimate learns its ratio from what the backend counts.
import { encode } from 'gpt-tokenizer/encoding/cl100k_base';
import { describe, expect, it } from 'vitest';
import { syntheticText } from '../../src/bench/text.ts';
import {
  BLOCK_CHARS_PER_TOKEN,
  cacheRoot,
  MEDIA_PART_TOKENS,
  type PromptSource,
  promptBlocks,
  promptFloors,
  renderingKey,
  TokenEstimate,
  tokenFloor,
} from '../../src/prompt/canonical.ts';
import { blockHashes, TextBlocks } from '../../src/prompt/chain-hash.ts';
import { Rng } from '../../src/sim/rng.ts';
import { Tokenizer } from '../../src/tokenizer/tokenizer.ts';

const BLOCK = 16;
const CHARS = BLOCK * BLOCK_CHARS_PER_TOKEN;
const chat = (messages: unknown[], tools?: unknown): PromptSource => ({ kind: 'chat', messages, tools });
const common = (a: readonly number[], b: readonly number[]) => {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
};

describe('promptBlocks', () => {
  const system = { role: 'system', content: 'You are a careful assistant for ACME. '.repeat(60) };

  it('fields that change how vLLM renders or tokenizes the prompt start another chain; their defaults do not', () => {
    const messages = [system, { role: 'user', content: 'What is the refund policy?' }];
    const hashesOf = (kind: 'chat' | 'completion', body: Record<string, unknown>) =>
      promptBlocks(
        kind === 'chat' ? chat(messages) : { kind: 'text', texts: [String(system.content)] },
        BLOCK,
        cacheRoot('m', undefined, null, renderingKey(kind, body)),
      ).hashes;
    const plain = hashesOf('chat', {});
    expect(hashesOf('chat', { chat_template_kwargs: { date_string: '26 Jul 2024' } })[0]).not.toBe(plain[0]);
    expect(hashesOf('chat', { reasoning_effort: 'high' })[0]).not.toBe(plain[0]);
    expect(hashesOf('chat', { add_generation_prompt: false })[0]).not.toBe(plain[0]);
    expect(hashesOf('chat', { add_generation_prompt: true, continue_final_message: false })).toEqual(plain);
    const completion = hashesOf('completion', {});
    expect(hashesOf('completion', { add_special_tokens: false })[0]).not.toBe(completion[0]);
    expect(hashesOf('completion', { add_special_tokens: true })).toEqual(completion);
  });

  it('no field a client writes stands for another: a completion for a chat, a role for two messages, a salt for a rendering', () => {
    const P = String(system.content);
    const asChat = promptBlocks(chat([system]), BLOCK, cacheRoot('m', undefined, null, null, 'chat')).hashes;
    expect(asChat.length).toBeGreaterThan(4);
    // A completion whose text spells the chat's rendering, markers and all, in either form.
    for (const forged of [
      `system\n\u0000t${P.length}\u0000${P}`,
      `\u0000o6\u0000system\n\u0000t${P.length}\u0000${P}`,
    ]) {
      const text = promptBlocks(
        { kind: 'text', texts: [forged] },
        BLOCK,
        cacheRoot('m', undefined, null, null, 'completion'),
      ).hashes;
      expect(common(asChat, text)).toBe(0);
    }
    // A role that spells a message boundary and a second message.
    const two = [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: P },
    ];
    const one = [{ role: `user\n\u0000t2\u0000hi\n\nassistant`, content: P }];
    const root = cacheRoot('m', undefined);
    expect(
      common(promptBlocks(chat(two), BLOCK, root).hashes, promptBlocks(chat(one), BLOCK, root).hashes),
    ).toBe(0);
    // A salt that is another request's rendering key.
    const rendering = renderingKey('chat', { reasoning_effort: 'high' })!;
    expect(cacheRoot('m', rendering)).not.toBe(cacheRoot('m', undefined, null, rendering));
  });

  it('the same text under another model (a LoRA adapter) or cache_salt is another chain, as in vLLM', () => {
    const prompt = chat([system, { role: 'user', content: 'What is the refund policy?' }]);
    const base = promptBlocks(prompt, BLOCK, cacheRoot('llama', undefined));
    const again = promptBlocks(prompt, BLOCK, cacheRoot('llama', undefined));
    const adapter = promptBlocks(prompt, BLOCK, cacheRoot('sql-lora', undefined));
    const salted = promptBlocks(prompt, BLOCK, cacheRoot('llama', 'tenant-7'));
    expect(again.hashes).toEqual(base.hashes);
    expect(base.hashes.length).toBeGreaterThan(30);
    expect(common(base.hashes, adapter.hashes)).toBe(0);
    expect(common(base.hashes, salted.hashes)).toBe(0);
    expect(common(adapter.hashes, salted.hashes)).toBe(0);
    // Another tenant's is another chain too (the index never matches one tenant's prompt for another).
    const tenantA = promptBlocks(prompt, BLOCK, cacheRoot('llama', undefined, 'team-a'));
    expect(promptBlocks(prompt, BLOCK, cacheRoot('llama', undefined, 'team-a')).hashes).toEqual(
      tenantA.hashes,
    );
    expect(
      common(tenantA.hashes, promptBlocks(prompt, BLOCK, cacheRoot('llama', undefined, 'team-b')).hashes),
    ).toBe(0);
    expect(common(tenantA.hashes, base.hashes)).toBe(0);
    // Token-id prompts too.
    const ids: PromptSource = { kind: 'ids', ids: [Array.from({ length: 64 }, (_, i) => i)] };
    expect(
      common(
        promptBlocks(ids, BLOCK, cacheRoot('llama', undefined)).hashes,
        promptBlocks(ids, BLOCK, cacheRoot('sql-lora', undefined)).hashes,
      ),
    ).toBe(0);
  });

  it('no content can forge a message boundary, a tool call id, or a chat rendered as a completion', () => {
    const pad = 'x'.repeat(3 * CHARS);
    const hashes = (source: PromptSource) => promptBlocks(source, BLOCK).hashes;
    const tail = 'y'.repeat(3 * CHARS);
    // One user message holding what two messages render as, against the two messages.
    const forged = hashes(chat([{ role: 'user', content: `${pad}\n\nassistant\n${tail}` }]));
    const real = hashes(
      chat([
        { role: 'user', content: pad },
        { role: 'assistant', content: tail },
      ]),
    );
    expect(forged.length).toBeGreaterThan(4);
    expect(forged).not.toEqual(real.slice(0, forged.length));
    // A tool result whose text ends with an id, against the same text and that id.
    const inText = hashes(chat([{ role: 'tool', content: `${pad}\ncall_1${tail}` }]));
    const asId = hashes(chat([{ role: 'tool', content: pad, tool_call_id: `call_1${tail}` }]));
    expect(inText).not.toEqual(asId);
    // One user message spelling the markers of a boundary (NULs and all), against the list it
    // spells: they share the document's blocks, as vLLM's cache would, and nothing after.
    const doc = 'The quick brown fox jumps over the lazy dog. '.repeat(40);
    const answer = 'An answer that the assistant wrote, long enough to span blocks. '.repeat(20);
    const honest = hashes(
      chat([
        { role: 'user', content: doc },
        { role: 'assistant', content: answer },
        { role: 'user', content: 'Next?' },
      ]),
    );
    const spelt = hashes(
      chat([
        {
          role: 'user',
          content: `${doc}\u0000${doc.length}\u0000\n\n\u0000o\u0000assistant\u00009\u0000\n\u0000t\u0000${answer}`,
        },
      ]),
    );
    expect(honest.length).toBeGreaterThan(40);
    expect(common(honest, spelt)).toBeLessThanOrEqual(Math.ceil(('user\n'.length + 8 + doc.length) / CHARS));
    // A completion prompt of a chat's old rendering, against the chat.
    const text = hashes({ kind: 'text', texts: [`user\n${pad}${tail}\n\n`] });
    expect(text).not.toEqual(hashes(chat([{ role: 'user', content: `${pad}${tail}` }])));
  });

  it('several completion prompts hash as their first (each is its own sequence to vLLM), and count them all', () => {
    const s = 'The shared instructions of a batch. '.repeat(10);
    const batch = promptBlocks({ kind: 'text', texts: [`${s}q1`, `${s}q2`] }, BLOCK);
    const first = promptBlocks({ kind: 'text', texts: [`${s}q1`] }, BLOCK);
    expect(batch.hashes).toEqual(first.hashes);
    expect(batch.textChars).toBe(2 * (s.length + 2));
    // No joined text that vLLM never computed: ["ab", "c"] is not ["a", "bc"].
    const ab = promptBlocks({ kind: 'text', texts: ['x'.repeat(CHARS), 'y'.repeat(CHARS)] }, BLOCK);
    expect(ab.hashes).toHaveLength(1);
  });

  it('a shared system prompt followed by different questions maps to the same leading blocks', () => {
    const a = promptBlocks(chat([system, { role: 'user', content: 'What is the refund policy?' }]), BLOCK);
    const b = promptBlocks(chat([system, { role: 'user', content: 'How do I reset my password?' }]), BLOCK);
    const systemBlocks = Math.floor(('system\n'.length + system.content.length) / CHARS);
    expect(systemBlocks).toBeGreaterThan(30);
    expect(common(a.hashes, b.hashes)).toBeGreaterThanOrEqual(systemBlocks);
    expect(common(a.hashes, b.hashes)).toBeLessThan(Math.min(a.hashes.length, b.hashes.length) + 1);
    // A different system prompt shares nothing from its first block on.
    const c = promptBlocks(
      chat([
        { ...system, content: `X${system.content}` },
        { role: 'user', content: 'hi' },
      ]),
      BLOCK,
    );
    expect(common(a.hashes, c.hashes)).toBe(0);
  });

  it('a long opening shared inside one message (a document, then different questions) maps to the same leading blocks', () => {
    const doc = syntheticText(new Rng(7), 18_000);
    const ask = (q: string, asParts = false) =>
      promptBlocks(
        chat([
          {
            role: 'user',
            content: asParts
              ? [
                  { type: 'text', text: doc },
                  { type: 'text', text: q },
                ]
              : `${doc}\n\n${q}`,
          },
        ]),
        BLOCK,
      ).hashes;
    const docBlocks = Math.floor(('user\n'.length + doc.length) / CHARS);
    expect(docBlocks).toBeGreaterThan(60);
    expect(
      common(ask('Question: what jumps?'), ask('Question: who wrote this, and when?')),
    ).toBeGreaterThanOrEqual(docBlocks);
    // As text parts too (vLLM joins them with a newline).
    expect(common(ask('What jumps?', true), ask('Who wrote it?', true))).toBeGreaterThanOrEqual(docBlocks);
    // A different document shares nothing from its first block on.
    const other = promptBlocks(
      chat([{ role: 'user', content: `X${doc}\n\nQuestion: what jumps?` }]),
      BLOCK,
    ).hashes;
    expect(common(other, ask('Question: what jumps?'))).toBe(0);
  });

  it('a conversation continued over several turns keeps the hashes of its earlier turns', () => {
    const turns: unknown[] = [system];
    let previous = promptBlocks(chat(turns), BLOCK);
    for (let t = 0; t < 5; t++) {
      turns.push({ role: 'user', content: `question ${t} `.repeat(20) });
      const now = promptBlocks(chat(turns), BLOCK);
      // Every full block of the previous turn's prompt is a prefix of this one's.
      expect(now.hashes.slice(0, previous.hashes.length)).toEqual(previous.hashes);
      expect(now.hashes.length).toBeGreaterThan(previous.hashes.length);
      turns.push({ role: 'assistant', content: `answer ${t} `.repeat(30) });
      previous = promptBlocks(chat(turns), BLOCK);
    }
  });

  it('tool definitions follow the system prompt, as chat templates render them', () => {
    const sys = (text: string) => ({ role: 'system', content: text.repeat(CHARS) });
    const user = { role: 'user', content: 'what now?' };
    const toolsA = [{ type: 'function', function: { name: 'search', parameters: { q: 'string' } } }];
    const toolsB = [{ type: 'function', function: { name: 'calc', parameters: { x: 'number' } } }];
    // One system prompt (a few blocks long) with two tool lists: its blocks are shared.
    const a = promptBlocks(chat([sys('policy '), user], toolsA), BLOCK);
    const b = promptBlocks(chat([sys('policy '), user], toolsB), BLOCK);
    const sysBlocks = Math.floor(('system\n'.length + 'policy '.length * CHARS) / CHARS);
    expect(sysBlocks).toBeGreaterThanOrEqual(5);
    expect(b.hashes.slice(0, sysBlocks)).toEqual(a.hashes.slice(0, sysBlocks));
    expect(b.hashes).not.toEqual(a.hashes);
    // Two system prompts with one tool list: nothing shared from the first block.
    const c = promptBlocks(chat([sys('charter '), user], toolsA), BLOCK);
    expect(c.hashes[0]).not.toBe(a.hashes[0]);
    // Without a system message the tools come first, and still name the prompt.
    const bare = promptBlocks(chat([user], toolsA), BLOCK);
    expect(bare.hashes[0]).not.toBe(promptBlocks(chat([user], toolsB), BLOCK).hashes[0]);
  });

  it('a prompt with tools shares no block with the same prompt without them (Llama 3.x changes the system header)', () => {
    const sys = { role: 'system', content: 'policy '.repeat(CHARS) };
    const user = { role: 'user', content: 'what now?' };
    const tools = [{ type: 'function', function: { name: 'search', parameters: { q: 'string' } } }];
    const withTools = promptBlocks(chat([sys, user], tools), BLOCK);
    const without = promptBlocks(chat([sys, user]), BLOCK);
    expect(without.hashes.length).toBeGreaterThanOrEqual(5);
    expect(withTools.hashes[0]).not.toBe(without.hashes[0]);
    // `tools: null` is no tools.
    expect(promptBlocks(chat([sys, user], null), BLOCK).hashes).toEqual(without.hashes);
  });

  it('text parts hash as the same text sent as one string (vLLM joins them with a newline)', () => {
    const one = 'a'.repeat(CHARS * 2 + 5);
    const two = 'b'.repeat(CHARS * 3 + 7);
    const asString = promptBlocks(chat([{ role: 'user', content: `${one}\n${two}` }]), BLOCK);
    const asParts = promptBlocks(
      chat([
        {
          role: 'user',
          content: [
            { type: 'text', text: one },
            { type: 'text', text: two },
          ],
        },
      ]),
      BLOCK,
    );
    expect(asParts.hashes).toEqual(asString.hashes);
    expect(asParts.textChars).toBe(asString.textChars);
    // An image between them is no newline: another prompt.
    const withImage = promptBlocks(
      chat([
        {
          role: 'user',
          content: [
            { type: 'text', text: one },
            { type: 'image_url', image_url: { url: 'http://x/1.png' } },
            { type: 'text', text: two },
          ],
        },
      ]),
      BLOCK,
    );
    // The blocks before the image are shared (as vLLM's are: its tokens match up to the image's
    // placeholder); from the block that holds it on, none is.
    const shared = common(withImage.hashes, asString.hashes);
    expect(shared).toBeGreaterThanOrEqual(2);
    expect(shared).toBeLessThan(Math.floor(('user\n'.length + one.length) / CHARS) + 1);
    expect(withImage.mediaParts).toBe(1);
  });

  it('role, name, tools, tool calls and images are part of the prompt', () => {
    const base = promptBlocks(chat([{ role: 'user', content: 'a'.repeat(CHARS * 3) }]), BLOCK);
    const variants = [
      chat([{ role: 'system', content: 'a'.repeat(CHARS * 3) }]),
      chat([{ role: 'user', name: 'bob', content: 'a'.repeat(CHARS * 3) }]),
      chat(
        [{ role: 'user', content: 'a'.repeat(CHARS * 3) }],
        [{ type: 'function', function: { name: 'f' } }],
      ),
    ];
    for (const v of variants) expect(promptBlocks(v, BLOCK).hashes[0]).not.toBe(base.hashes[0]);
    const img = (url: string) =>
      chat([
        {
          role: 'user',
          content: [
            { type: 'image_url', image_url: { url } },
            { type: 'text', text: 'a'.repeat(CHARS * 3) },
          ],
        },
      ]);
    const i1 = promptBlocks(img('http://x/1.png'), BLOCK);
    const i2 = promptBlocks(img('http://x/2.png'), BLOCK);
    expect(common(i1.hashes, i2.hashes)).toBeLessThanOrEqual(1);
    expect(i1.hashes.at(-1)).not.toBe(i2.hashes.at(-1));
    // The image's JSON names the prompt but is not counted as text tokens.
    expect(i1.textChars).toBe('user\n'.length + 1 + CHARS * 3 + 2);
  });

  it('text prompts hash their characters wherever they were split; id prompts hash ids as the simulator does', () => {
    // Long pieces are copied into the scratch array whole, short ones with charCodeAt: the same units.
    // Non-Latin-1 and astral characters; longer than the first scratch array; after a longer text.
    const text = 'lorem ipsum dolor sit amet é€𝄞 '.repeat(200);
    new TextBlocks(CHARS).add('z'.repeat(20_000));
    const whole = new TextBlocks(CHARS);
    whole.add(text);
    const pieces = new TextBlocks(CHARS);
    for (let i = 0; i < text.length; i += 7) pieces.add(text.slice(i, i + 7));
    expect(pieces.hashes).toEqual(whole.hashes);
    // Pieces of every length, long ones (copied whole) after an odd total (a unit carried over).
    const rng = new Rng(3);
    const mixed = new TextBlocks(CHARS);
    for (let i = 0; i < text.length; ) {
      const len = rng.int(1, 120);
      mixed.add(text.slice(i, i + len));
      i += len;
    }
    expect(mixed.hashes).toEqual(whole.hashes);
    expect(mixed.chars).toBe(text.length);
    expect(whole.hashes.length).toBe(Math.floor(text.length / CHARS));
    expect(promptBlocks({ kind: 'text', texts: [text] }, BLOCK).hashes).toEqual(whole.hashes);
    const ids = Array.from({ length: 100 }, (_, i) => i * 7);
    const p = promptBlocks({ kind: 'ids', ids: [ids] }, BLOCK);
    expect(p.hashes).toEqual(blockHashes(ids, BLOCK));
    expect(p.exactTokens).toBe(100);
  });

  it('texts that differ in one bit, or in the same bit of two units, never share a block hash', () => {
    const hashOf = (units: number[]) => {
      const b = new TextBlocks(CHARS);
      b.add(String.fromCharCode(...units));
      return b.hashes[0];
    };
    const rng = new Rng(11);
    const seen = new Set<number>();
    for (let trial = 0; trial < 300; trial++) {
      // Latin text and CJK (whose units have the top bit set), each unit flipped in one bit, and
      // two units flipped in the same bit (a difference a plain multiply-xor lane cancels).
      const base = Array.from({ length: CHARS }, () =>
        trial % 2 === 0 ? rng.int(0x61, 0x7a) : rng.int(0x8000, 0x9fff),
      );
      const bit = 1 << rng.int(0, 15);
      const i = rng.int(0, CHARS - 1);
      const j = (i + 2 * rng.int(1, CHARS / 2 - 1)) % CHARS;
      const one = [...base];
      one[i]! ^= bit;
      const two = [...one];
      two[j]! ^= bit;
      const hashes = [hashOf(base), hashOf(one), hashOf(two)];
      expect(new Set(hashes).size, `trial ${trial}`).toBe(3);
      for (const h of hashes) seen.add(h!);
    }
    // The case that broke an unmixed word lane: bit 15 of units 1 and 3.
    const x = Array.from({ length: CHARS }, () => 0x78);
    const y = [...x];
    y[1] = 0x78 ^ 0x8000;
    y[3] = 0x78 ^ 0x8000;
    expect(hashOf(y)).not.toBe(hashOf(x));
  });
});

describe('TokenEstimate', () => {
  it('learns the ratio from what the backend counts and then estimates within a few percent', () => {
    const tok = new Tokenizer();
    const r = new Rng(11);
    const est = new TokenEstimate();
    const prompts = Array.from({ length: 60 }, () => [
      { role: 'system', content: syntheticText(r, r.int(300, 600)) },
      { role: 'user', content: syntheticText(r, r.int(20, 220)) },
    ]);
    const truth = (m: { role: string; content: string }[]) => tok.countChat(m);
    for (const m of prompts.slice(0, 40)) est.learn(promptBlocks(chat(m), BLOCK), truth(m));
    expect(est.samples).toBe(40);
    const errors = prompts.slice(40).map((m) => {
      const p = promptBlocks(chat(m), BLOCK);
      return Math.abs(est.tokens(p) - truth(m)) / truth(m);
    });
    expect(Math.max(...errors)).toBeLessThan(0.05);
  });

  it('uses exact counts for token ids, and ignores short prompts and nonsense when learning', () => {
    const est = new TokenEstimate();
    const ids = promptBlocks(
      {
        kind: 'ids',
        ids: [
          [1, 2, 3],
          [4, 5],
        ],
      },
      BLOCK,
    );
    expect(est.tokens(ids)).toBe(5);
    est.learn(promptBlocks(chat([{ role: 'user', content: 'hi' }]), BLOCK), 9);
    est.learn(promptBlocks(chat([{ role: 'user', content: 'x'.repeat(1000) }]), BLOCK), 1);
    expect(est.samples).toBe(0);
    expect(est.charsPerToken).toBe(BLOCK_CHARS_PER_TOKEN);
  });

  it('learns an image’s tokens from what its text does not account for, never the character ratio', () => {
    const est = new TokenEstimate();
    const withImage = promptBlocks(
      chat([
        {
          role: 'user',
          content: [
            { type: 'text', text: 'describe this picture in detail, please. '.repeat(20) },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } },
          ],
        },
      ]),
      BLOCK,
    );
    expect(withImage.mediaParts).toBe(1);
    // Before any count, the image is taken for 576 tokens: 828 characters / 4 + 7 of template + 576.
    expect(withImage.textChars).toBe(828);
    expect(est.tokens(withImage)).toBe(207 + 7 + 576);
    // 820 characters and a 576-token image: 781 tokens would teach about 1 character per token.
    est.learn(withImage, 781);
    expect(est.samples).toBe(0);
    expect(est.charsPerToken).toBe(BLOCK_CHARS_PER_TOKEN);
    // What the text does not account for is the image's: 781 − 207 − 7 = 567 tokens.
    expect(est.mediaSamples).toBe(1);
    expect(est.mediaTokens).toBeCloseTo(567, 9);
    expect(est.tokens(withImage)).toBe(781);
  });

  it('parts vLLM reads as text are text; only the first 16 images get their filler', () => {
    const est = new TokenEstimate();
    const texts = promptBlocks(
      chat([
        {
          role: 'assistant',
          content: [
            { type: 'input_text', text: 'hello there' },
            { type: 'output_text', text: 'general kenobi' },
            { type: 'refusal', refusal: 'no' },
          ],
        },
      ]),
      BLOCK,
    );
    expect(texts.mediaParts).toBe(0);
    expect(texts.textChars).toBe('assistant\n'.length + 11 + 1 + 14 + 1 + 2 + 2);
    expect(est.tokens(texts)).toBeLessThan(20);
    const images = (k: number) =>
      promptBlocks(
        chat([
          {
            role: 'user',
            content: Array.from({ length: k }, (_, i) => ({
              type: 'image_url',
              image_url: { url: `http://x/${i}` },
            })),
          },
        ]),
        BLOCK,
      );
    const filler = (MEDIA_PART_TOKENS * BLOCK_CHARS_PER_TOKEN) / CHARS;
    // Thousands of tiny image parts cost 16 fillers' worth of blocks, plus their own short JSON.
    const many = images(2_000);
    expect(many.mediaParts).toBe(2_000);
    // (With a filler each, 2,000 × 36 blocks.)
    expect(many.hashes.length).toBeLessThan(16 * filler + (2_000 * 80) / CHARS);
    expect(images(16).hashes.length).toBeGreaterThanOrEqual(16 * filler);
  });

  it('plain strings among the parts, thinking parts and an assistant turn’s reasoning are text vLLM prefills', () => {
    const doc = 'The quarterly report says revenue grew. '.repeat(200);
    const asString = promptBlocks(chat([{ role: 'user', content: `${doc}\nSummarise it.` }]), BLOCK);
    // vLLM takes a plain string among the content parts as a text part.
    const asStrings = promptBlocks(chat([{ role: 'user', content: [doc, 'Summarise it.'] }]), BLOCK);
    expect(asStrings.hashes).toEqual(asString.hashes);
    expect(asStrings.textChars).toBe(asString.textChars);
    expect(asStrings.mediaParts).toBe(0);
    const thinking = promptBlocks(
      chat([{ role: 'assistant', content: [{ type: 'thinking', thinking: doc, closed: true }] }]),
      BLOCK,
    );
    expect(thinking.mediaParts).toBe(0);
    expect(thinking.textChars).toBeGreaterThan(doc.length);
    // The current turn's reasoning (after the last user message: what templates render) is
    // counted; an earlier turn's only hashed. Either way two turns that reasoned differently are
    // two prompts from there on.
    const turn = (reasoning: string, key = 'reasoning', more: unknown[] = []) =>
      promptBlocks(
        chat([
          { role: 'user', content: 'Plan the migration of the billing database. '.repeat(10) },
          { role: 'assistant', content: 'Done: three steps.', [key]: reasoning },
          ...more,
        ]),
        BLOCK,
      );
    const current = turn(doc);
    expect(current.textChars).toBeGreaterThan(doc.length);
    expect(current.hashes.at(-1)).not.toBe(turn(`!${doc.slice(1)}`).hashes.at(-1));
    const next = [{ role: 'user', content: 'Go on with the second step, carefully. '.repeat(5) }];
    const earlier = turn(doc, 'reasoning', next);
    const other = turn(`!${doc.slice(1)}`, 'reasoning', next);
    expect(earlier.textChars).toBeLessThan(800);
    // Named by a digest: a few blocks, however long the reasoning.
    expect(earlier.hashes.length).toBeLessThan(current.hashes.length / 10);
    expect(earlier.hashes.at(-1)).not.toBe(other.hashes.at(-1));
    expect(common(earlier.hashes, other.hashes)).toBeGreaterThan(0);
    // The deprecated name is read too.
    expect(turn(doc, 'reasoning_content').hashes).toEqual(current.hashes);
    // A reasoning of a few thousand characters is named by as few blocks as a long one: the
    // blocks of what the backend does not prefill are credited as cached tokens it does not hold.
    const some = 'First check the foreign keys, then the triggers. '.repeat(50);
    const shorter = turn(some, 'reasoning', next);
    expect(some.length).toBeGreaterThan(2000);
    expect(shorter.hashes.length).toBe(earlier.hashes.length);
    expect(shorter.hashes.at(-1)).not.toBe(turn(`!${some.slice(1)}`, 'reasoning', next).hashes.at(-1));
  });

  it('an image costs the index the same blocks whatever its size, and still names its content', () => {
    const base64 = (n: number, seed: number) => {
      const rng = new Rng(seed);
      const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
      let out = '';
      for (let i = 0; i < n; i++) out += abc[Math.floor(rng.next() * 64)];
      return out;
    };
    const withImage = (data: string) =>
      promptBlocks(
        chat([
          { role: 'system', content: 'a'.repeat(CHARS * 3) },
          {
            role: 'user',
            content: [
              { type: 'image_url', image_url: { url: `data:image/png;base64,${data}` } },
              { type: 'text', text: 'what is in this picture?' },
            ],
          },
        ]),
        BLOCK,
      );
    const small = withImage(base64(20_000, 1));
    const big = withImage(base64(200_000, 2));
    // Hashed whole, 200,000 characters were over 3,000 blocks of 64 characters here.
    expect(big.hashes.length).toBe(small.hashes.length);
    // So does a tiny one (a 3 KB icon), and it names its content too.
    const tiny = withImage(base64(4_000, 4));
    expect(tiny.hashes.length).toBe(small.hashes.length);
    expect(tiny.hashes.at(-1)).not.toBe(withImage(base64(4_000, 5)).hashes.at(-1));
    // Its markers aside: the system prompt's 3 blocks, the filler's, and a few of markers.
    expect(big.hashes.length).toBeLessThan(3 + (MEDIA_PART_TOKENS * BLOCK_CHARS_PER_TOKEN) / CHARS + 3);
    // The system prompt's blocks are shared; from the image on, the hashes name it.
    expect(common(big.hashes, small.hashes)).toBe(3);
    expect(withImage(base64(200_000, 2)).hashes).toEqual(big.hashes);
    // Another image of the same length and the same first half (compressed image data differs
    // from the first change on).
    const data = base64(200_000, 2);
    const edited = `${data.slice(0, 100_000)}${base64(100_000, 3)}`;
    expect(common(withImage(edited).hashes, big.hashes)).toBe(3);
    expect(big.textChars).toBe(small.textChars);
  });

  it('counts no fewer characters per token than it started with when judging the fewest tokens', () => {
    const est = new TokenEstimate();
    // Traffic in a script of about 1.2 characters per token teaches a low ratio...
    for (let i = 0; i < 50; i++)
      est.learn(promptBlocks(chat([{ role: 'user', content: 'x'.repeat(1200) }]), BLOCK), 1007);
    expect(est.charsPerToken).toBeLessThan(1.5);
    // ...which would put an English prompt at three times its tokens; the fewest count does not.
    const english = promptBlocks(
      chat([{ role: 'user', content: 'The quick brown fox. '.repeat(400) }]),
      BLOCK,
    );
    expect(est.tokens(english)).toBeGreaterThan(5_000);
    expect(est.fewestTokens(english)).toBeLessThan(2_200);
    expect(est.fewestTokens(english)).toBeGreaterThan(2_000);
  });
});

describe('tokenFloor: the fewest tokens a text can be, whatever it holds', () => {
  const bpe = (text: string) => encode(text).length;

  it('never counts more than the BPE tokens, on text of every kind', () => {
    const fixed = [
      'The quick brown fox jumps over the lazy dog.',
      ' '.repeat(5000),
      `| name${' '.repeat(60)}| value${' '.repeat(60)}|\n|${'-'.repeat(66)}|${'-'.repeat(67)}|\n`,
      '//' + '-'.repeat(112),
      'function f(a, b) {\n  return a.map((x) => x * 2).filter(Boolean);\n}\n',
      '12345678901234567890 3.14159 1e300 0x7fffffff',
      "don't can't won't it's we'll I'd they've",
      'e\u0301te\u0301 cafe\u0301 na\u0131ve \u00c5ngstr\u00f6m',
      '<|eot_id|><|start_header_id|>user<|end_header_id|>'.repeat(20),
      '\u4f60\u597d\uff0c\u4e16\u754c\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8',
      '\u{1f600}\u{1f680} emoji \u{1f469}\u200d\u{1f4bb} and \u0645\u0631\u062d\u0628\u0627',
      'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
    ];
    for (const text of fixed)
      expect(tokenFloor(text), JSON.stringify(text.slice(0, 40))).toBeLessThanOrEqual(bpe(text));
    // Random text over an alphabet that mixes every kind of piece, from a fixed seed.
    const alphabet = [
      'a',
      'Z',
      'q',
      ' ',
      '  ',
      '\n',
      '\t',
      '7',
      '42',
      '.',
      ',',
      '-',
      '|',
      "'s",
      '\u00e9',
      '\u4e2d',
      '<|eot_id|>',
      '\u{1f600}',
    ];
    let seed = 12345;
    const next = () => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648;
    };
    for (let i = 0; i < 300; i++) {
      let text = '';
      const n = 1 + Math.floor(next() * 200);
      for (let j = 0; j < n; j++) text += alphabet[Math.floor(next() * alphabet.length)];
      expect(tokenFloor(text), JSON.stringify(text)).toBeLessThanOrEqual(bpe(text));
    }
  });

  it('counts most of the tokens of prose, and the prompts each on its own', () => {
    const prose = syntheticText(new Rng(3), 1000);
    expect(tokenFloor(prose)).toBeGreaterThan(0.6 * bpe(prose));
    // Whitespace the character count would take for hundreds of tokens is next to nothing here.
    expect(tokenFloor(`a${' '.repeat(3000)}b`)).toBe(2);
    const texts: PromptSource = { kind: 'text', texts: ['one two three', 'four'] };
    expect(promptFloors(texts)).toEqual([4, 2]);
    const ids: PromptSource = { kind: 'ids', ids: [[1, 2, 3], [4]] };
    expect(promptFloors(ids)).toEqual([3, 1]);
    const chat: PromptSource = {
      kind: 'chat',
      messages: [
        { role: 'system', content: 'Be brief.' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'Hello there' },
            { type: 'image_url', image_url: { url: 'x' } },
          ],
        },
      ],
    };
    const [chatFloor] = promptFloors(chat);
    // Four words; the image counts nothing, and so does the template (some spend no token on a system message).
    expect(chatFloor).toBe(4);
  });

  it("counts of an assistant's content only what follows its last </think>, as reasoning models' templates render it", () => {
    const thinking = `<think>${'weigh this and that '.repeat(500)}</think>`;
    const chat: PromptSource = {
      kind: 'chat',
      messages: [
        { role: 'user', content: 'one two' },
        { role: 'assistant', content: `${thinking}three four` },
        { role: 'assistant', content: [{ type: 'text', text: `${thinking}five` }] },
        // A user's text is the user's: all of it counts.
        { role: 'user', content: `${thinking}six` },
      ],
    };
    const [floor] = promptFloors(chat);
    expect(floor).toBe(2 + 2 + 1 + tokenFloor(`${thinking}six`));
    // Neither assistant's thinking counted: the floor holds it once, the user's.
    expect(floor).toBeLessThan(2 * tokenFloor(thinking));
  });

  it('stops counting once past a bound: the work follows the context length, not the body', () => {
    const many = 'a '.repeat(1_000_000);
    expect(tokenFloor(many)).toBe(1_000_000);
    expect(tokenFloor(many, 100)).toBe(101);
    // Under the bound, the whole count.
    expect(tokenFloor('one two three', 100)).toBe(3);
    const texts: PromptSource = { kind: 'text', texts: [many, 'four'] };
    expect(promptFloors(texts, 100)).toEqual([102, 2]);
    const chat: PromptSource = {
      kind: 'chat',
      messages: [
        { role: 'user', content: many },
        { role: 'user', content: [{ type: 'text', text: many }] },
      ],
    };
    // Past the bound within the first message: the second is not read.
    const [floor] = promptFloors(chat, 100);
    expect(floor).toBeGreaterThan(100);
    expect(floor).toBeLessThanOrEqual(101);
  });
});
