// GET /v1/models as the gateway lists it: the configured names, each card's root and parent as a
// backend's /v1/models gave them (vLLM's `vllm bench serve` loads its tokenizer from data[0].root
// when it is given no model), and safe values before any backend has answered.
import { describe, expect, it } from 'vitest';
import { ModelCatalog } from '../../src/server/model-catalog.ts';

describe('the model catalog', () => {
  it("takes each served model's root and parent from a backend's card, and its name and null before one answered", () => {
    const catalog = new ModelCatalog(['llama-8b', 'sql-lora', 'not-yet']);
    const card = (id: string) => catalog.list().data.find((c) => c.id === id)!;
    expect(card('llama-8b')).toMatchObject({ root: 'llama-8b', parent: null, owned_by: 'slagate' });
    const listed = catalog.learn({
      object: 'list',
      data: [
        {
          id: 'llama-8b',
          object: 'model',
          owned_by: 'vllm',
          root: 'meta-llama/Llama-3.1-8B-Instruct',
          parent: null,
          max_model_len: 8192,
        },
        {
          id: 'sql-lora',
          object: 'model',
          owned_by: 'vllm',
          root: '/adapters/sql',
          parent: 'llama-8b',
          max_model_len: 8192,
        },
        // Not configured: not offered, and nothing of it kept.
        { id: 'other', object: 'model', owned_by: 'vllm', root: 'acme/other', parent: null },
      ],
    });
    expect(listed).toEqual(new Set(['llama-8b', 'sql-lora', 'other']));
    expect(catalog.list().data.map((c) => c.id)).toEqual(['llama-8b', 'sql-lora', 'not-yet']);
    expect(card('llama-8b')).toMatchObject({
      root: 'meta-llama/Llama-3.1-8B-Instruct',
      parent: null,
      max_model_len: 8192,
    });
    expect(card('sql-lora')).toMatchObject({ root: '/adapters/sql', parent: 'llama-8b' });
    expect(card('not-yet')).toMatchObject({ root: 'not-yet', parent: null, max_model_len: null });
  });
});

describe('the model catalog, refreshed from backends that differ', () => {
  it("takes a card's root from the first backend in the configured order that lists it, whichever answers first", async () => {
    const { createServer } = await import('node:http');
    let bAnswered: () => void = () => {};
    const answeredB = new Promise<void>((resolve) => {
      bAnswered = resolve;
    });
    const cards = (root: string) =>
      JSON.stringify({
        object: 'list',
        data: [{ id: 'm', object: 'model', root, parent: null, max_model_len: 4096 }],
      });
    // a is configured first but answers only once b has.
    const a = createServer((_req, res) => {
      void answeredB.then(() =>
        res.writeHead(200, { 'content-type': 'application/json' }).end(cards('/models/m-awq')),
      );
    });
    const b = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }).end(cards('acme/m'), () => bAnswered());
    });
    const listen = (s: typeof a) =>
      new Promise<string>((resolve) =>
        s.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(s.address() as { port: number }).port}`)),
      );
    const [urlA, urlB] = [await listen(a), await listen(b)];
    try {
      const catalog = new ModelCatalog(['m']);
      await catalog.refresh([{ url: urlA }, { url: urlB }]);
      expect(catalog.list().data[0]).toMatchObject({ id: 'm', root: '/models/m-awq' });
    } finally {
      a.closeAllConnections();
      b.closeAllConnections();
      a.close();
      b.close();
    }
  });
});
