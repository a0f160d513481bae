// A stream of several choices (n > 1) through the gateway, with the official openai client: every
// choice reaches the client, and the request's TPOT is each sequence's, as the replica's own
// metrics count it, not the pace of the interleaved events.
import OpenAI from 'openai';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { get, MODEL, startTestGateway, type TestGateway } from './harness.ts';

let t: TestGateway;
let openai: OpenAI;

beforeAll(async () => {
  // At full speed: a decode step of a few milliseconds, which the gateway's clock can tell apart.
  t = await startTestGateway({ replicas: 1, timeScale: 1 });
  openai = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
afterAll(async () => {
  await t?.close();
});

/** The replica's own time per output token: sum and count of its histogram. */
async function replicaTpot(): Promise<{ sum: number; count: number }> {
  const text = (await get(t.fleet!.urls[0]!, '/metrics')).text;
  const value = (name: string) => Number(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, 'm').exec(text)![1]);
  return {
    sum: value('vllm:request_time_per_output_token_seconds_sum'),
    count: value('vllm:request_time_per_output_token_seconds_count'),
  };
}

it('streams n choices interleaved, and times each sequence as the replica does', async () => {
  const before = await replicaTpot();
  // ignore_eos is vLLM's own field (every choice runs to max_tokens): the client passes it on.
  const params = {
    model: MODEL,
    messages: [{ role: 'user' as const, content: 'Three ways to say hello.' }],
    max_tokens: 40,
    n: 3,
    stream: true as const,
    stream_options: { include_usage: true },
    ignore_eos: true,
  };
  const stream = await openai.chat.completions.create(params);
  const texts = ['', '', ''];
  let usage: OpenAI.CompletionUsage | null | undefined;
  let id = '';
  for await (const chunk of stream) {
    id = chunk.id;
    for (const c of chunk.choices) texts[c.index] += c.delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  expect(texts.every((x) => x.length > 0)).toBe(true);
  expect(usage?.completion_tokens).toBe(120);
  const after = await replicaTpot();
  expect(after.count - before.count).toBe(3);
  // The replica's mean over its three sequences; they are of one length, so the gateway's
  // per-sequence figure is the same mean, give or take what the network adds to the spans.
  const replicaMs = ((after.sum - before.sum) / 3) * 1000;
  const records = await t.records();
  const rec = records.find((r) => r.outcome === 'ok' && r.completion_tokens === 120);
  expect(rec, `record of ${id}`).toBeDefined();
  expect(rec!.ttft_ms).not.toBeNull();
  expect(rec!.tpot_ms!).toBeGreaterThan(replicaMs * 0.8);
  expect(rec!.tpot_ms!).toBeLessThan(replicaMs * 1.25);
});

it('assembles a non-streamed request for n choices from the stream: the choices in order, its timing measured', async () => {
  const before = await replicaTpot();
  const params = {
    model: MODEL,
    messages: [{ role: 'user' as const, content: 'Three more ways to say hello.' }],
    max_tokens: 30,
    n: 3,
    ignore_eos: true,
  };
  const { data, response } = await openai.chat.completions.create(params).withResponse();
  expect(data.object).toBe('chat.completion');
  expect(data.choices.map((c) => c.index)).toEqual([0, 1, 2]);
  expect(data.choices.every((c) => (c.message.content ?? '').length > 0)).toBe(true);
  expect(new Set(data.choices.map((c) => c.message.content)).size).toBe(3);
  expect(data.usage?.completion_tokens).toBe(90);
  const rec = await t.recordOf(response.headers.get('x-request-id')!);
  // Streamed from the backend, so timed as a stream is: not a body passed through untimed.
  expect(rec).toMatchObject({ outcome: 'ok', stream: false, completion_tokens: 90 });
  expect(rec.ttft_ms).not.toBeNull();
  const after = await replicaTpot();
  const replicaMs = ((after.sum - before.sum) / 3) * 1000;
  expect(rec.tpot_ms!).toBeGreaterThan(replicaMs * 0.8);
  expect(rec.tpot_ms!).toBeLessThan(replicaMs * 1.25);
  expect(rec.sla_met).not.toBeNull();
});
