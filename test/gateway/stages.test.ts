// The request path's stage marks (src/telemetry/stages.ts) as a subscriber in the gateway's process
// sees them: every stage of a streamed request once, in path order, under its request id; a request
// refused before admission stops at the stage where it was refused.
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { STAGE_CHANNEL, type StageMark } from '../../src/telemetry/stages.ts';
import { chat, chatStreamText, heldStream, post, scripted, sseData, startTestGateway } from './harness.ts';

const CHAT = '/v1/chat/completions';
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function listen(): StageMark[] {
  const marks: StageMark[] = [];
  const onMark = (m: unknown) => marks.push(m as StageMark);
  subscribe(STAGE_CHANNEL, onMark);
  cleanups.push(() => {
    unsubscribe(STAGE_CHANNEL, onMark);
  });
  return marks;
}

async function gateway() {
  const b = await scripted((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    res.end(chatStreamText(4));
  });
  cleanups.push(() => b.close());
  const t = await startTestGateway({ backends: [{ name: 'b0', url: b.url }] });
  cleanups.push(() => t.close());
  return t;
}

it('a streamed request passes every stage once, in the order of the path', async () => {
  const t = await gateway();
  const marks = listen();
  const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'stages-1' });
  expect(res.status).toBe(200);
  expect(res.text).toContain('[DONE]');
  const mine = marks.filter((m) => m.reqId === 'stages-1');
  expect(mine.map((m) => m.stage)).toEqual([
    'received',
    'parsed',
    'admitted',
    'granted',
    'dispatched',
    'committed',
  ]);
  for (let i = 1; i < mine.length; i++) expect(mine[i]!.at).toBeGreaterThanOrEqual(mine[i - 1]!.at);
  // Nothing was published under another id.
  expect(marks.every((m) => m.reqId === 'stages-1')).toBe(true);
});

it('a request refused at intake is marked up to the handler and no further', async () => {
  const t = await gateway();
  const marks = listen();
  const res = await post(t.url, CHAT, { ...chat(), model: 'no-such-model' }, { 'x-request-id': 'stages-2' });
  expect(res.status).toBe(404);
  expect(marks.filter((m) => m.reqId === 'stages-2').map((m) => m.stage)).toEqual(['received', 'parsed']);
});

it("a stream's head and first token reach the kernel before anything queued after the commit runs", async () => {
  // The first write is the client's TTFT: it must not wait for the end of the tick behind other
  // work (src/upstream/relay.ts, #writeOpening). A tick queued at the commit mark, before the write,
  // finds the write already handed to the kernel: nothing corked, nothing buffered.
  const b = await heldStream(3, 1); // the role chunk alone: the commit point
  cleanups.push(() => b.close());
  const t = await startTestGateway({ backends: [{ name: 'b0', url: b.url }] });
  cleanups.push(() => t.close());

  let socket: Socket | null = null;
  const onStart = (m: unknown) => {
    const { request } = m as { request: IncomingMessage };
    if (request.headers['x-request-id'] === 'stages-3') socket = request.socket;
  };
  subscribe('http.server.request.start', onStart);
  cleanups.push(() => {
    unsubscribe('http.server.request.start', onStart);
  });
  const seen = new Promise<{ corked: number; buffered: number }>((resolve) => {
    const onMark = (m: unknown) => {
      const mark = m as StageMark;
      if (mark.reqId !== 'stages-3' || mark.stage !== 'committed') return;
      unsubscribe(STAGE_CHANNEL, onMark);
      process.nextTick(() => {
        const s = socket as Socket | null;
        resolve({ corked: s?.writableCorked ?? -1, buffered: s?.writableLength ?? -1 });
        b.release();
      });
    };
    subscribe(STAGE_CHANNEL, onMark);
  });
  const res = await post(t.url, CHAT, chat({ stream: true }), { 'x-request-id': 'stages-3' });
  expect(await seen).toEqual({ corked: 0, buffered: 0 });
  expect(res.status).toBe(200);
  expect(sseData(res.text)).toHaveLength(5); // role, three tokens, [DONE] (no usage asked for)
});
