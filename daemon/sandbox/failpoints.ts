/**
 * Failpoints: named steps at which dsecd kills itself with SIGKILL, to prove that every
 * step of create and destroy is restart-safe (test/integration/failpoints.test.ts).
 *
 * Set `DSEC_FAILPOINT=<name>` or `<name>:<n>` (die on the n-th hit, default 1). Only
 * names in {@link FAILPOINTS} are accepted, so a typo in a test fails loudly at start.
 */
import { invalidArgument } from '../errors.js';

/** Every failpoint, in the order the steps run. */
export const FAILPOINTS = [
  'create.after-intent', // row (state creating) and uid range committed
  'create.after-layers', // image layers mounted
  'create.after-rootfs', // idmapped lowers + overlay mounted
  'create.after-bundle', // OCI spec written, agent socket bound
  'create.after-runtime', // runtime started the container (init running)
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
  'start.after-rootfs', // overlay mounted, the layer's quota still lifted for the mount (UpperStore.withRoomToMount)
  'start.after-runtime',
  'image.after-blob', // an imported layer's blob published, before its manifest
  'trajectory.before-record', // a trajectory step's command ended, before its result is recorded
  'snapshot.after-layer', // a snapshot's layer (or a machine snapshot's files) stored, before its row
  'fork.after-create', // one sandbox of a fork created (acknowledged), before the fork commits
] as const;

/** A failpoint name. */
export type Failpoint = (typeof FAILPOINTS)[number];

/** Parsed failpoint setting: kill the process at the `hits`-th time `name` is reached. */
export class Failpoints {
  private readonly name: Failpoint | null;
  private remaining: number;

  /**
   * @param spec `name` or `name:n`, or undefined for none.
   * @throws DsecError InvalidArgument for an unknown name or a bad count.
   */
  constructor(spec: string | undefined) {
    if (!spec) {
      this.name = null;
      this.remaining = 0;
      return;
    }
    const [name, n] = spec.split(':');
    if (!(FAILPOINTS as readonly string[]).includes(name)) {
      throw invalidArgument(`DSEC_FAILPOINT: unknown failpoint ${name}; known: ${FAILPOINTS.join(', ')}`);
    }
    const hits = n === undefined ? 1 : Number(n);
    if (!Number.isInteger(hits) || hits < 1) throw invalidArgument(`DSEC_FAILPOINT: bad hit count ${n}`);
    this.name = name as Failpoint;
    this.remaining = hits;
  }

  /** The armed failpoint, or null. */
  get armed(): Failpoint | null {
    return this.name;
  }

  /**
   * A view of these failpoints that also tells `onStep` each step reached, after the
   * failpoint itself (the armed one never returns). The armed name and its count are
   * shared with this object. Used to report a create's progress (daemon/sandbox/progress.ts):
   * the create steps above are the phase boundaries every driver already marks.
   */
  observed(onStep: (name: Failpoint) => void): Failpoints {
    const view = Object.create(this) as Failpoints;
    view.hit = (name: Failpoint) => {
      this.hit(name);
      onStep(name);
    };
    return view;
  }

  /** Marks that step `name` was reached; SIGKILLs this process when it is the armed one. */
  hit(name: Failpoint): void {
    if (name !== this.name) return;
    this.remaining -= 1;
    if (this.remaining === 0) {
      process.stderr.write(`dsecd: failpoint ${name} reached; killing self\n`);
      process.kill(process.pid, 'SIGKILL');
    }
  }
}
