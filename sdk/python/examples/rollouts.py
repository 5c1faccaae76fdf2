#!/usr/bin/env python3
"""Rollouts with forks and trajectory replay: the shape of an RL framework's agent loop.

Against the dsecd (or gateway) the environment names (DSEC_SOCKET, or DSEC_HOST +
DSEC_TOKEN + DSEC_CA), this:

1. prepares an environment once (a sandbox with a task file), snapshots it and destroys it;
2. forks ``--rollouts`` sandboxes (default 16) from the snapshot, labelled ``run=<run id>``,
   and holds a lease on job ``<run id>`` (lapsed jobs are paused, then destroyed by dsecd);
3. runs a ``--steps``-step agent loop in every rollout concurrently (asyncio), each step an
   exec recorded in trajectory ``<run id>-<sandbox id>`` as step k. Each step increments a
   side-effect counter in the sandbox (``/root/counter``) and its observation (stdout)
   decides the next action, as a policy would;
4. pauses the round while "training" (rewards read from the trajectory exports), resumes
   it, and checks that every counter equals ``--steps``;
5. cleans up by selector: destroys the rollouts, deletes the snapshot and the lease.

Kill it midway (``--crash-after-step K`` makes it SIGKILL itself once every rollout has
done K steps) and run it again with the same ``--run-id``: it finds its snapshot and forks
by label, and the K recorded steps of each rollout come back from the trajectory log with
``replayed=True`` instead of running again, so the counters still end at ``--steps``.
The last line of output is a JSON summary; with ``--expect-replayed N`` it exits non-zero
unless exactly N steps were replayed and every counter is right.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import uuid
from typing import Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dsec  # noqa: E402

COUNTER = "/root/counter"


def step_argv(k: int, observation: str) -> List[str]:
    """The action of step ``k`` given the last observation: bump the counter and report it.

    Deterministic in its inputs, so a rerun sends the same request (same trajectory hash)
    and dsecd can answer it from the log."""
    return ["sh", "-c", f"n=$(cat {COUNTER} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {COUNTER}; "
                        f"echo step={k} n=$n seen={observation!r} task=$(cat /root/task)"]


class Stats:
    """Counts of executed and replayed steps across rollouts."""

    def __init__(self) -> None:
        self.executed = 0
        self.replayed = 0


async def rollout(sb: dsec.AsyncSandbox, run: str, steps: int, stats: Stats, reached: "asyncio.Queue[str]", crash_after: Optional[int]) -> str:
    """The agent loop of one rollout; returns its last observation."""
    traj = f"{run}-{sb.id}"
    observation = "start"
    for k in range(steps):
        r = await sb.exec(step_argv(k, observation), trajectory=traj, step=k, timeout_ms=60_000)
        if r.exit_code != 0:
            raise RuntimeError(f"rollout {sb.id} step {k} failed: {r.stderr!r}")
        if r.replayed:
            stats.replayed += 1
        else:
            stats.executed += 1
        observation = r.text.split()[1]  # "n=<count>"
        if crash_after is not None and k + 1 == crash_after:
            await reached.put(sb.id)
            await asyncio.sleep(3600)  # the process dies before this ends
    return observation


async def main(args: argparse.Namespace) -> int:
    run = args.run_id
    sel = f"run={run},role=rollout"
    async with dsec.AsyncClient(timeout=300) as c:
        await c.leases.put(run, 3600)
        # 1. Prepare once, snapshot (a rerun finds the snapshot by name).
        snap_name = f"rollouts-{run}"
        try:
            snap = await c.snapshots.get(snap_name)
        except dsec.NotFound:
            prep = await c.sandboxes.create(image=args.image, labels={"run": run, "role": "prepare"})
            await prep.files.write("/root/task", f"task-of-{run}\n".encode())
            snap = await prep.snapshot(name=snap_name)
            await prep.destroy()
        # 2. Fork the rollouts (a rerun finds them by label).
        sbs = await c.sandboxes.list(selector=sel)
        if not sbs:
            sbs = await c.snapshots.fork(snap.id, args.rollouts, labels={"run": run, "role": "rollout", "job": run})
        print(f"{len(sbs)} rollouts forked from {snap.id}", flush=True)
        # 3. The agent loops, concurrently.
        stats = Stats()
        reached: "asyncio.Queue[str]" = asyncio.Queue()
        loops = [asyncio.ensure_future(rollout(sb, run, args.steps, stats, reached, args.crash_after_step)) for sb in sbs]
        if args.crash_after_step is not None:
            for _ in sbs:
                await reached.get()
            print(f"every rollout did {args.crash_after_step} steps; killing this process", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        finals = await asyncio.gather(*loops)
        await c.leases.renew(run)
        # 4. Pause the round while training on the trajectories, then resume it.
        paused = await c.sandboxes.pause_all(sel)
        assert all(r.ok for r in paused), paused
        rewards: Dict[str, int] = {}
        for sb in sbs:
            recs = [r async for r in c.trajectories.export(f"{run}-{sb.id}")]
            rewards[sb.id] = sum(1 for r in recs if r.exit_code == 0)
        resumed = await c.sandboxes.resume_all(sel)
        assert all(r.ok for r in resumed), resumed
        counters = await asyncio.gather(*(sb.files.read(COUNTER) for sb in sbs))
        counts = {sb.id: int(n) for sb, n in zip(sbs, counters)}
        # 5. Clean up by selector.
        if not args.keep:
            await c.sandboxes.destroy_all(f"run={run}")
            await c.snapshots.delete(snap.id)
            await c.leases.delete(run)
        summary = {
            "run": run, "rollouts": len(sbs), "steps": args.steps, "executed": stats.executed, "replayed": stats.replayed,
            "counters_ok": all(n == args.steps for n in counts.values()), "counters": sorted(set(counts.values())),
            "reward_total": sum(rewards.values()), "final_observations": sorted(set(finals)),
        }
        print(json.dumps(summary), flush=True)
        if args.expect_replayed is not None:
            if stats.replayed != args.expect_replayed or not summary["counters_ok"]:
                print(f"expected {args.expect_replayed} replayed steps and every counter at {args.steps}", file=sys.stderr)
                return 1
        return 0


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run-id", default=uuid.uuid4().hex[:12], help="labels, trajectory ids and the snapshot name derive from it; reuse it to resume a killed run")
    p.add_argument("--rollouts", type=int, default=16, help="sandboxes forked from the snapshot (1-256)")
    p.add_argument("--steps", type=int, default=6, help="agent steps per rollout")
    p.add_argument("--image", default="busybox")
    p.add_argument("--crash-after-step", type=int, default=None, help="SIGKILL this process once every rollout did this many steps")
    p.add_argument("--expect-replayed", type=int, default=None, help="exit 1 unless exactly this many steps were replayed and the counters are right")
    p.add_argument("--keep", action="store_true", help="leave the sandboxes, snapshot and lease")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
