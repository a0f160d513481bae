import 'ioredis';
import { syntheticText } from '/work/main/src/bench/text.ts';
import { promptBlocks, TokenEstimate } from '/work/main/src/prompt/canonical.ts';
import { Rng } from '/work/main/src/sim/rng.ts';
import { Tokenizer } from '/work/main/src/tokenizer/tokenizer.ts';
function timings(n: number, fn: (i: number) => void): { p50: number; p99: number; max: number } {
  const d: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    fn(i);
    d.push(performance.now() - t);
  }
  d.sort((a, b) => a - b);
  return {
    p50: d[Math.floor(0.5 * (n - 1))] as number,
    p99: d[Math.floor(0.99 * (n - 1))] as number,
    max: d[n - 1] as number,
  };
}

async function micro(): Promise<Record<string, unknown>> {
  const rng = new Rng(77);
  const prompt = (tokens: number) => [
    { role: 'system', content: syntheticText(rng, Math.floor(tokens * 0.8)) },
    { role: 'user', content: syntheticText(rng, Math.ceil(tokens * 0.2)) },
  ];
  const result: Record<string, unknown> = {};
  for (const tokens of [8000, 32000]) {
    const n = tokens === 8000 ? 200 : 50;
    // Through JSON, as the gateway gets them from a request body: flat strings, not the ropes
    // string concatenation builds (the first read of a rope flattens it, a cost no request pays).
    const prompts = Array.from(
      { length: n },
      () => JSON.parse(JSON.stringify(prompt(tokens))) as ReturnType<typeof prompt>,
    );
    const est = new TokenEstimate();
    // Warm up the JIT on other prompts of the same size (a running gateway is warm), then time
    // unique ones.
    for (let i = 0; i < 50; i++) {
      const warm = JSON.parse(JSON.stringify(prompt(tokens))) as ReturnType<typeof prompt>;
      est.tokens(promptBlocks({ kind: 'chat', messages: warm }, 16));
      if (i < 5) new Tokenizer().countChat(warm);
    }
    const hashing = timings(n, (i) => {
      est.tokens(promptBlocks({ kind: 'chat', messages: prompts[i]! }, 16));
    });
    const bpe = timings(n, (i) => {
      new Tokenizer().countChat(prompts[i]!);
    });
    result[`prompt_${tokens}`] = { canonicalHashEstimateMs: hashing, bpeMs: bpe, prompts: n };
  }
  return result;
}
if (process.env.POLLUTE) { const r = new Rng(1); for (let i = 0; i < 20; i++) { const cons = syntheticText(r, 500) + syntheticText(r, 500); promptBlocks({ kind: "chat", messages: [{ role: "user", content: cons }, { role: "user", content: "héllo € " + syntheticText(r, 100) }] }, 16); } }
console.log(JSON.stringify(await micro()));
