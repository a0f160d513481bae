// A backend with fixed timings, for measuring what sits in front of it: every streamed chat
// request gets its role chunk after --ttft-ms and then one content chunk every --itl-ms until
// max_tokens, in vLLM's SSE format (with the usage chunk when asked). No batching, no queue: a
// request's timing does not depend on the others, so any difference between two paths to it is
// the paths'. Prints its URL.
//
//   npx tsx scripts/lib/fixed-backend.ts [--ttft-ms 20] [--itl-ms 10]

import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: { 'ttft-ms': { type: 'string', default: '20' }, 'itl-ms': { type: 'string', default: '10' } },
});
const ttftMs = Number(values['ttft-ms']);
const itlMs = Number(values['itl-ms']);
const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

const server = createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/health') return void res.end();
  if (req.method === 'GET' && req.url === '/v1/models') {
    res.setHeader('content-type', 'application/json');
    return void res.end(
      JSON.stringify({ object: 'list', data: [{ id: MODEL, object: 'model', max_model_len: 131072 }] }),
    );
  }
  if (req.method !== 'POST') {
    res.statusCode = 404;
    return void res.end();
  }
  let raw = '';
  req.setEncoding('utf8');
  req.on('data', (c: string) => {
    raw += c;
  });
  req.on('end', () => {
    const body = JSON.parse(raw) as {
      max_tokens?: number;
      max_completion_tokens?: number;
      stream_options?: { include_usage?: boolean };
    };
    const n = body.max_completion_tokens ?? body.max_tokens ?? 16;
    const id = `chatcmpl-${Math.random().toString(36).slice(2)}`;
    const chunk = (delta: object, finish: string | null) =>
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model: MODEL, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] })}\n\n`;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    let i = 0;
    let timer: NodeJS.Timeout;
    const next = () => {
      if (i === 0) res.write(chunk({ role: 'assistant', content: '' }, null));
      i++;
      res.write(chunk({ content: ' word' }, i === n ? 'length' : null));
      if (i < n) {
        timer = setTimeout(next, itlMs);
        return;
      }
      if (body.stream_options?.include_usage) {
        res.write(
          `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model: MODEL, choices: [], usage: { prompt_tokens: 10, completion_tokens: n, total_tokens: 10 + n } })}\n\n`,
        );
      }
      res.end('data: [DONE]\n\n');
    };
    timer = setTimeout(next, ttftMs);
    res.on('close', () => clearTimeout(timer));
  });
});
server.listen(0, '127.0.0.1', () => {
  const a = server.address();
  process.stdout.write(`http://127.0.0.1:${typeof a === 'object' && a ? a.port : 0}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
