/**
 * Named steps of dsecd's operations. Each is a point where an operation has durably
 * done part of its work; a crash between two steps is what reconcile repairs. The
 * failpoints (daemon/sandbox/failpoints.ts) kill dsecd at a chosen one to prove that, and
 * a create's progress report (daemon/sandbox/progress.ts) is told each as it is reached.
 */

/** Every step, in the order the operations reach them. */
export const STEPS = [
  'create.after-intent', // row (state creating) and uid range committed
  'create.after-layers', // image layers mounted
  'create.after-rootfs', // idmapped lowers + overlay mounted (a VM: its disks made)
  'create.after-bundle', // OCI spec written, agent socket bound (a VM: QEMU spawned)
  'create.after-runtime', // runtime started the container (init running; a VM: QMP answers)
  'create.after-agent', // agent answered HELLO
  'create.after-ack', // state running committed, before the HTTP response
  'destroy.after-intent', // desired=destroyed committed
  'destroy.after-kill', // container processes killed
  'destroy.after-runtime', // runtime state deleted
  'destroy.after-rootfs', // overlay and lowers unmounted
  'destroy.after-cgroup', // cgroups removed
  'destroy.after-dir', // sandbox dir removed, before the row is deleted
  'stop.after-intent',
  'stop.after-kill',
  'start.after-intent',
  'start.after-rootfs', // overlay mounted, the layer's quota still lifted for the mount (WritableLayerStore.withRoomToMount)
  'start.after-runtime',
  'image.after-blob', // an imported layer's blob published, before its manifest
  'trajectory.before-record', // a trajectory step's command ended, before its result is recorded
  'snapshot.after-layer', // a snapshot's layer (or a machine snapshot's files) stored, before its row
  'fork.after-create', // one sandbox of a fork created (acknowledged), before the fork commits
] as const;

/** One of {@link STEPS}. */
export type Step = (typeof STEPS)[number];

/**
 * Told each step an operation reaches, in order. A driver reports its create, start,
 * stop and destroy steps through one, and knows nothing else of who listens.
 */
export interface StepObserver {
  /** Step `name` was reached. Must not throw; may end the process (an armed failpoint). */
  hit(name: Step): void;
}

/** An observer that listens to nothing (reconcile's cleanups, tests). */
export const NO_STEPS: StepObserver = Object.freeze({ hit() {} });
