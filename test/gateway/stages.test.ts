// The request path's stage marks (src/telemetry/stages.ts) as a subscriber in the gateway's process
// sees them: every stage of a streamed request once, in path order, under its request id; a request
// refused before admission stops at the stage where it was refused.
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { afterEach, expect, it } from 'vitest';
import { STAGE_CHANNEL, type StageMark } from '../../src/telemetry/stages.ts';
import { chat, chatStreamText, post, scripted, startTestGateway } from './harness.ts';

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
