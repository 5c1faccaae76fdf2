/**
 * The sandbox lifecycle state machine: the only place that says which state may follow
 * which. Every state change in dsecd goes through {@link assertTransition}.
 *
 *   creating ──► running ◄──► paused
 *      │           │  ▲          │
 *      ▼           ▼  │          ▼
 *    failed ◄── stopped ◄────────┘
 *   (every state except destroyed ──► destroyed)
 *
 * `failed` means the sandbox's init died without being asked to, or a start failed;
 * it can be started again or destroyed.
 */
import { failedPrecondition } from '../errors.js';
import type { SandboxState } from '../api/schema.js';

/** Allowed transitions: from -> set of targets. */
export const TRANSITIONS: Readonly<Record<SandboxState, readonly SandboxState[]>> = {
  creating: ['running', 'failed', 'destroyed'],
  running: ['paused', 'stopped', 'failed', 'destroyed'],
  paused: ['running', 'stopped', 'failed', 'destroyed'],
  stopped: ['running', 'failed', 'destroyed'],
  failed: ['running', 'stopped', 'destroyed'],
  destroyed: [],
};

/** True when `from -> to` is a legal transition. */
export function canTransition(from: SandboxState, to: SandboxState): boolean {
  return TRANSITIONS[from].includes(to);
}

/**
 * Throws unless `from -> to` is legal.
 * @throws DsecError FailedPrecondition naming the sandbox, its state and the refused target.
 */
export function assertTransition(id: string, from: SandboxState, to: SandboxState): void {
  if (!canTransition(from, to)) {
    throw failedPrecondition(`sandbox ${id} is ${from}; cannot make it ${to}`);
  }
}
