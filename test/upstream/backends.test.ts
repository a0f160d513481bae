// The backend set's membership events: what an operator's alert on a fleet shrunk by
// configuration reads (`removed` with why: reload), apart from the gateway starting and stopping.
import { expect, it } from 'vitest';
import { type BackendEvent, BackendSet } from '../../src/upstream/backends.ts';
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
