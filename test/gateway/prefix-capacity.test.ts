// The prefix index's bound follows the characters per token the gateway learns from the backends'
// counts: each backend's part holds as many tokens as its KV cache, not one hash per KV block.
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
  capacity: number;
  capacity_assumed: boolean;
}

async function indexSize(): Promise<IndexSize> {
  const s = JSON.parse((await get(t.url, '/admin/state')).text) as {
    backends: { prefix_index: IndexSize }[];
  };
  return s.backends[0]!.prefix_index;
}
const capacity = async () => (await indexSize()).capacity;

describe('prefix index capacity', () => {
  it('shrinks to the KV cache in tokens once the text turns out to be 2 characters per token', async () => {
    // Until the backend's cache config is scraped the index has its default bound, and says it is
    // assumed (test/state/memory.test.ts, scraper.test.ts): here the scrape may already be in.
    await waitFor(async () => !(await indexSize()).capacity_assumed, 3000, 'cache config scraped');
    expect((await indexSize()).capacity_assumed).toBe(false);
    const before = await capacity();
    // 4 characters per token (the start): one index block per KV block of 16 tokens.
    expect(before).toBeGreaterThan(0);
    // "a a a …": each " a" is one token, 2 characters. The backend's count teaches the gateway.
    const res = await post(
      t.url,
      '/v1/chat/completions',
      chat({ messages: [{ role: 'user', content: 'a '.repeat(2_000) }] }),
    );
    expect(res.status).toBe(200);
    const after = await capacity();
    // An index block (64 characters) now stands for about 32 tokens: about half as many blocks.
    expect(after).toBeLessThan(before * 0.6);
    expect(after).toBeGreaterThan(before * 0.4);
  });
});
