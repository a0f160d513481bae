// Ending a request's admission record and counting it in the metrics are one step, so no path can
// write a record the metrics miss, or count a request twice (RequestRecord.end writes once and
// returns null after that).

import type { GatewayError } from '../errors/index.ts';
import type { AdmissionFields, AdmissionRecord, RequestRecord } from '../telemetry/admission-log.ts';
import type { Outcome } from '../telemetry/outcome.ts';
import type { Runtime } from './runtime.ts';

export function endRecord(
  rt: Pick<Runtime, 'metrics'>,
  record: RequestRecord,
  outcome: Outcome,
  fields: AdmissionFields,
  itlMs?: ArrayLike<number>,
  clientError = false,
  ttftObservable = true,
): AdmissionRecord | null {
  const written = record.end(outcome, fields, clientError, ttftObservable);
  if (written !== null) rt.metrics.observeRequest(written, itlMs);
  return written;
}

/** A request the gateway answered itself with `err`. */
export function endRefused(
  rt: Pick<Runtime, 'metrics'>,
  record: RequestRecord,
  err: GatewayError,
): AdmissionRecord | null {
  return endRecord(rt, record, 'refused', { decision: 'refused', reason: err.code, error: err.message });
}
