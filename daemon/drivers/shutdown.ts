/**
 * What the drivers share about shutting down: once a driver's close() ran, no new
 * connection to a sandbox (agent socket, QMP, VM endpoint) may be made or kept. A
 * connection that completes after close() would hold a socket open and keep dsecd's
 * event loop alive, so a SIGTERM during a burst would never end the process.
 */
import { unavailable, type DsecError } from '../errors.js';

/** The error of an operation refused because its driver was closed: Unavailable. */
export function shuttingDown(): DsecError {
  return unavailable('dsecd is shutting down');
}

/**
 * `connecting`, unless the driver closed while it was under way: a connection that
 * completes once `closed()` is true is closed at once and the promise rejects.
 * @throws DsecError Unavailable ({@link shuttingDown}) when the driver closed first;
 *   otherwise whatever `connecting` rejects with.
 */
export function refuseAfterClose<C extends { close(): void }>(closed: () => boolean, connecting: Promise<C>): Promise<C> {
  return connecting.then((c) => {
    if (closed()) {
      c.close();
      throw shuttingDown();
    }
    return c;
  });
}
