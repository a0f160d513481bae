// A fleet of several models behind one gateway: each replica is sent only the models its own
// /v1/models lists (Backend.serves), in the scheduler and in admission's prediction alike.
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Fleet, startFleet } from '../../src/sim/fleet.ts';
import { get, post, startTestGateway, type TestGateway, waitFor } from './harness.ts';

const SMALL = 'acme/small-chat';
const LARGE = 'acme/large-chat';
/** Configured, but no replica serves it. */
const ORPHAN = 'acme/retired-chat';

let small: Fleet;
let large: Fleet;
let t: TestGateway;
let openai: OpenAI;

beforeAll(async () => {
  small = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.05, model: SMALL });
  large = await startFleet({ replicas: 2, profile: 'llama3-8b-h100', timeScale: 0.05, model: LARGE });
  t = await startTestGateway({
    // Interleaved, so that a ring over every backend would give each model the other's replicas.
    backends: [
      { name: 'large-0', url: large.urls[0]! },
      { name: 'small-0', url: small.urls[0]! },
      { name: 'large-1', url: large.urls[1]! },
    ],
    config: {
      models: [SMALL, LARGE, ORPHAN],
      router: { policy: 'round_robin' },
      // No second chance: a request sent to a replica without its model would fail.
      upstream: { retries: 0 },
    },
  });
  openai = new OpenAI({ baseURL: `${t.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});
afterAll(async () => {
  await t?.close();
  await small?.close();
  await large?.close();
});

describe('a fleet of several models', () => {
  it('sends each request only to replicas that list its model', async () => {
    const seen = new Map<string, Set<string>>([
      [SMALL, new Set()],
      [LARGE, new Set()],
    ]);
    for (let i = 0; i < 6; i++) {
      for (const model of [SMALL, LARGE]) {
        const { data, response } = await openai.chat.completions
          .create({
            model,
            messages: [{ role: 'user', content: `Question ${i} for ${model}` }],
            max_tokens: 4,
          })
          .withResponse();
        expect(data.model).toBe(model);
        seen.get(model)!.add(response.headers.get('x-slagate-backend')!);
        const rec = await t.recordOf(response.headers.get('x-request-id')!);
        expect(rec).toMatchObject({ outcome: 'ok', model, attempts: 1 });
      }
    }
    expect([...seen.get(SMALL)!]).toEqual(['small-0']);
    expect([...seen.get(LARGE)!].every((b) => b.startsWith('large-'))).toBe(true);
  });

  it('shows what each replica lists on /admin/state', async () => {
    const state = JSON.parse((await get(t.url, '/admin/state')).text) as {
      backends: { name: string; models: string[] | null }[];
    };
    const models = Object.fromEntries(state.backends.map((b) => [b.name, b.models]));
    expect(models).toEqual({ 'large-0': [LARGE], 'small-0': [SMALL], 'large-1': [LARGE] });
  });

  it('answers 503 for a configured model that no replica lists, and sends it nowhere', async () => {
    const res = await post(t.url, '/v1/chat/completions', {
      model: ORPHAN,
      messages: [{ role: 'user', content: 'Anyone there?' }],
      max_tokens: 4,
    });
    expect(res.status).toBe(503);
    expect(JSON.parse(res.text).error.code).toBe('no_healthy_backend');
    const rec = await t.recordOf(res.headers['x-request-id'] as string);
    expect(rec).toMatchObject({ model: ORPHAN, backend: null, attempts: 0 });
  });
});

describe('a replica the gateway could not ask at start', () => {
  let fleet: Fleet;
  let gw: TestGateway;
  afterAll(async () => {
    await gw?.close();
    await fleet?.close();
  });

  it('lists its models as soon as it answers, not at the next periodic refresh', async () => {
    fleet = await startFleet({ replicas: 1, profile: 'llama3-8b-h100', timeScale: 0.05, model: LARGE });
    // Still loading its weights, say: nothing listens on its port.
    await fleet.replicas[0]!.fault({ mode: 'refuse' });
    gw = await startTestGateway({
      backends: [{ name: 'late', url: fleet.urls[0]! }],
      config: { models: [SMALL, LARGE] },
    });
    const listed = async () =>
      (JSON.parse((await get(gw.url, '/admin/state')).text) as { backends: { models: string[] | null }[] })
        .backends[0]!.models;
    expect(await listed()).toBeNull();
    await fleet.replicas[0]!.reset();
    // Its health probe (every 100 ms here) sees it up, and the gateway asks it then: well
    // before the 30 s refresh.
    await waitFor(async () => (await listed()) !== null, 5000, 'its models listed');
    expect(await listed()).toEqual([LARGE]);
  });
});
