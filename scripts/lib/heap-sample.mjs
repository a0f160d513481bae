// Preloaded into a gateway (NODE_OPTIONS="--import <this file>", SLAGATE_HEAP_OUT=<file>) by
// scripts/alloc-ab.ts: V8's sampling heap profiler, counting every allocation whether or not a GC
// has collected it since (what a request makes, not what it keeps). The first SIGUSR2 starts the
// sampling and writes SLAGATE_HEAP_OUT.started; the second stops it and writes the profile to
// SLAGATE_HEAP_OUT (the files tell the load generator, whatever became of this process's stderr).
// An inspector session of the process itself answers synchronously, so the handler needs no await.
import { renameSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';

const out = process.env.SLAGATE_HEAP_OUT;
if (out) {
  const session = new Session();
  session.connect();
  let sampling = false;
  process.on('SIGUSR2', () => {
    if (!sampling) {
      session.post('HeapProfiler.startSampling', {
        samplingInterval: 1024,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: true,
      });
      sampling = true;
      writeFileSync(`${out}.started`, '');
      return;
    }
    session.post('HeapProfiler.stopSampling', (err, res) => {
      sampling = false;
      // An empty profile says it failed: the load generator is waiting for the file either way.
      // Written whole under another name first: the file's appearance is the signal.
      writeFileSync(`${out}.tmp`, err ? '' : JSON.stringify(res.profile));
      renameSync(`${out}.tmp`, out);
      if (err) process.stderr.write(`heap sampling failed: ${err.message}\n`);
    });
  });
}
