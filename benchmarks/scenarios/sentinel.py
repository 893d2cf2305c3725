"""The cost of ``replicas=1``: uncontended acquire+release pairs/s through Redis Sentinel.

``python -m benchmarks.scenarios.sentinel [--rounds N] [--pairs N]`` starts its own master, replica and
one sentinel on free loopback ports (never the shared server), then measures one RedisState
built from a ``redis+sentinel://`` URL with ``replicas=0`` and one with ``replicas=1``,
interleaved round-robin in every round, and prints the medians (min-max) and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from asynclock import AsyncLock, RedisState
from benchmarks.harness.servers import free_port, stop_all, wait_ready

SERVICE = "asynclock-bench"


def _start(argv: list[str], port: int, procs: list[subprocess.Popen[bytes]]) -> None:
    procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_ready(procs, port, lambda c: bool(c.ping()), "did not answer")


async def _pairs(state: RedisState, pairs: int) -> float:
    lock = AsyncLock(state, "bench", ttl=10.0)
    start = time.perf_counter()
    for _ in range(pairs):
        await lock.acquire()
        await lock.release()
    return pairs / (time.perf_counter() - start)


async def _replica_online(master: int) -> None:
    from redis.asyncio import Redis

    client = Redis(port=master)
    try:
        for _ in range(1000):
            info = await client.info("replication")
            if "online" in str(info.get("slave0", "")):
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("the replica never came online")
    finally:
        await client.aclose()


async def _measure(url: str, master: int, rounds: int, pairs: int) -> dict[str, list[float]]:
    await _replica_online(master)
    states = {
        "replicas=0": RedisState.from_url(url, prefix="bench0:"),
        "replicas=1": RedisState.from_url(url, prefix="bench1:", replicas=1),
    }
    rates: dict[str, list[float]] = {name: [] for name in states}
    try:
        for state in states.values():
            await _pairs(state, 200)  # warm-up: discovery, connections, scripts
        for _ in range(rounds):
            for name, state in states.items():
                rates[name].append(await _pairs(state, pairs))
    finally:
        for state in states.values():
            await state.aclose()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.sentinel")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asynclock-bench-sentinel-") as tmp:
        master = free_port([])
        replica = free_port([master])
        sentinel = free_port([master, replica])
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            _start(["redis-server", "--port", str(master), *common], master, procs)
            replica_of = ["--replicaof", "127.0.0.1", str(master)]
            _start(["redis-server", "--port", str(replica), *common, *replica_of], replica, procs)
            conf = Path(tmp) / "sentinel.conf"
            conf.write_text(f"sentinel monitor {SERVICE} 127.0.0.1 {master} 1\n")
            argv = ["redis-server", str(conf), "--sentinel", "--port", str(sentinel)]
            _start([*argv, "--bind", "127.0.0.1", "--dir", tmp], sentinel, procs)
            url = f"redis+sentinel://127.0.0.1:{sentinel}/{SERVICE}"
            rates = asyncio.run(_measure(url, master, args.rounds, args.pairs))
        finally:
            stop_all(procs)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"uncontended acquire+release pairs/s, {args.rounds} rounds x {args.pairs} pairs")
    for name, values in rates.items():
        print(f"  {name}: {medians[name]:,.0f} ({min(values):,.0f}-{max(values):,.0f})")
    print(f"  replicas=1 / replicas=0: {medians['replicas=1'] / medians['replicas=0']:.2f}x")


if __name__ == "__main__":
    main()
