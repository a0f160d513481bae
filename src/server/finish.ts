// The end of a proxied request: its one admission record (why it went where it went, or why it
// was refused while it waited), and what the request teaches the live state, the scheduler's
// outer loop and the predictor's error. Only whole measurements teach here: a completed request's
// TTFT and TPOT (the windows, the TPOT fit), never a failure's or a cancel's. The TTFT fit learned
// the request's first token when it was relayed (the scheduler's firstToken), a generation earlier.
import { type Admitted, type Prediction, runnerUp } from '../admission/index.ts';
import { retired, type Ticket } from '../scheduler/index.ts';
import type { AdmissionFields, RequestRecord } from '../telemetry/admission-log.ts';
import { endedByClient, type ProxyResult } from '../upstream/index.ts';
import type { Served } from './intake.ts';
import { endRecord } from './record.ts';
import type { Runtime } from './runtime.ts';

/** Upstream messages (e.g. vLLM's 400 text) in the log are cut short: they may quote input. */
const MAX_ERROR_CHARS = 200;

function truncate(text: string | null): string | null {
  return text === null || text.length <= MAX_ERROR_CHARS ? text : `${text.slice(0, MAX_ERROR_CHARS)}…`;
}

/**
 * The prediction fields of a record: for the backend that served (or, with none, the best one)
 * and for the runner-up. A backend that served without a prediction (it was unavailable when the
 * request was admitted) has no runner-up either: the best of the others was not second to it.
 */
export function predictionFields(p: Prediction, backend: string | null): AdmissionFields {
  const chosen = backend === null ? p.best : (p.byBackend.get(backend) ?? null);
  const second = backend !== null && chosen === null ? null : runnerUp(p, chosen?.backend ?? null);
  return {
    predicted_ttft_ms: chosen?.totalMs ?? null,
    runner_up: second?.backend ?? null,
    runner_up_predicted_ttft_ms: second?.totalMs ?? null,
  };
}

/** What the last failed attempt's failure says, when the request ended on one. */
function lastDetail(result: ProxyResult): string | null {
  const last = result.attemptLog.at(-1);
  return last !== undefined && last.kind === 'failed' ? last.detail : null;
}

/** The cached share of the prompt, rounded to a thousandth. */
function hitShare(hit: number | null): number | null {
  return hit === null ? null : Math.round(hit * 1000) / 1000;
}

export function finishProxied(
  rt: Runtime,
  record: RequestRecord,
  got: Served,
  admitted: Admitted,
  ticket: Ticket,
  result: ProxyResult,
): void {
  const refused = result.outcome === 'refused';
  // A seed that was served says so: sent where it was predicted late, on purpose (Scheduler.seedFor).
  const reason: string = result.errorCode ?? result.reason ?? (ticket.lastGrant?.seed ? 'seed' : 'ok');
  let error: string | null = null;
  if (result.refusal !== null) error = result.refusal.message;
  // A client that left is no failure to detail (one that stopped reading is: the gateway cut it).
  else if (result.outcome !== 'ok' && result.reason !== 'client_cancelled')
    error =
      result.reason === 'cut'
        ? 'cut at the end of the shutdown grace period'
        : truncate(result.upstreamMessage ?? lastDetail(result) ?? result.reason);
  const fields: AdmissionFields = {
    decision: refused ? 'refused' : 'admitted',
    reason,
    backend: result.backend,
    attempts: result.attempts,
    ...predictionFields(admitted.prediction, result.backend),
    // The attempts that failed: not one its client ended (it left, or stopped reading), which says
    // nothing of its backend.
    failed_attempts: result.attemptLog
      .filter((a) => a.kind === 'failed' && a.reason !== null && !endedByClient(a.reason))
      .map((a) => ({
        backend: a.backend,
        reason: a.reason as string,
        status: a.status,
        detail: truncate(a.detail),
      })),
    prefix_hit_est: hitShare(ticket.lastGrant?.prefixHit ?? null),
    queue_ms: result.queueMs,
    ttft_ms: result.ttftMs,
    tpot_ms: result.tpotMs,
    e2e_ms: result.e2eMs,
    prompt_tokens: result.promptTokens,
    completion_tokens: result.completionTokens,
    error,
  };
  if (rt.admissionLog.withCandidates && ticket.lastGrant !== null) {
    fields.candidates = ticket.lastGrant.candidates.map((c) => ({
      backend: c.backend,
      cost: c.cost,
      ...c.terms,
    }));
  }
  const written = endRecord(
    rt,
    record,
    result.outcome,
    fields,
    result.itlMs,
    result.clientError,
    got.mode !== 'passthrough',
  );
  // What the backend counted for the prompt the gateway rendered: the chars-per-token estimate.
  // Not a prompt the backend cut (truncate_prompt_tokens): it counted less than was rendered.
  if (result.promptTokens !== null && got.countsRendered) {
    rt.tokens.learn(got.identity.tenant, got.prompt, result.promptTokens);
  }
  // What a whole completion decoded, per sequence: what the router expects the next to take.
  if (result.outcome === 'ok' && result.completionTokens !== null) {
    rt.tokens.learnOutput(got.identity.tenant, result.completionTokens / got.sequences);
  }
  if (result.outcome !== 'ok' || result.backend === null || result.ttftMs === null) return;

  const cls = got.identity.class;
  const grant = ticket.lastGrant;
  // Served by a server a reload took away (removed, or its name given another URL): nothing in the
  // live state or the controller is about it any more.
  if (grant !== null && retired(grant)) return;
  // Its first token taught the TTFT fit when it came (the scheduler's firstToken). A TPOT the
  // client's slow reading stretched (the relay paused the backend for it) is the client's pace,
  // not the backend's: it teaches neither the backend's windows and fit nor its concurrency limit
  // (the record keeps it: it is what the client saw). Nor does a TPOT of tokens all read at once.
  const backendTpotMs = result.clientPaced || result.decodeUnseen ? null : result.tpotMs;
  rt.live.record({
    backend: result.backend,
    class: cls,
    queueMs: result.queueMs,
    ttftMs: result.ttftMs,
    tpotMs: backendTpotMs,
    promptTokens: result.promptTokens ?? got.promptTokens,
    completionTokens: result.completionTokens ?? 0,
    loadAtDispatch: grant?.loadAtDispatch ?? 0,
  });
  if (backendTpotMs !== null) ticket.completed(result.backend, backendTpotMs);
  // A retried request's first token came after a failed attempt's time, which no prediction
  // covers: not the predictor's error.
  const predicted = result.attempts === 1 ? (written?.predicted_ttft_ms ?? null) : null;
  rt.admission.observe(predicted, result.ttftMs);
  if (predicted !== null && result.ttftMs > 0) {
    rt.metrics.observePredictionError(cls, Math.abs(predicted - result.ttftMs) / result.ttftMs);
  }
}
