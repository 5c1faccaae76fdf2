/**
 * envd's `filesystem.Filesystem` service over the sandbox agent's file operations
 * (daemon/agent/client.ts), as the request's user (E2B's `user`, else the default):
 * Stat, MakeDir (with parents; AlreadyExists when it exists), Move, ListDir (to a
 * depth), Remove (recursive), and WatchDir.
 *
 * Where dsec differs from E2B's envd (docs/E2B.md):
 * - Move runs `mv -f -T SOURCE DEST` in the sandbox (the agent has no rename operation),
 *   so the image needs an `mv` (busybox's does);
 * - WatchDir polls: every {@link WATCH_POLL_MS} the directory (its tree, `recursive`) is
 *   listed and compared with the previous listing, so an event is seen up to that late, a
 *   rename shows as a remove and a create, and a change that is undone within one poll is
 *   not seen. It works the same on every backend (no inotify in a VM guest is needed);
 * - the non-streaming watcher RPCs (CreateWatcher, GetWatcherEvents, RemoveWatcher),
 *   which the SDKs do not call, answer Unimplemented.
 */
import path from 'node:path';
import type { ServiceImpl } from '@connectrpc/connect';
import { Code, ConnectError } from '@connectrpc/connect';
import type { MessageInitShape } from '@bufbuild/protobuf';
import { EventType, FileType, Filesystem, type EntryInfoSchema, type WatchDirResponseSchema } from './gen/filesystem/filesystem_pb.js';
import type { FileInfo } from '../../agent/protocol.js';
import { isDsecError } from '../../errors.js';
import type { E2bFront } from './front.js';
import type { HostFiles } from './host.js';
import { ENVD_CONTEXT } from './context.js';
import { KEEPALIVE_HEADER } from './process.js';
import { toConnectError } from './wire.js';

type EntryInit = MessageInitShape<typeof EntryInfoSchema>;
type WatchInit = MessageInitShape<typeof WatchDirResponseSchema>;

/** Poll interval of WatchDir: 250 ms (4 listings a second of the watched tree). */
export const WATCH_POLL_MS = 250;
/** Most entries one WatchDir poll lists: 10,000; a larger tree is refused rather than listed 4 times a second. */
export const WATCH_MAX_ENTRIES = 10_000;

/** `ls -l`'s mode text for a FileInfo, as Go's FileMode prints it (`d` directory, `L` symlink). */
export function permissionsText(i: Pick<FileInfo, 'type' | 'mode'>): string {
  const t = i.type === 'dir' ? 'd' : i.type === 'symlink' ? 'L' : '-';
  const rwx = (b: number) => `${b & 4 ? 'r' : '-'}${b & 2 ? 'w' : '-'}${b & 1 ? 'x' : '-'}`;
  return t + rwx(i.mode >> 6) + rwx(i.mode >> 3) + rwx(i.mode);
}

/** A sandbox file's EntryInfo: a symlink is typed as what it points to (SYMLINK when dangling), with its target. */
async function entryOf(front: E2bFront, id: string, files: HostFiles, user: string, p: string, info: FileInfo): Promise<EntryInit> {
  let type: FileType;
  let size = info.size;
  if (info.type === 'symlink') {
    const to = await files.stat(p, { user }).catch(() => null);
    type = to?.type === 'dir' ? FileType.DIRECTORY : to?.type === 'file' ? FileType.FILE : FileType.SYMLINK;
    if (to) size = to.size;
  } else {
    type = info.type === 'dir' ? FileType.DIRECTORY : info.type === 'file' ? FileType.FILE : FileType.UNSPECIFIED;
  }
  return {
    name: p === '/' ? '/' : path.posix.basename(p),
    type,
    path: p,
    size: BigInt(size),
    mode: info.mode,
    permissions: permissionsText(info),
    owner: await front.userName(id, info.uid),
    group: await front.groupName(id, info.gid),
    modifiedTime: { seconds: info.mtimeNs / 1_000_000_000n, nanos: Number(info.mtimeNs % 1_000_000_000n) },
    ...(info.type === 'symlink' && info.target !== undefined ? { symlinkTarget: info.target } : {}),
  };
}

/** One listed entry of a watched tree, for change detection. */
interface Seen {
  info: FileInfo;
}

/** Lists `dir` (its tree when `recursive`) as relative path -> info. @throws DsecError ResourceExhausted past {@link WATCH_MAX_ENTRIES} */
async function snapshot(files: HostFiles, user: string, dir: string, recursive: boolean): Promise<Map<string, Seen>> {
  const out = new Map<string, Seen>();
  const walk = async (rel: string): Promise<void> => {
    const abs = rel ? path.posix.join(dir, rel) : dir;
    const entries = await files.list(abs, { user }).catch((e: unknown) => {
      // A subdirectory that went away between two listings is just gone.
      if (rel && isDsecError(e, 'NotFound')) return [];
      throw e;
    });
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      out.set(r, { info: e });
      if (out.size > WATCH_MAX_ENTRIES) throw new ConnectError(`${dir} holds more than ${WATCH_MAX_ENTRIES} entries; watch a smaller directory`, Code.ResourceExhausted);
      if (recursive && e.type === 'dir') await walk(r);
    }
  };
  await walk('');
  return out;
}

