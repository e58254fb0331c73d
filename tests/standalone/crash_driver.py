"""Loops allocate → join a sleeping child → release on one node until SIGKILLed (the crash test's victim).

Run as `python -m tests.standalone.crash_driver CGROUP_ROOT STATE_DIR JOURNAL ROUND`.  Every step is
appended to JOURNAL as one line, after it happened, so the test knows what must have survived:
`ready ROUND`, `spawn PID`, `alloc PID ID CPUS`, `joined PID ID CPUS`, `dead PID`, `released ID`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

from agent.alloc.request import Request
from agent.enforce import detect_layout
from agent.enforce.state import Owner
from agent.enforce.state_file import StateFile
from agent.errors import AllocationError
from agent.pinning.engine import PinningEngine
from agent.topology.discover import discover

SLEEPER = ["sleep", "299"]


def main(root: str, state_dir: str, journal: str, round_no: str) -> int:
    rng = random.Random(int(round_no))
    engine = PinningEngine(discover("/"), detect_layout(root), StateFile(state_dir))
    capacity = len(engine.allowed) - 1
    most = min(capacity, 3)  # allocations held at once
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(*words: object) -> None:
        os.write(fd, (" ".join(str(w) for w in words) + "\n").encode())

    held: list[tuple[str, subprocess.Popen[bytes]]] = []
    log("ready", round_no)
    n = 0
    while True:
        if held and (len(held) >= most or rng.random() < 0.5):
            alloc_id, sleeper = held.pop(rng.randrange(len(held)))
            sleeper.kill()
            sleeper.wait()
            log("dead", sleeper.pid)
            if not engine.release(alloc_id):
                print(f"release of {alloc_id} refused with its process gone", file=sys.stderr)
                return 3
            log("released", alloc_id)
            continue
        n += 1
        alloc_id = f"crash-{round_no}-{n}"
        sleeper = subprocess.Popen(SLEEPER)
        log("spawn", sleeper.pid)
        try:
            alloc = engine.allocate(alloc_id, Request(rng.randint(1, max(1, capacity // most))),
                                    Owner.of_process(sleeper.pid))
        except AllocationError as exc:
            sleeper.kill()
            sleeper.wait()
            log("dead", sleeper.pid)
            if not held:  # nothing of ours holds CPUs, so the node must have had room
                print(f"allocation refused on an idle node: {exc}", file=sys.stderr)
                return 3
            continue
        log("alloc", sleeper.pid, alloc_id, alloc.cpus.cpulist())
        engine.join(alloc, sleeper.pid)
        log("joined", sleeper.pid, alloc_id, alloc.cpus.cpulist())
        held.append((alloc_id, sleeper))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
