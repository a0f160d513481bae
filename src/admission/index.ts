// The admission controller's public surface (see README.md).
export type {
  AdmissionDeps,
  AdmissionRequest,
  Admitted,
  PredictionErrorView,
  TenantLimits,
} from './admission.ts';
export { AdmissionController, Refusal, SHED_WINDOW_MS } from './admission.ts';
export type { Prediction } from './predict.ts';
export { runnerUp } from './predict.ts';
