// The prefix index is bounded by each backend's KV cache in tokens, and each block it holds weighs
// the tokens its text stands for at the characters per token the gateway learns from the
// backends' counts: text of 2 characters a token fills the cache twice as fast as text of 4.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chat, get, post, startTestGateway, type TestGateway, waitFor } from './harness.ts';

let t: TestGateway;
beforeAll(async () => {
  t = await startTestGateway({ replicas: 1 });
});
afterAll(async () => {
  await t.close();
});

interface IndexSize {
  blocks: number;
  tokens: number;
  capacity_tokens: number;
  capacity_assumed: boolean;
}

async function indexSize(): Promise<IndexSize> {
  const s = JSON.parse((await get(t.url, '/admin/state')).text) as {
    backends: { prefix_index: IndexSize }[];
  };
  return s.backends[0]!.prefix_index;
}

describe('prefix index size', () => {
  it('weighs each block at the tokens its text stands for, within the KV cache in tokens', async () => {
    await waitFor(async () => !(await indexSize()).capacity_assumed, 3000, 'cache config scraped');
    const empty = await indexSize();
    expect(empty).toMatchObject({ blocks: 0, tokens: 0 });
    expect(empty.capacity_tokens).toBeGreaterThan(0);
    // "a a a …": each " a" is one token, 2 characters. Sent at the initial 4 characters a token,
    // its blocks weigh 64 tokens (an index block is 256 characters); the backend's count then
    // teaches the gateway the text's ratio.
    const send = async (word: string) =>
      expect(
        (
          await post(
            t.url,
            '/v1/chat/completions',
            chat({ messages: [{ role: 'user', content: `${word} `.repeat(2_000) }] }),
          )
        ).status,
      ).toBe(200);
    await send('a');
    const first = await indexSize();
    expect(first.blocks).toBeGreaterThan(10);
    expect(first.tokens / first.blocks).toBeCloseTo(64, 0);
    // The next prompt of the same kind: its blocks weigh about twice as much.
    await send('b');
    const second = await indexSize();
    const perBlock = (second.tokens - first.tokens) / (second.blocks - first.blocks);
    expect(perBlock).toBeGreaterThan(64 * 1.6);
    expect(perBlock).toBeLessThan(64 * 2.4);
    expect(second.capacity_tokens).toBe(empty.capacity_tokens);
  });
});
