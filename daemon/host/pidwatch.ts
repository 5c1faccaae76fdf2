/**
 * Noticing that a process exited when it happens, without polling: a pidfd per watched
 * process on the native addon's epoll thread (native/addon/spawn.c, pidWatch). dsecd
 * watches every running sandbox's init this way, so an init killed from outside is
 * noticed at once, and the reaper no longer reads /proc/<pid>/stat of every sandbox every
 * second (that sweep cost dsecd 20% of a core at 1,000 idle sandboxes here, and grew
 * with their number).
 */
import { addonModule } from './native.js';
import { procStartTime } from './proc.js';

/** The addon's raw functions. */
interface WatchAddon {
  pidWatch(pid: number): [Promise<true>, unknown] | null;
  pidUnwatch(handle: unknown): boolean;
}

/** A watch started by {@link watchExit}. */
export interface ExitWatch {
  /** Stops watching; `onExit` is not called afterwards. Safe to call twice. */
  cancel(): void;
}

/**
 * Calls `onExit` once the process `pid` whose start time (field 22 of /proc/PID/stat,
 * daemon/host/proc.ts) is `startTime` has exited (it is then a zombie or gone; nothing is
 * reaped). The start time pins the process: the pidfd is checked against it right after it
 * is opened, so a reused pid is never watched in its place.
 * @returns the watch, or null when that process is not running now (then `onExit` is not called).
 * @throws DsecError FailedPrecondition when the native addon is not built; Error (errno
 *   code) from pidfd_open for anything but a missing process (EMFILE, ...).
 */
export function watchExit(pid: number, startTime: number, onExit: () => void): ExitWatch | null {
  const a = addonModule() as unknown as WatchAddon;
  const w = a.pidWatch(pid);
  if (!w) return null;
  const [exited, handle] = w;
  let live = true;
  const cancel = () => {
    if (!live) return;
    live = false;
    a.pidUnwatch(handle);
  };
  // The pidfd names whatever process had `pid` when it was opened: the one meant, if its
  // start time still matches now.
  if (procStartTime(pid) !== startTime) {
    cancel();
    return null;
  }
  void exited.then(() => {
    if (!live) return;
    live = false;
    onExit();
  });
  return { cancel };
}
