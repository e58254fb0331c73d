"""Rewrites a state file until killed (the kill -9 test's victim); content is a function of generation.

Run as `python -m tests.enforce.state_writer FOLDER`; prints "ready" once it is about to write.
"""

from __future__ import annotations

import sys

from agent.enforce.state import Allocation, Owner, State
from agent.enforce.state_file import StateFile
from agent.topology.cpuset import CPUSet

PERIOD = 40
PAD = "x" * 2000  # makes the file large (tens of KiB), so a write is far from one sector


def state_for(generation: int) -> State:
    """The state whose commit writes `generation`: generation % PERIOD allocations tagged with it."""
    allocations = tuple(
        Allocation(
            id=f"w{i}",
            cpus=CPUSet([2 * i, 2 * i + 1]),
            mems=CPUSet([0]),
            cgroup=f"topolet/w{i}",
            owner=Owner(pid=1000 + i, start_time=generation),
            policy=f"p{generation}-{PAD}",
            created_at=float(generation),
        )
        for i in range(generation % PERIOD)
    )
    return State(allocations, CPUSet([4096]), generation - 1)


def main(folder: str) -> None:
    sf = StateFile(folder)
    print("ready", flush=True)
    while True:
        with sf.lock():
            sf.commit(state_for(sf.load().generation + 1))


if __name__ == "__main__":
    main(sys.argv[1])
