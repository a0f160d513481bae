// A bare open-loop load generator, run as its own process so that its CPU does not count against
// the process being measured. Sends `rate` req/s (Poisson) for `seconds` to the given URLs in
// turn, each a streamed chat request with a unique ~`tokens`-token prompt, and reads every stream
// to the end. Prints one JSON line: {sent, ok, failed}.
//
//   npx tsx scripts/lib/open-loop-load.ts --urls u1,u2 --rate 50 --seconds 20 --tokens 2000 --max-tokens 64

import { parseArgs } from 'node:util';
import { Agent, request } from 'undici';

const { values } = parseArgs({
  options: {
    urls: { type: 'string' },
    rate: { type: 'string', default: '50' },
    seconds: { type: 'string', default: '20' },
    tokens: { type: 'string', default: '2000' },
    'max-tokens': { type: 'string', default: '64' },
    model: { type: 'string', default: 'meta-llama/Llama-3.1-8B-Instruct' },
  },
});
const urls = (values.urls ?? '').split(',').filter(Boolean);
const rate = Number(values.rate);
const seconds = Number(values.seconds);
const words = 'the of and to in is that for it with as was on be at by this have from or'.split(' ');
const agent = new Agent({ connections: 256, keepAliveTimeout: 10_000 });

// One distinct prompt per request (a counter in the first words) so no cache helps the target;
// ~1 token per word for these words in cl100k.
function prompt(i: number, tokens: number): string {
  const parts = [`request ${i} ${Math.random().toString(36).slice(2)}`];
  for (let k = 0; k < tokens - 4; k++) parts.push(words[(i * 7 + k * 13) % words.length]!);
  return parts.join(' ');
}

let ok = 0;
let failed = 0;
let sent = 0;
const pending: Promise<void>[] = [];
const start = performance.now();
let next = 0;
while (next < seconds * 1000) {
  const wait = start + next - performance.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  const url = urls[sent % urls.length]!;
  const body = JSON.stringify({
    model: values.model,
    messages: [{ role: 'user', content: prompt(sent, Number(values.tokens)) }],
    max_tokens: Number(values['max-tokens']),
    ignore_eos: true,
    stream: true,
  });
  sent++;
  pending.push(
    request(new URL('/v1/chat/completions', url), {
      method: 'POST',
      dispatcher: agent,
      headers: { 'content-type': 'application/json' },
      body,
    })
      .then(async (res) => {
        for await (const _ of res.body) {
          // drain
        }
        if (res.statusCode === 200) ok++;
        else failed++;
      })
      .catch(() => {
        failed++;
      }),
  );
  next += (-Math.log(1 - Math.random()) / rate) * 1000;
}
await Promise.all(pending);
await agent.close();
process.stdout.write(`${JSON.stringify({ sent, ok, failed })}\n`);
