"""Crash safety: SIGKILL an allocate/join/release loop at random moments, restart it, check every time."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial

from agent.enforce.cgroup import list_children, read_cpus, read_procs
from agent.enforce.state import State
from agent.enforce.state_file import StateFile
from agent.topology.cpuset import CPUSet
from tests.standalone.conftest import Node, kill_and_reap, proc_cpus, proc_field, wait_for

CYCLES = 200
KILLS = 25
BUDGET_SECONDS = 80.0


@dataclass
class Journal:
    """What the driver says it did, per process it spawned."""

    spawned: set[int] = field(default_factory=set)
    allocated: dict[int, tuple[str, CPUSet]] = field(default_factory=dict)
    joined: dict[int, tuple[str, CPUSet]] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    released: int = 0
    ready: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, path: str) -> Journal:
        j = cls()
        if not os.path.exists(path):
            return j
        with open(path) as f:
            for line in f:
                words = line.split()
                if len(words) < 2 or not line.endswith("\n"):
                    continue
                kind = words[0]
                if kind == "ready":
                    j.ready.add(words[1])
                elif kind == "spawn":
                    j.spawned.add(int(words[1]))
                elif kind in ("alloc", "joined"):
                    target = j.allocated if kind == "alloc" else j.joined
                    target[int(words[1])] = (words[2], CPUSet.parse(words[3]))
                elif kind == "dead":
                    j.dead.add(int(words[1]))
                elif kind == "released":
                    j.released += 1
        return j


def _running(pid: int) -> bool:
    state = proc_field(pid, "State")
    return state is not None and not state.startswith("Z")


def _check_disjoint(state: State) -> None:
    taken = CPUSet()
    for a in state.allocations:
        assert a.cpus, a
        assert a.cpus.isdisjoint(taken), f"CPUs {a.cpus & taken} double-assigned in {state}"
        taken |= a.cpus


def _check_after_kill(node: Node, journal: Journal) -> None:
    """The state as the killed driver left it, before anyone repairs anything."""
    state = StateFile(node.state_dir).load(missing_ok=True)  # never torn: raises if corrupt
    _check_disjoint(state)
    for pid, (alloc_id, cpus) in journal.allocated.items():
        if pid in journal.dead:
            continue
        alloc = state.get(alloc_id)
        assert alloc is not None, f"allocation {alloc_id} of live process {pid} lost"
        assert alloc.cpus == cpus
        if pid in journal.joined and _running(pid):  # (killed after its kill, before "dead")
            assert pid in read_procs(node.layout, alloc.cgroup)


def _check_after_reconcile(node: Node, journal: Journal, before: State) -> State:
    """One reconcile later: the live cgroups say exactly what the state says."""
    node.engine().reconcile()
    state = node.state()
    _check_disjoint(state)
    for a in before.allocations:
        if a.owner.pid is not None and _running(a.owner.pid):
            kept = state.get(a.id)
            assert kept is not None and kept.cpus == a.cpus, f"{a.id} of running {a.owner.pid} lost"
    assert sorted(node.workload_cgroups()) == sorted(a.cgroup for a in state.allocations)
    pool = node.allowed - state.allocated()
    for a in state.allocations:
        assert read_cpus(node.layout, a.cgroup) == a.cpus
        for pid in read_procs(node.layout, a.cgroup):
            assert proc_cpus(pid) == a.cpus
    shared = [node.layout.shared_path, *list_children(node.layout, node.layout.shared_path)]
    for rel in shared:
        assert read_cpus(node.layout, rel) == pool
    # No cgroup of the tree reaches into CPUs another workload owns.
    owner_of = {c: a.cgroup for a in state.allocations for c in a.cpus}
    for rel in [*node.workload_cgroups(), *shared]:
        foreign = [c for c in read_cpus(node.layout, rel) if owner_of.get(c, rel) != rel]
        assert not foreign, f"{rel} holds CPUs {foreign} owned by others"
    for pid, (alloc_id, cpus) in journal.joined.items():
        if _running(pid):
            assert proc_cpus(pid) == cpus, f"{alloc_id}: process {pid} escaped its CPUs"
    return state


def _started(round_no: str, driver: subprocess.Popen[bytes], journal: str) -> bool:
    return round_no in Journal.read(journal).ready or driver.poll() is not None


def test_sigkill_at_random_moments_loses_nothing_and_double_assigns_nothing(node: Node) -> None:
    seed = int(os.environ.get("TOPOLET_CRASH_SEED", str(time.time_ns() % 10**6)))
    rng = random.Random(seed)
    started = time.monotonic()
    rounds = released = 0
    while released < CYCLES or rounds < KILLS:
        assert time.monotonic() - started < BUDGET_SECONDS, f"seed {seed}: too slow after {rounds} rounds"
        rounds += 1
        path = str(node.tmp / f"journal-{rounds}")
        driver, err = node.start([sys.executable, "-m", "tests.standalone.crash_driver", node.root,
                                  node.state_dir, path, str(rounds)])
        wait_for(partial(_started, str(rounds), driver, path), "the driver to start")
        time.sleep(rng.uniform(0.0, 0.2))
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(20) == -signal.SIGKILL, f"seed {seed}: driver ended itself: {err.read_text()}"
        journal = Journal.read(path)
        released += journal.released
        _check_after_kill(node, journal)
        before = StateFile(node.state_dir).load(missing_ok=True)
        _check_after_reconcile(node, journal, before)
        # End the round: every orphaned sleeper dies, and one pass gives every CPU back.
        for pid in node.orphans():
            kill_and_reap(pid)
        state = _check_after_reconcile(node, journal, before)
        assert state.allocations == (), f"seed {seed}: {state.allocations} outlived their processes"
        assert node.pool() == node.allowed