/** Events between two listings: CREATE, REMOVE, WRITE (size or mtime changed), CHMOD (mode changed). */
export function diffListings(before: Map<string, Seen>, after: Map<string, Seen>): { name: string; type: EventType }[] {
  const ev: { name: string; type: EventType }[] = [];
  for (const [name, a] of after) {
    const b = before.get(name);
    if (!b) ev.push({ name, type: EventType.CREATE });
    else {
      if (b.info.type !== a.info.type) {
        ev.push({ name, type: EventType.REMOVE }, { name, type: EventType.CREATE });
        continue;
      }
      if (a.info.type !== 'dir' && (b.info.size !== a.info.size || b.info.mtimeNs !== a.info.mtimeNs)) ev.push({ name, type: EventType.WRITE });
      if (b.info.mode !== a.info.mode) ev.push({ name, type: EventType.CHMOD });
    }
  }
  for (const name of before.keys()) if (!after.has(name)) ev.push({ name, type: EventType.REMOVE });
  return ev;
}

/** The filesystem service (see the module comment). */
export function filesystemService(front: E2bFront): Partial<ServiceImpl<typeof Filesystem>> {
  /** The request's sandbox, files, user, home and the path it names, resolved. */
  const open = async (ctx: { values: { get<T>(k: import('@connectrpc/connect').ContextKey<T>): T } }, p: string) => {
    const { sandbox, username } = ctx.values.get(ENVD_CONTEXT);
    const who = await front.actingUser(sandbox.id, username);
    const files = await front.host.files(sandbox.id);
    return { id: sandbox.id, files, user: who.user ?? '0', home: who.home, path: front.resolvePath(p, who.home) };
  };
  const rpc = async <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (e) {
      throw toConnectError(e);
    }
  };
  return {
    stat: (req, ctx) => rpc(async () => {
      const o = await open(ctx, req.path);
      const info = await o.files.stat(o.path, { user: o.user, nofollow: true });
      return { entry: await entryOf(front, o.id, o.files, o.user, o.path, info) };
    }),

    makeDir: (req, ctx) => rpc(async () => {
      const o = await open(ctx, req.path);
      const there = await o.files.stat(o.path, { user: o.user, nofollow: true }).catch((e: unknown) => {
        if (isDsecError(e, 'NotFound')) return null;
        throw e;
      });
      if (there) throw new ConnectError(`${o.path} already exists`, Code.AlreadyExists);
      await o.files.mkdir(o.path, { user: o.user, parents: true });
      return { entry: await entryOf(front, o.id, o.files, o.user, o.path, await o.files.stat(o.path, { user: o.user, nofollow: true })) };
    }),

    move: (req, ctx) => rpc(async () => {
      const o = await open(ctx, req.source);
      const dst = front.resolvePath(req.destination, o.home);
      await o.files.stat(o.path, { user: o.user, nofollow: true });
      const r = await front.host.run(o.id, ['mv', '-f', '-T', o.path, dst], o.user);
      if (r.exitCode !== 0) throw new ConnectError(`move ${o.path} to ${dst}: ${r.stderr.trim() || `mv exited ${r.exitCode}`}`, Code.FailedPrecondition);
      return { entry: await entryOf(front, o.id, o.files, o.user, dst, await o.files.stat(dst, { user: o.user, nofollow: true })) };
    }),

    listDir: (req, ctx) => rpc(async () => {
      const o = await open(ctx, req.path);
      const depth = Math.max(1, req.depth || 1);
      const top = await o.files.stat(o.path, { user: o.user });
      if (top.type !== 'dir') throw new ConnectError(`${o.path} is not a directory`, Code.InvalidArgument);
      const entries: EntryInit[] = [];
      const walk = async (dir: string, level: number): Promise<void> => {
        for (const e of await o.files.list(dir, { user: o.user })) {
          const p = path.posix.join(dir, e.name);
          entries.push(await entryOf(front, o.id, o.files, o.user, p, e));
          if (e.type === 'dir' && level < depth) await walk(p, level + 1);
        }
      };
      await walk(o.path, 1);
      return { entries };
    }),

    remove: (req, ctx) => rpc(async () => {
      const o = await open(ctx, req.path);
      await o.files.stat(o.path, { user: o.user, nofollow: true });
      await o.files.remove(o.path, { user: o.user, recursive: true });
      return {};
    }),

    async *watchDir(req, ctx): AsyncGenerator<WatchInit> {
      const o = await rpc(() => open(ctx, req.path));
      const top = await rpc(() => o.files.stat(o.path, { user: o.user }));
      if (top.type !== 'dir') throw new ConnectError(`${o.path} is not a directory`, Code.InvalidArgument);
      let before = await rpc(() => snapshot(o.files, o.user, o.path, req.recursive));
      yield { event: { case: 'start', value: {} } };
      const v = Number(ctx.requestHeader.get(KEEPALIVE_HEADER));
      const keepaliveMs = Math.min(300, Math.max(1, Number.isFinite(v) && v > 0 ? v : 50)) * 1000;
      let quietSince = Date.now();
      while (!ctx.signal.aborted) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, WATCH_POLL_MS);
          ctx.signal.addEventListener('abort', () => {
            clearTimeout(t);
            resolve();
          }, { once: true });
        });
        if (ctx.signal.aborted) break;
        const after = await rpc(() => snapshot(o.files, o.user, o.path, req.recursive));
        for (const ev of diffListings(before, after)) {
          const seen = after.get(ev.name);
          const entry = req.includeEntry && seen && ev.type !== EventType.REMOVE
            ? await rpc(() => entryOf(front, o.id, o.files, o.user, path.posix.join(o.path, ev.name), seen.info))
            : undefined;
          yield { event: { case: 'filesystem', value: { name: ev.name, type: ev.type, ...(entry ? { entry } : {}) } } };
          quietSince = Date.now();
        }
        before = after;
        if (Date.now() - quietSince >= keepaliveMs) {
          yield { event: { case: 'keepalive', value: {} } };
          quietSince = Date.now();
        }
      }
      throw ctx.signal.reason instanceof ConnectError ? ctx.signal.reason : new ConnectError('the stream was cancelled', Code.Canceled);
    },
  };
}
