/**
 * Small files (image manifests) kept in memory and checked against the file with one
 * stat per read: a create reads its image's manifest, and reading it each time costs four
 * threadpool round trips (open, fstat, read, close) where a stat costs one.
 *
 * The store directory may be shared by many hosts (daemon/image/layer-store.ts), so a
 * cached text is used only while the file's device, inode, size, mtime and ctime
 * (nanoseconds) are what they were when it was read: writers replace manifests by rename
 * (a new inode; daemon/image/layer-store.ts always does), and an in-place write changes
 * the times (one within the same tick of the filesystem's clock at the same size would
 * not be seen, which is why writers rename). A missing file is never cached.
 * The text, not a parsed value, is kept: each caller parses its own copy, so nothing
 * mutable is shared between calls.
 */
import { readFile, stat } from 'node:fs/promises';
import type { BigIntStats } from 'node:fs';

/** What identifies one version of a file. */
function versionOf(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
}

/** A bounded cache of small files' texts; see the module comment. */
export class FileTextCache {
  private readonly entries = new Map<string, { version: string; text: string }>();
  /** Files read from disk so far (a read the cache answered is not counted). */
  reads = 0;

  /** @param maxEntries most files kept (default 4,096: a few MiB of manifests); the least recently read go first. */
  constructor(private readonly maxEntries = 4096) {}

  /**
   * The text (UTF-8) of the file at `path`, or undefined when it does not exist (ENOENT, ENOTDIR).
   * @throws the fs error of any other failure.
   */
  async read(path: string): Promise<string | undefined> {
    let st: BigIntStats;
    try {
      st = await stat(path, { bigint: true });
    } catch (e) {
      if (isMissing(e)) {
        this.entries.delete(path);
        return undefined;
      }
      throw e;
    }
    const version = versionOf(st);
    const hit = this.entries.get(path);
    if (hit && hit.version === version) {
      // Most recently read last, so eviction takes the coldest.
      this.entries.delete(path);
      this.entries.set(path, hit);
      return hit.text;
    }
    let text: string;
    try {
      text = await readFile(path, 'utf8');
      this.reads++;
    } catch (e) {
      if (isMissing(e)) return undefined;
      throw e;
    }
    // Keyed on the version stat saw: a file replaced between the stat and the read is read again next time.
    this.entries.delete(path);
    this.entries.set(path, { version, text });
    if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
    return text;
  }
}

function isMissing(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR';
}
