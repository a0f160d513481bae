// The queue of a finished request's bookkeeping: once each, in order, on its timer or on settle().
import { describe, expect, it } from 'vitest';
import { Afterwork } from '../../src/server/afterwork.ts';

describe('Afterwork', () => {
  it('runs nothing at once; its timer runs every job, once, in order', async () => {
    const ran: number[] = [];
    const work = new Afterwork((err) => {
      throw err;
    });
    const done = new Promise<void>((resolve) => {
      work.defer(() => ran.push(1));
      work.defer(() => ran.push(2));
      work.defer(() => {
        ran.push(3);
        resolve();
      });
    });
    expect(ran).toEqual([]);
    expect(work.pending).toBe(3);
    await done;
    expect(ran).toEqual([1, 2, 3]);
    expect(work.pending).toBe(0);
    work.settle();
    expect(ran).toEqual([1, 2, 3]);
  });

  it('settle() runs what is queued now, jobs queued by those jobs included, and the timer then finds nothing', async () => {
    const ran: string[] = [];
    const work = new Afterwork((err) => {
      throw err;
    });
    work.defer(() => {
      ran.push('a');
      work.defer(() => ran.push('c'));
    });
    work.defer(() => ran.push('b'));
    work.settle();
    expect(ran).toEqual(['a', 'b', 'c']);
    // A job queued after a settle gets a timer of its own.
    await new Promise<void>((resolve) => work.defer(resolve));
    expect(ran).toEqual(['a', 'b', 'c']);
  });

  it('a job that throws is reported and the ones after it still run', () => {
    const errors: unknown[] = [];
    const ran: number[] = [];
    const work = new Afterwork((err) => errors.push(err));
    work.defer(() => ran.push(1));
    work.defer(() => {
      throw new Error('bug in a job');
    });
    work.defer(() => ran.push(3));
    work.settle();
    expect(ran).toEqual([1, 3]);
    expect(errors).toHaveLength(1);
    expect((errors[0] as Error).message).toBe('bug in a job');
  });
});
