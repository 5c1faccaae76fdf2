/**
 * Uploads that fail midway: the rest of the request body is read and dropped before the
 * error is answered, so a client still sending sees the error rather than a reset
 * connection. Used by the files routes (daemon/api/routes/files.ts) and E2B's envd
 * uploads (daemon/api/e2b/envd.ts).
 */
import type { Readable } from 'node:stream';

/** Most request body read and discarded after a failed upload: 64 MiB (past it the connection is cut; a client sending more is not waited for). */
export const DRAIN_LIMIT = 64 * 1024 * 1024;

/**
 * Runs `fn` (an upload reading `body`); when it throws, reads and discards what is left of
 * `body` (up to {@link DRAIN_LIMIT} bytes, then destroys it) and rethrows.
 * @throws whatever `fn` throws.
 */
export async function drainOnFailure<T>(body: Readable, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (!body.readableEnded && !body.destroyed) {
      let n = 0;
      body.resume();
      await new Promise<void>((resolve) => {
        body.on('data', (c: Buffer) => {
          n += c.length;
          if (n > DRAIN_LIMIT) {
            body.destroy();
            resolve();
          }
        });
        body.once('end', () => resolve());
        body.once('close', () => resolve());
        body.once('error', () => resolve());
      });
    }
    throw e;
  }
}
