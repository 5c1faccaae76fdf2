"""dsec.AsyncClient against a real dsecd: the calls with await, streams as async
iterators, and 64 concurrent execs from one event loop."""
from __future__ import annotations

import asyncio
import io
import unittest

from _env import IMAGE, RUN, WORK, aclient

import dsec


class AsyncClient(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.c = aclient()
        self.sb = await self.c.sandboxes.create(image=IMAGE, labels={"run": RUN, "suite": "async"})

    async def asyncTearDown(self) -> None:
        await self.c.sandboxes.destroy_all(f"run={RUN},suite=async")
        await self.c.aclose()

    async def test_exec_files_and_errors(self) -> None:
        self.assertIsInstance(self.sb, dsec.AsyncSandbox)
        r = await self.sb.exec(["sh", "-c", "cat; echo e >&2; exit 2"], stdin=b"abc")
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (2, b"abc", b"e\n"))
        await self.sb.files.write(f"{WORK}/x", io.BytesIO(b"1234"), parents=True)
        self.assertEqual(await self.sb.files.read(f"{WORK}/x"), b"1234")
        self.assertEqual((await self.sb.files.stat(f"{WORK}/x")).size, 4)
        with self.assertRaises(dsec.NotFound):
            await self.c.sandboxes.get("0123456789abcdef")
        with self.assertRaises(dsec.FailedPrecondition):
            await self.sb.files.read("/")
        self.assertTrue((await self.sb.exec(["sleep", "10"], timeout_ms=200)).timed_out)
        self.assertIn("version", await self.c.version())

    async def test_64_concurrent_execs_from_one_loop(self) -> None:
        async def one(i: int) -> bytes:
            return (await self.sb.exec(["sh", "-c", f"sleep 0.2; echo {i}"])).stdout

        outs = await asyncio.gather(*(one(i) for i in range(64)))
        self.assertEqual(outs, [f"{i}\n".encode() for i in range(64)])
        # All 64 are in flight at once: each waits for a file that is made only once the
        # sandbox shows 64 waiters (a cap below 64 would leave them waiting: exec timeout).
        cmd = f"echo $$ >> {WORK}/waiting; while [ ! -f {WORK}/go ]; do sleep 0.05; done; echo done"
        batch = [asyncio.ensure_future(self.sb.exec(["sh", "-c", cmd], timeout_ms=120_000)) for _ in range(64)]
        waiting = 0
        while waiting < 64 and not any(b.done() for b in batch):
            r = await self.sb.exec(["sh", "-c", f"cat {WORK}/waiting 2>/dev/null | wc -l"])
            waiting = int(r.stdout.strip())
        self.assertEqual(waiting, 64)
        await self.sb.exec(["touch", f"{WORK}/go"])
        res = await asyncio.gather(*batch)
        self.assertEqual({(x.exit_code, x.stdout) for x in res}, {(0, b"done\n")})

    async def test_a_pooled_connection_dsecd_closed_while_idle_is_not_reused(self) -> None:
        # As in test_sync: a POST after dsecd closed the idle pooled connection (5 s).
        await asyncio.gather(*(self.sb.exec(["true"]) for _ in range(4)))
        await asyncio.sleep(6)
        outs = await asyncio.gather(*(self.sb.exec(["echo", str(i)]) for i in range(4)))
        self.assertEqual([o.stdout for o in outs], [f"{i}\n".encode() for i in range(4)])

    async def test_streams_exec_output_logs_events_export(self) -> None:
        s = await self.sb.start_exec(["sh", "-c", "echo a; read x; echo b$x"], stdin=True)
        it = s.output("stdout").__aiter__()
        got = await it.__anext__()
        self.assertEqual(got, b"a\n")
        await s.write_stdin("1\n", eof=True)
        async for b in it:
            got += b
        self.assertEqual(got, b"a\nb1\n")
        self.assertEqual((await s.wait()).exit_code, 0)
        self.assertEqual(b"".join([b async for b in self.sb.exec_stream(["echo", "streamed"])]), b"streamed\n")
        self.assertTrue([ln async for ln in self.sb.logs()])
        t = f"atraj-{RUN}"
        for k in range(2):
            await self.sb.exec(["echo", str(k)], trajectory=t, step=k)
        self.assertTrue((await self.sb.exec(["echo", "0"], trajectory=t, step=0)).replayed)
        self.assertEqual([r.stdout async for r in self.c.trajectories.export(t)], [b"0\n", b"1\n"])
        self.assertEqual((await self.c.trajectories.get(t)).steps, 2)
        evs = [e async for e in self.c.events(selector=f"run={RUN},suite=async")]
        self.assertIn(self.sb.id, [e.sandbox_id for e in evs])

    async def test_rounds_snapshots_forks(self) -> None:
        snap = await self.sb.snapshot()
        forks = await self.c.snapshots.fork(snap.id, 4, labels={"run": RUN, "suite": "async", "round": "1"})
        self.assertEqual(len(forks), 4)
        sel = f"run={RUN},round=1"
        self.assertTrue(all(r.ok for r in await self.c.sandboxes.pause_all(sel)))
        self.assertEqual({s.info.state for s in await self.c.sandboxes.list(selector=sel)}, {"paused"})
        self.assertTrue(all(r.ok for r in await self.c.sandboxes.resume_all(sel)))
        outs = await asyncio.gather(*(f.exec(["echo", f.id]) for f in forks))
        self.assertEqual([o.stdout for o in outs], [f"{f.id}\n".encode() for f in forks])
        self.assertEqual(len(await self.c.sandboxes.destroy_all(sel)), 4)
        await self.c.snapshots.delete(snap.id)
        lease = await self.c.leases.put(f"ajob-{RUN}", 60)
        self.assertEqual(lease.ttl_s, 60)
        await self.c.leases.delete(f"ajob-{RUN}")
        r = await self.c.run(["echo", "ran"], image=IMAGE)
        self.assertEqual(r.stdout, b"ran\n")


if __name__ == "__main__":
    unittest.main()
