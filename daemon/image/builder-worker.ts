/**
 * The Node side of the builder identity: `node dist/daemon/image/builder-worker.js`, run
 * by BuilderJob.worker (daemon/host/builder.ts) as uid 0 of a builder slot's user
 * namespace, in the job's staging dir. It does the steps that handle untrusted trees in
 * Node code, so that they run without any of root's power:
 *
 *   extract       {dest, ociWhiteouts}: the tar on fd 3 (opened by root: it may be a
 *                 root-only file) into `dest`, sanitised as daemon/image/import/tar-extract.ts
 *                 describes; opaque directories are reported, not marked (trusted.*
 *                 xattrs are out of the builder's reach), and owners above 65535 are
 *                 recorded as 65534. Result: the ExtractReport.
 *   prepare-copy  {tree, strip, exclude, created}: strips the builder's copy of a
 *                 writable layer, gives owner 0 back to the entries and sets the file
 *                 capabilities listed on fd 3 (daemon/image/commit.ts prepareBuilderCopy).
 *                 Result: {stripped, unmatched}.
 *
 * Protocol: one JSON object on stdin; on stdout, lines of JSON: `{"progress": <bytes>}`
 * any number of times, then exactly one `{"result": ...}` (exit 0) or
 * `{"error": {"kind": <DsecError kind>, "message": ...}}` (exit 1).
 */
import { createReadStream } from 'node:fs';
import { chmod, mkdir } from 'node:fs/promises';
import { DsecError } from '../errors.js';
import { prepareBuilderCopy, readFixupsFd } from './commit.js';
import { extractLayerTar } from './import/tar.js';

/** Owners this far and above are not mapped in the builder's namespace (see ExtractOptions.idLimit). */
const BUILDER_IDS = 65536;

/** The first fd root passes (dsec-builder `--fds`). */
const INPUT_FD = 3;

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

function emit(msg: unknown): void {
  process.stdout.write(`${JSON.stringify(msg)}\n`);
}

/** A relative path that stays in the staging dir (the builder could not leave it anyway; this keeps mistakes loud). */
function rel(p: unknown, what: string): string {
  if (typeof p !== 'string' || p === '' || p.startsWith('/') || p.split('/').includes('..')) throw new DsecError('Internal', `builder worker: ${what} ${JSON.stringify(p)} is not a relative path`);
  return p;
}

async function main(): Promise<unknown> {
  const req = JSON.parse(await readStdin()) as Record<string, unknown>;
  switch (req.op) {
    case 'extract': {
      const dest = rel(req.dest, 'dest');
      await mkdir(dest, { mode: 0o755 });
      await chmod(dest, 0o755); // the layer's root directory, whatever the umask
      const input = createReadStream('', { fd: INPUT_FD, highWaterMark: 1 << 20 });
      return extractLayerTar(input, dest, {
        ociWhiteouts: req.ociWhiteouts === true,
        opaqueXattrs: false,
        idLimit: BUILDER_IDS,
        onProgress: (bytes) => emit({ progress: bytes }),
      });
    }
    case 'prepare-copy': {
      const tree = rel(req.tree, 'tree');
      const strings = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []);
      const packed = await prepareBuilderCopy(tree, { strip: req.strip === true, exclude: strings(req.exclude), created: strings(req.created) }, readFixupsFd(INPUT_FD));
      return { stripped: packed.stripped, unmatched: packed.unmatched };
    }
    default:
      throw new DsecError('Internal', `builder worker: unknown op ${JSON.stringify(req.op)}`);
  }
}

// Writes to a pipe are synchronous on Linux, so exiting right after emit loses nothing;
// exiting (rather than waiting for the event loop to drain) ends the job even if a stream
// was left open by a failure.
main().then(
  (result) => {
    emit({ result });
    process.exit(0);
  },
  (e: unknown) => {
    const kind = e instanceof DsecError ? e.kind : 'Internal';
    emit({ error: { kind, message: (e as Error)?.message ?? String(e) } });
    process.exit(1);
  },
);
