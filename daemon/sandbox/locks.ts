/**
 * Per-sandbox serialisation: create, stop, start, destroy, pause, resume, snapshot,
 * commit, network changes and the handling of a dead init never interleave on one
 * sandbox. One instance is shared by every lifecycle service of a dsecd.
 */

/** A mutex per key (a sandbox id): holders of one key run one after another, in call order. */
export class SandboxLocks {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Runs `fn` after every earlier holder of `key` finished (whether it succeeded or not). */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.catch(() => {}).then(fn);
    this.tails.set(key, next);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === next) this.tails.delete(key);
    }
  }
}
