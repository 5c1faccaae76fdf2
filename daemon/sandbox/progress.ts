/**
 * Progress of a sandbox create (POST /v1/sandboxes, restore and fork), for clients that
 * asked for it (`Accept: application/x-ndjson`: `dsec create` shows it as a spinner). A
 * create goes through the phases below in order; each is reported once, when it begins,
 * with the sandbox's id. Boundaries are the create failpoints every driver marks
 * (daemon/sandbox/failpoints.ts), so all backends report the same phases.
 */
import type { Failpoint } from './failpoints.js';

/**
 * A create's phases: `rootfs` (image layers and the writable layer or disk), `launch`
 * (the runtime or QEMU starting), `boot` (waiting for the agent: a VM's guest boots here,
 * the slow part of microvm and vm creates), `ready` (running, about to be answered).
 */
export const CREATE_PHASES = ['rootfs', 'launch', 'boot', 'ready'] as const;
/** One of {@link CREATE_PHASES}. */
export type CreatePhase = (typeof CREATE_PHASES)[number];

/** One progress report of a create. */
export interface CreateProgress {
  phase: CreatePhase;
  /** The sandbox being made (16 hex characters). */
  id: string;
  /** The phase in words, for the backend at hand. */
  message: string;
}

/** Called once per phase of a create, in order; must not throw. */
export type CreateProgressSink = (p: CreateProgress) => void;

/** The phase that begins at each create failpoint. */
const PHASE_AT: Partial<Record<Failpoint, CreatePhase>> = {
  'create.after-intent': 'rootfs',
  'create.after-rootfs': 'launch',
  'create.after-runtime': 'boot',
  'create.after-ack': 'ready',
};

/**
 * A phase in words for a sandbox isolated as `isolation` (its backend's capability: a
 * container, or a VM with disks, QEMU and a guest boot); `restoring` a machine snapshot
 * loads its state instead of booting.
 */
export function phaseMessage(phase: CreatePhase, isolation: 'container' | 'vm', restoring: boolean): string {
  const vm = isolation === 'vm';
  switch (phase) {
    case 'rootfs':
      return vm ? 'preparing the disks' : 'mounting the root filesystem';
    case 'launch':
      return vm ? 'starting QEMU' : 'starting the container';
    case 'boot':
      if (!vm) return 'waiting for the agent';
      return restoring ? 'loading the machine state' : 'booting the guest (waiting for its agent)';
    case 'ready':
      return 'running';
  }
}

/**
 * The failpoint observer that reports the create of `id` to `sink`: each phase once,
 * in order (a step reached twice, or out of order, reports nothing new).
 */
export function createObserver(id: string, isolation: 'container' | 'vm', restoring: boolean, sink: CreateProgressSink): (step: Failpoint) => void {
  let last = -1;
  return (step) => {
    const phase = PHASE_AT[step];
    if (!phase) return;
    const i = CREATE_PHASES.indexOf(phase);
    if (i <= last) return;
    last = i;
    sink({ phase, id, message: phaseMessage(phase, isolation, restoring) });
  };
}
