// Where a request's time goes inside the gateway: each stage boundary of the request path is
// published on one node:diagnostics_channel, `slagate:request:stage`, as { reqId, stage, at }
// (`at` is performance.now()). A probe in the same process subscribes to it (scripts/stages.ts
// preloads one); with no subscriber a mark costs one property read and builds nothing.
//
// The stages, in the order a streamed request passes them (docs/benchmarks.md reads them):
//
//   received    the admission record is begun (the front door, server/front.ts)
//   parsed      the body is read and parsed; the handler starts
//   admitted    intake and admission passed; the request goes to the proxy
//   granted     the scheduler granted the attempt a slot
//   dispatched  the attempt hands the request to undici (undici's own channels take it from there)
//   committed   the first token arrived (the commit point); a streamed response's head is
//               written, and Node writes it with the first token at the end of the tick
//
// Invariant: a mark never changes what the request does; it only reads the clock when somebody
// listens.
import { channel } from 'node:diagnostics_channel';

export type Stage = 'received' | 'parsed' | 'admitted' | 'granted' | 'dispatched' | 'committed';

export interface StageMark {
  reqId: string;
  stage: Stage;
  at: number;
}

export const STAGE_CHANNEL = 'slagate:request:stage';

const stages = channel(STAGE_CHANNEL);

export function markStage(reqId: string, stage: Stage): void {
  if (stages.hasSubscribers) stages.publish({ reqId, stage, at: performance.now() } satisfies StageMark);
}
