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

/** Every lifecycle state, in the order the API lists them. */
export const SANDBOX_STATES = ['creating', 'running', 'paused', 'stopped', 'failed', 'destroyed'] as const;

/** One of {@link SANDBOX_STATES}. */
export type SandboxState = (typeof SANDBOX_STATES)[number];

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

/**
 * Throws unless the sandbox is running: what an exec, a file operation or an agent
 * request needs (a paused sandbox's processes are frozen).
 * @throws DsecError FailedPrecondition naming the state and the command that fixes it.
 */
export function assertRunning(sb: { id: string; state: SandboxState }): void {
  if (sb.state === 'paused') throw failedPrecondition(`sandbox ${sb.id} is paused; exec needs a running sandbox (resume it with \`dsec resume ${sb.id}\`)`);
  if (sb.state !== 'running') throw failedPrecondition(`sandbox ${sb.id} is ${sb.state}; exec needs a running sandbox (start it with \`dsec start ${sb.id}\`)`);
}
