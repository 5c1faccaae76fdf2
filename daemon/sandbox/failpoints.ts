/**
 * Failpoints: named steps at which dsecd kills itself with SIGKILL, to prove that every
 * step of create and destroy is restart-safe (test/integration/failpoints.test.ts).
 *
 * Set `DSEC_FAILPOINT=<name>` or `<name>:<n>` (die on the n-th hit, default 1). Only
 * names in {@link FAILPOINTS} are accepted, so a typo in a test fails loudly at start.
 */
import { invalidArgument } from '../errors.js';
import { STEPS, type Step, type StepObserver } from '../model/steps.js';

/** Every failpoint: each named step (daemon/model/steps.ts), in the order the steps run. */
export const FAILPOINTS = STEPS;

/** A failpoint name. */
export type Failpoint = Step;

/** Parsed failpoint setting: kill the process at the `hits`-th time `name` is reached. */
export class Failpoints implements StepObserver {
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
