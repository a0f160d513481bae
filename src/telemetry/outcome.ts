// The small fixed set of ways a request ends. Every request gets exactly one, and the admission
// log, the metrics and the live windows all read it from here.
export const OUTCOMES = [
  'ok',
  'refused',
  'failed_before_commit',
  'failed_after_commit',
  'client_cancelled',
  'timeout',
] as const;

export type Outcome = (typeof OUTCOMES)[number];
