"""examples/rollouts.py against the dsecd the environment names: a run killed midway and
run again replays the recorded steps (counted by the example) and leaves every rollout's
side-effect counter at the step count, i.e. no step ran twice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

from _env import RUN, client

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "rollouts.py")


def example(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, timeout=1800)


class RolloutExample(unittest.TestCase):
    def test_killed_midway_then_resumed_replays_and_never_reruns_a_step(self) -> None:
        run = f"ex-{RUN}"
        rollouts, steps, k = 16, 5, 2
        first = example("--run-id", run, "--rollouts", str(rollouts), "--steps", str(steps), "--crash-after-step", str(k))
        self.assertEqual(first.returncode, -9, first.stdout + first.stderr)
        self.assertIn(f"every rollout did {k} steps", first.stdout)
        second = example("--run-id", run, "--rollouts", str(rollouts), "--steps", str(steps), "--expect-replayed", str(rollouts * k))
        self.assertEqual(second.returncode, 0, second.stdout + second.stderr)
        summary = json.loads(second.stdout.strip().splitlines()[-1])
        self.assertEqual(summary["rollouts"], rollouts)
        self.assertEqual(summary["replayed"], rollouts * k)
        self.assertEqual(summary["executed"], rollouts * (steps - k))
        self.assertEqual(summary["counters"], [steps])
        self.assertEqual(summary["final_observations"], [f"n={steps}"])
        # Cleaned up by selector.
        c = client()
        self.addCleanup(c.close)
        self.assertEqual(c.sandboxes.list(selector=f"run={run}"), [])
        self.assertNotIn(f"rollouts-{run}", [s.name for s in c.snapshots.list()])


if __name__ == "__main__":
    unittest.main()
