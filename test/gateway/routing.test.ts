// Prefix-cache routing seen from outside, on simulated replicas whose prefix caches are real
// (vLLM's block hashing and LRU): conversations stay where their history is cached, the headers
// and the record say what the router believed, and the oracle asks the replicas themselves.
// Exploration is off (explore_ratio: 0): its random share would send a request away at random.
import { createHash } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { syntheticText } from '../../src/bench/text.ts';
import { Rng } from '../../src/sim/rng.ts';
import { cacheHits, MODEL, post, startTestGateway, type TestGateway } from './harness.ts';

const CHAT = '/v1/chat/completions';
let t: TestGateway | null = null;
afterEach(async () => {
  await t?.close();
  t = null;
});

interface Message {
  role: string;
  content: string;
}

async function turn(gw: TestGateway, messages: Message[], id: string, session?: string, apiKey?: string) {
  const res = await post(
    gw.url,
    CHAT,
    { model: MODEL, messages, max_tokens: 16 },
    {
      'x-request-id': id,
      ...(session === undefined ? {} : { 'x-session-id': session }),
      ...(apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` }),
    },
  );
  expect(res.status, res.text).toBe(200);
  const answer = (JSON.parse(res.text) as { choices: { message: { content: string } }[] }).choices[0]!.message
    .content;
  return {
    backend: res.headers['x-slagate-backend'] as string,
    hit: Number(res.headers['x-slagate-prefix-hit']),
    answer,
  };
}

describe('prefix-cache routing (router.policy: slagate)', () => {
  const rng = new Rng(5);
  const system: Message = { role: 'system', content: syntheticText(rng, 1500) };

  it('a conversation continued over several turns keeps its backend, which serves it from its cache', async () => {
    t = await startTestGateway({ replicas: 4, config: { router: { policy: 'slagate', explore_ratio: 0 } } });
    const messages: Message[] = [system];
    const seen: { backend: string; hit: number }[] = [];
    for (let i = 0; i < 5; i++) {
      messages.push({ role: 'user', content: syntheticText(rng, 40) });
      const r = await turn(t, messages, `conv-${i}`, 'conv');
      seen.push(r);
      messages.push({ role: 'assistant', content: r.answer });
    }
    const first = seen[0]!.backend;
    expect(seen.map((s) => s.backend)).toEqual(Array(5).fill(first));
    expect(seen[0]!.hit).toBe(0);
    // From the second turn on, nearly the whole prompt is the history already sent there.
    for (const s of seen.slice(1)) expect(s.hit).toBeGreaterThan(0.8);
    // The replica agrees: only the one that served the conversation has cache hits.
    const hits = await cacheHits(t.fleet!.urls);
    const served = Number(first.slice(1));
    expect(hits[served]).toBeGreaterThan(4 * 1500);
    expect(hits.filter((_, i) => i !== served).every((h) => h === 0)).toBe(true);
    // The record says what the router believed: the prompt's blocks and the hit it estimated.
    const rec = await t.recordOf('conv-3');
    expect(rec.prefix_blocks).toBeGreaterThan(1500 / t.gw.runtime.config.router.block_size_tokens);
    expect(rec.prefix_hit_est).toBeCloseTo(seen[3]!.hit, 3);
  });

  it('different users after the same system prompt go to the backend that holds it', async () => {
    t = await startTestGateway({ replicas: 4, config: { router: { policy: 'slagate', explore_ratio: 0 } } });
    const backends = new Set<string>();
    for (let u = 0; u < 6; u++) {
      const r = await turn(t, [system, { role: 'user', content: syntheticText(rng, 30) }], `user-${u}`);
      backends.add(r.backend);
      if (u > 0) expect(r.hit).toBeGreaterThan(0.8);
    }
    expect(backends.size).toBe(1);
  });

  it("credits no cache hit to a request that asks for its prompt's logprobs: vLLM reads none for it", async () => {
    t = await startTestGateway({ replicas: 2, config: { router: { policy: 'slagate', explore_ratio: 0 } } });
    const gw = t;
    const ask = async (id: string, extra: Record<string, unknown>) => {
      const res = await post(
        gw.url,
        CHAT,
        {
          model: MODEL,
          messages: [system, { role: 'user', content: `question ${id}` }],
          max_tokens: 4,
          ...extra,
        },
        { 'x-request-id': id },
      );
      expect(res.status, res.text).toBe(200);
      return { backend: res.headers['x-slagate-backend'], hit: Number(res.headers['x-slagate-prefix-hit']) };
    };
    const total = async () => (await cacheHits(gw.fleet!.urls)).reduce((a, b) => a + b, 0);
    const first = await ask('plain-1', {});
    const before = await total();
    // prompt_logprobs, and chat's echo (its top_logprobs defaults to 0): prefilled whole.
    for (const [id, extra] of [
      ['score-2', { prompt_logprobs: 1 }],
      ['echo-3', { echo: true }],
    ] as const) {
      const r = await ask(id, extra);
      expect(r.hit).toBe(0);
      // Its record is written after its response, by the work deferred past it.
      gw.gw.runtime.afterwork.settle();
      expect((await gw.recordOf(id)).prefix_hit_est).toBe(0);
    }
    // The replicas agree: those two looked nothing up.
    expect(await total()).toBe(before);
    // Their blocks were still cached: a plain request after them is a hit, where it is sent.
    const after = await ask('plain-4', {});
    expect(after.hit).toBeGreaterThan(0.8);
    expect(first.hit).toBe(0);
    expect(await total()).toBeGreaterThan(before);
  });
});

describe('router.policy: oracle (benchmarks only)', () => {
  it("routes on the replicas' own cached-token counts", async () => {
    t = await startTestGateway({ replicas: 3, config: { router: { policy: 'oracle', explore_ratio: 0 } } });
    const rng = new Rng(9);
    const system: Message = { role: 'system', content: syntheticText(rng, 1000) };
    const a = await turn(t, [system, { role: 'user', content: 'first question here' }], 'o-1');
    // What the first request teaches the token estimate (its count, run just after its response)
    // is in before the second is estimated: the hit below is the replica's count over that estimate.
    t.gw.runtime.afterwork.settle();
    const b = await turn(t, [system, { role: 'user', content: 'another question now' }], 'o-2');
    expect(b.backend).toBe(a.backend);
    // The hit is what the replica reported: the system prompt's full 16-token blocks.
    expect(b.hit).toBeGreaterThan(0.9);
    const hits = await cacheHits(t.fleet!.urls);
    expect(hits[Number(a.backend.slice(1))]).toBeGreaterThan(900);
  });

  it("asks the replicas under the salt the backend gets: an isolated tenant's cached prompt is found", async () => {
    const key = 'key-isolated';
    const tenants = [
      {
        name: 'a',
        api_key_sha256: createHash('sha256').update(key).digest('hex'),
        class: 'interactive',
        isolate_prefix_cache: true,
      },
    ];
    t = await startTestGateway({
      replicas: 2,
      config: { tenants, router: { policy: 'oracle', explore_ratio: 0 } },
    });
    const system: Message = { role: 'system', content: syntheticText(new Rng(11), 1000) };
    const a = await turn(
      t,
      [system, { role: 'user', content: 'first question here' }],
      'oi-1',
      undefined,
      key,
    );
    t.gw.runtime.afterwork.settle();
    const b = await turn(
      t,
      [system, { role: 'user', content: 'another question now' }],
      'oi-2',
      undefined,
      key,
    );
    expect(b.backend).toBe(a.backend);
    expect(b.hit).toBeGreaterThan(0.9);
  });
});

describe('the decode term of the slagate cost', () => {
  it("counts one sequence's output: n choices decode side by side, not one after another", async () => {
    t = await startTestGateway({
      replicas: 1,
      config: {
        router: { policy: 'slagate', explore_ratio: 0 },
        // A TPOT target every decode step exceeds: the term is never 0.
        sla: {
          default_class: 'interactive',
          classes: { interactive: { ttft_p99_ms: 5000, tpot_p99_ms: 0.001, priority: 0 } },
        },
        logging: { level: 'debug' },
      },
    });
    const ask = async (id: string, n: number) => {
      const res = await post(
        t!.url,
        CHAT,
        { model: MODEL, messages: [{ role: 'user', content: `question ${id}` }], max_tokens: 40, n },
        { 'x-request-id': id },
      );
      expect(res.status, res.text).toBe(200);
      return t!.recordOf(id);
    };
    // Completed requests give the backend its TPOT fit (three at least).
    for (let i = 0; i < 4; i++) await ask(`warm-${i}`, 1);
    const one = (await ask('one', 1)).candidates?.[0];
    const four = (await ask('four', 4)).candidates?.[0];
    const decode = (c: typeof one) => (c as { decode_s?: number | null } | undefined)?.decode_s ?? null;
    expect(decode(one)).toBeGreaterThan(0);
    expect(decode(four)).toBeGreaterThan(0);
    // The same 40 steps of decoding either way (the fit moves a little between the two).
    expect(decode(four)! / decode(one)!).toBeGreaterThan(0.5);
    expect(decode(four)! / decode(one)!).toBeLessThan(2);
  });
});
