import { describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors/index.ts';
import { Cancel, CancelledError } from '../../src/upstream/cancel.ts';

describe('Cancel', () => {
  it('aborts once: the first reason stays and listeners run once, in the order added', () => {
    const c = new Cancel();
    const ran: string[] = [];
    c.onAbort(() => ran.push('a'));
    c.onAbort(() => ran.push('b'));
    expect(c.aborted).toBe(false);
    expect(c.reason).toBeUndefined();
    const cut = new GatewayError('shutting_down', 'The gateway is shutting down.');
    c.abort(cut);
    c.abort(new Error('later'));
    c.abort();
    expect(c.aborted).toBe(true);
    expect(c.reason).toBe(cut);
    expect(ran).toEqual(['a', 'b']);
  });

  it('gives an abort without a reason a CancelledError', () => {
    const c = new Cancel();
    c.abort();
    expect(c.reason).toBeInstanceOf(CancelledError);
    expect((c.reason as Error).name).toBe('AbortError');
  });

  it('never runs a listener removed before the abort, nor one added after it', () => {
    const c = new Cancel();
    const ran: string[] = [];
    const gone = () => ran.push('gone');
    c.onAbort(gone);
    c.onAbort(() => ran.push('kept'));
    c.offAbort(gone);
    c.offAbort(() => {}); // not registered: nothing happens
    c.abort();
    c.onAbort(() => ran.push('late'));
    expect(ran).toEqual(['kept']);
  });

  it('runs every listener present at the abort, even when one removes another', () => {
    const c = new Cancel();
    const ran: string[] = [];
    const second = () => ran.push('second');
    c.onAbort(() => {
      ran.push('first');
      c.offAbort(second);
    });
    c.onAbort(second);
    c.abort();
    expect(ran).toEqual(['first', 'second']);
  });
});
