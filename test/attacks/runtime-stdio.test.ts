/**
 * attack: own the host's /dev/null from a sandbox. crun 1.8 fchowns its standard
 * streams to the container's root unless they are terminals; a device there is the
 * host's device node (dsecd's children get /dev/null as stdin), and inside the sandbox
 * /dev/null is a bind of that same inode, so its root could chown or chmod the host's
 * /dev/null, which every host process and every other sandbox uses. native/oci-exec keeps
 * devices off fds 0-2 of the runtime. runc leaves its streams alone.
 */
import { chownSync, statSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, out } from '../integration/harness.js';
import { ociExecPath } from '../../daemon/drivers/container/runtime.js';

describe.skipIf(!IS_ROOT)('attack: take the host\'s /dev/null through the runtime\'s standard streams', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 83 });
  });
  afterAll(async () => {
    await d?.cleanup();
    // Give the host its /dev/null back if an attack got through (any create of a runtime without the fix does it).
    if (statSync('/dev/null').uid !== 0) chownSync('/dev/null', 0, 0);
  });

  it('the launcher gives the runtime no device as stdin, stdout or stderr', async () => {
    // The launcher execs its argument with /dev/null on 0, 1 and 2 (execa's "ignore"): what does the program get?
    const probe = 'for f in 0 1 2; do echo "$f $(stat -L -c %F /proc/$$/fd/$f)" >&3; done';
    const r = await execa(ociExecPath(), ['/bin/sh', '-c', probe], { stdio: ['ignore', 'ignore', 'ignore', 'pipe'] });
    // stdin: an empty pipe; stdout and stderr: anonymous memory files (memfd).
    expect(String(r.stdio[3])).toMatch(/^0 fifo\n1 regular (empty )?file\n2 regular (empty )?file\n?$/);
  });

  it('after each create the host\'s /dev/null is still root\'s, mode 0666, and the sandbox\'s root cannot chown it', async () => {
    for (let k = 0; k < 3; k++) {
      const sb = await d.client.createSandbox({ image: 'busybox' });
      const st = statSync('/dev/null');
      expect({ uid: st.uid, gid: st.gid, mode: (st.mode & 0o7777).toString(8) }).toEqual({ uid: 0, gid: 0, mode: '666' });
      const x = await d.client.exec(sb.id, { argv: ['sh', '-c', 'chown 1:1 /dev/null 2>&1; echo "rc=$?"; chmod 600 /dev/null 2>&1; echo "rc=$?"'] });
      expect(out(x)).toMatch(/rc=1\n.*rc=1\n$/s);
      expect(statSync('/dev/null').uid).toBe(0);
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('the sandbox\'s log, the runtime\'s stdout and stderr (crun gives it to the container\'s root as runc would not), is not reachable from inside', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const log = path.join(d.root, 'sandboxes', sb.id, 'agent.log');
    const x = await d.client.exec(sb.id, { argv: ['sh', '-c', `ls -l ${log} 2>&1; true`] });
    expect(out(x)).toMatch(/No such file or directory/);
    await d.client.deleteSandbox(sb.id, { force: true });
  });
});
