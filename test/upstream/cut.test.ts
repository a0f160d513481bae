// The caller's cut (shutdown): a signal aborted with a GatewayError tells the client that error,
// before the commit point as the response, after it as one SSE error event and [DONE], and
// always aborts the upstream at once. Any other abort stays a client disconnect.
import http from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors/index.ts';
import type { BackendSet } from '../../src/upstream/backends.ts';
import { Cancel } from '../../src/upstream/cancel.ts';
import { openStream } from '../helpers/http.ts';
import { LoopLag } from '../helpers/loop-lag.ts';
import {
  chatBody,
  closedWithin,
  dataEvents,
  FAST,
  type Gateway,
  gateway,
  hang,
  makeSet,
  post,
  roleChunk,
  type Script,
  sleep,
  sseHead,
  tokenChunk,
  type Upstream,
  upstream,
} from './helpers.ts';

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const CFG = { ...FAST, firstTokenTimeoutMs: 5_000, idleTimeoutMs: 5_000 };

async function setup(
  script: Script,
): Promise<{ up: Upstream; set: BackendSet; gw: Gateway; shutdown: Cancel }> {
  const up = await upstream(script);
  const set = makeSet([up.url]);
  const shutdown = new Cancel();
  const gw = await gateway({ set, cfg: CFG, signal: shutdown });
  cleanups.push(up.close, () => set.close(), gw.close);
  return { up, set, gw, shutdown };
}

const shuttingDown = () => new GatewayError('shutting_down', 'The gateway is shutting down.');

/** Tokens every 20 ms until the gateway lets go. */
const endless: Script = async (_req, res) => {
  sseHead(res);
  res.write(roleChunk());
  for (let i = 0; !res.destroyed && i < 1000; i++) {
    await sleep(20);
    res.write(tokenChunk(`t${i}`));
  }
};

describe('cut after the commit point', () => {
  it('ends the stream with the cut error event and [DONE], cleanly, and closes the upstream', async () => {
    const { up, set, gw, shutdown } = await setup(endless);
    const client = await openStream(gw.url, '/v1/chat/completions', chatBody()).response;
    // The role chunk and two tokens relayed before the cut.
    await client.until((text) => text.includes('"t1"'));
    const lag = LoopLag.start();
    const cutAt = performance.now();
    shutdown.abort(shuttingDown());
    const { complete } = await client.ended;
    const result = await gw.nextResult();
    const closedAt = await closedWithin(up.hits[0]!);
    const stalledMs = lag.stop();

    expect(client.status).toBe(200);
    expect(complete).toBe(true);
    const events = dataEvents(client.received());
    expect(events.at(-1)).toBe('[DONE]');
    expect(JSON.parse(events.at(-2)!)).toEqual(shuttingDown().toJSON());
    expect(events.filter((e) => e.includes('"error"'))).toHaveLength(1);
    expect(events.length).toBeGreaterThan(3); // role chunk and tokens came before the cut
    expect(result).toMatchObject({
      outcome: 'failed_after_commit',
      reason: 'cut',
      errorCode: 'shutting_down',
      committed: true,
      status: 200,
    });
    expect(result.ttftMs).not.toBeNull();
    expect(closedAt).not.toBeNull();
    expect(closedAt! - cutAt).toBeLessThan(100 + stalledMs);
    // A cut is not the backend's fault.
    expect(set.get('b0')!.outlier.consecutiveFailures).toBe(0);
    expect(set.get('b0')!.breaker.stats.failures).toBe(0);
  });
});

describe('cut before the commit point', () => {
  it('answers with the cut error, its status and Retry-After, and closes the upstream', async () => {
    const { up, set, gw, shutdown } = await setup(hang());
    const pending = post(gw.url, chatBody());
    await up.arrived(0);
    const lag = LoopLag.start();
    const cutAt = performance.now();
    shutdown.abort(shuttingDown());
    const res = await pending;
    const answeredMs = performance.now() - cutAt;
    const result = await gw.nextResult();
    const closedAt = await closedWithin(up.hits[0]!);
    const stalledMs = lag.stop();

    expect(res.status).toBe(503);
    expect(res.headers['retry-after']).toBe('5');
    expect(res.headers['x-request-id']).toBe('req-1');
    expect(JSON.parse(res.text)).toEqual(shuttingDown().toJSON());
    // The 5 s first-token timeout did not decide it.
    expect(answeredMs).toBeLessThan(1_000);
    expect(result).toMatchObject({
      outcome: 'failed_before_commit',
      reason: 'cut',
      errorCode: 'shutting_down',
      committed: false,
      status: 503,
      attempts: 1,
      ttftMs: null,
    });
    expect(up.hits).toHaveLength(1);
    expect(closedAt).not.toBeNull();
    expect(closedAt! - cutAt).toBeLessThan(100 + stalledMs);
    const b = set.get('b0')!;
    expect(b.outlier.consecutiveFailures).toBe(0);
    expect(b.breaker.stats.failures).toBe(0);
    expect(gw.active()).toBe(0);
  });

  it('a request arriving after the cut gets the error without reaching a backend', async () => {
    const { up, gw, shutdown } = await setup(hang());
    shutdown.abort(shuttingDown());
    const res = await post(gw.url, chatBody());
    expect(res.status).toBe(503);
    expect(JSON.parse(res.text).error.code).toBe('shutting_down');
    expect(await gw.nextResult()).toMatchObject({ outcome: 'failed_before_commit', attempts: 0 });
    expect(up.hits).toHaveLength(0);
  });
});

describe('an abort without a GatewayError reason', () => {
  it('is a client disconnect: the stream is reset, outcome client_cancelled', async () => {
    const { up, gw, shutdown } = await setup(endless);
    const client = await openStream(gw.url, '/v1/chat/completions', chatBody()).response;
    await client.until((text) => text.includes('"t0"'));
    const lag = LoopLag.start();
    const cutAt = performance.now();
    shutdown.abort(new Error('shutdown grace period over'));
    const { complete } = await client.ended;
    const result = await gw.nextResult();
    const closedAt = await closedWithin(up.hits[0]!);
    const stalledMs = lag.stop();
    expect(complete).toBe(false);
    expect(client.received()).not.toContain('"error"');
    expect(result).toMatchObject({
      outcome: 'client_cancelled',
      reason: 'client_cancelled',
      errorCode: null,
      committed: true,
    });
    expect(closedAt).not.toBeNull();
    expect(closedAt! - cutAt).toBeLessThan(100 + stalledMs);
  });

  it('before the first token writes nothing: client_cancelled with no status', async () => {
    const { up, gw, shutdown } = await setup(hang());
    let responded = false;
    const req = http.request(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      agent: false,
    });
    req.on('error', () => {});
    req.on('response', () => {
      responded = true;
    });
    req.end(JSON.stringify(chatBody()));
    await up.arrived(0);
    shutdown.abort();
    const result = await gw.nextResult();
    // What is checked is that nothing comes: a response head would follow the record within a
    // few milliseconds, so 50 ms without one is the bounded window it is judged over.
    await sleep(50);
    req.destroy();
    expect(responded).toBe(false);
    expect(result).toMatchObject({ outcome: 'client_cancelled', status: null, errorCode: null });
  });
});
