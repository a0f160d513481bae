// Waiting on the gateway's own stage marks (src/telemetry/stages.ts) in a test that runs the
// gateway in its process: the event that a request reached a stage, rather than a sleep.
import { channel } from 'node:diagnostics_channel';
import { STAGE_CHANNEL, type Stage, type StageMark } from '../../src/telemetry/stages.ts';

/** Resolves when request `reqId` reaches `stage`. Call it before the request is sent. */
export function stageReached(reqId: string, stage: Stage): Promise<void> {
  const stages = channel(STAGE_CHANNEL);
  return new Promise((resolve) => {
    const seen = (m: unknown) => {
      const mark = m as StageMark;
      if (mark.reqId !== reqId || mark.stage !== stage) return;
      stages.unsubscribe(seen);
      resolve();
    };
    stages.subscribe(seen);
  });
}
