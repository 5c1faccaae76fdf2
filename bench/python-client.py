"""The Python side of bench/python.ts: times the dsec Python client (sdk/python) against
the dsecd that DSEC_SOCKET names, in one sandbox, and prints one JSON object of raw
samples in ms:

- ``sync_exec_true_ms``: sequential exec ``true`` round trips, ``dsec.Client``;
- ``async_exec_true_ms``: the same through ``dsec.AsyncClient`` (one call in flight);
- ``async_64_ms``: wall time of rounds of 64 concurrent exec ``true`` from one event loop.

Usage: python3 bench/python-client.py SANDBOX_ID REPEATS ROUNDS (50 untimed warm-up calls first).
"""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import dsec  # noqa: E402


def main() -> None:
    sid, repeats, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    c = dsec.Client()
    sb = c.sandboxes.get(sid)
    for _ in range(50):
        sb.exec(["true"])
    sync_ms = []
    for _ in range(repeats):
        t = time.perf_counter()
        sb.exec(["true"])
        sync_ms.append((time.perf_counter() - t) * 1000)
    c.close()

    async def run() -> dict:
        async with dsec.AsyncClient() as ac:
            asb = await ac.sandboxes.get(sid)
            await asyncio.gather(*(asb.exec(["true"]) for _ in range(64)))  # warm: 64 pooled connections
            seq = []
            for _ in range(repeats):
                t = time.perf_counter()
                await asb.exec(["true"])
                seq.append((time.perf_counter() - t) * 1000)
            wide = []
            for _ in range(rounds):
                t = time.perf_counter()
                res = await asyncio.gather(*(asb.exec(["true"]) for _ in range(64)))
                wide.append((time.perf_counter() - t) * 1000)
                assert all(r.exit_code == 0 for r in res)
            return {"async_exec_true_ms": seq, "async_64_ms": wide}

    out = {"python": sys.version.split()[0], "sync_exec_true_ms": sync_ms, **asyncio.run(run())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
