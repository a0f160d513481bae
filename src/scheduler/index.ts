// The scheduler's public surface (see README.md): one queue, late dispatch, closed-loop limits.
export type { ControlSignals, LimitBounds, Setpoints } from './controller.ts';
export type {
  BackendSchedule,
  Grant,
  SchedulerDeps,
  SchedulerSettings,
  SchedulerView,
} from './scheduler.ts';
export { retired, Scheduler, Ticket } from './scheduler.ts';
export { type BackendPrediction, budgetWords, type ScheduledRequest } from './types.ts';
