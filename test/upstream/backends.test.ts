// The backend set's membership events: what an operator's alert on a fleet shrunk by
// configuration reads (`removed` with why: reload), apart from the gateway starting and stopping.
import { expect, it } from 'vitest';
import { type BackendEvent, BackendSet } from '../../src/upstream/backends.ts';
import { AttemptFailure } from '../../src/upstream/failure.ts';
import { DEFAULT_BACKEND_SET_OPTIONS } from '../../src/upstream/options.ts';

it('tells each backend added, removed and drained with why: at start, at a reload, at shutdown', async () => {
  const events: BackendEvent[] = [];
  const set = new BackendSet(
    {
      ...DEFAULT_BACKEND_SET_OPTIONS,
      health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: 0 },
      onEvent: (e) => events.push(e),
    },
    [
      { name: 'a', url: 'http://127.0.0.1:9' },
      { name: 'b', url: 'http://127.0.0.1:10' },
    ],
  );
  const membership = () =>
    events
      .splice(0)
      .flatMap((e) =>
        e.type === 'added' || e.type === 'removed' || e.type === 'drained'
          ? [`${e.type} ${e.backend} ${e.why}`]
          : [],
      );
  expect(membership()).toEqual(['added a start', 'added b start']);
  // A reload that drops b and adds c; a's URL is unchanged.
  await set.update([
    { name: 'a', url: 'http://127.0.0.1:9' },
    { name: 'c', url: 'http://127.0.0.1:11' },
  ]);
  // b's drain (nothing ran on it) ends before update() resolves, and is told after its removal.
  expect(membership()).toEqual(['removed b reload', 'added c reload', 'drained b reload']);
  expect(set.retiring()).toEqual([]);
  await set.close();
  expect(membership()).toEqual([
    'removed a shutdown',
    'removed c shutdown',
    'drained a shutdown',
    'drained c shutdown',
  ]);
});

it('leaves a model a backend to serve when an ejection meets an open breaker, in either order', async () => {
  const events: BackendEvent[] = [];
  const make = (resetTimeoutMs = DEFAULT_BACKEND_SET_OPTIONS.breaker.resetTimeoutMs) =>
    new BackendSet(
      {
        ...DEFAULT_BACKEND_SET_OPTIONS,
        health: { ...DEFAULT_BACKEND_SET_OPTIONS.health, intervalMs: 0 },
        breaker: { ...DEFAULT_BACKEND_SET_OPTIONS.breaker, resetTimeoutMs },
        outlier: { ...DEFAULT_BACKEND_SET_OPTIONS.outlier, consecutiveFailures: 5, maxEjectionPercent: 50 },
        onEvent: (e) => events.push(e),
      },
      [
        { name: 'a', url: 'http://127.0.0.1:9' },
        { name: 'b', url: 'http://127.0.0.1:10' },
      ],
    );
  const fail = () => new AttemptFailure('upstream_status', 'upstream status 500', { status: 500 });
  // b's breaker is open (its own failures), then a fails five times in a row: a stays, the one
  // backend left to serve, failing some requests rather than none served.
  const first = make();
  first.get('b')!.breaker.open();
  for (let i = 0; i < 5; i++) first.get('a')!.blame(fail());
  expect(first.get('a')!.state).toBe('healthy');
  expect(
    first
      .list()
      .filter((b) => b.available)
      .map((b) => b.name),
  ).toEqual(['a']);
  await first.close();
  // a ejected first (b serving then), then b's breaker opens: a's ejection ends at once, told.
  events.length = 0;
  const second = make();
  for (let i = 0; i < 5; i++) second.get('a')!.blame(fail());
  expect(second.get('a')!.state).toBe('ejected');
  second.get('b')!.breaker.open();
  expect(second.get('a')!.state).toBe('healthy');
  expect(
    second
      .list()
      .filter((b) => b.available)
      .map((b) => b.name),
  ).toEqual(['a']);
  expect(
    events.filter((e) => e.type === 'ejected' || e.type === 'unejected' || e.type === 'breaker_open'),
  ).toEqual([
    { type: 'ejected', backend: 'a', durationMs: DEFAULT_BACKEND_SET_OPTIONS.outlier.baseEjectionMs },
    { type: 'breaker_open', backend: 'b' },
    { type: 'unejected', backend: 'a' },
  ]);
  await second.close();
  // b's breaker half-open (one trial at a time) is not b serving either: a is not ejected.
  const third = make(5);
  const halfOpen = new Promise<void>((resolve) => third.get('b')!.breaker.once('halfOpen', () => resolve()));
  third.get('b')!.breaker.open();
  await halfOpen;
  for (let i = 0; i < 5; i++) third.get('a')!.blame(fail());
  expect(third.get('a')!.state).toBe('healthy');
  await third.close();
});
