"""`topolet exec` (a command on exclusive, aligned CPUs: a one-node `srun --cpu-bind`), `topolet status`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

from agent.alloc.request import Request
from agent.enforce import CgroupLayout, detect_layout, read_cpus
from agent.enforce.cgroup import DEFAULT_PARENT, cgroup_dir_of_pid, cgroup_of_pid, move_pid_to_dir
from agent.enforce.state import Allocation, Owner, printable
from agent.enforce.state_file import StateFile
from agent.enforce.state_live import check_live
from agent.errors import AllocationError, ConfigError, TopoletError
from agent.gpu.model import GPU
from agent.gpu.visible import visible_devices_env
from agent.pinning.engine import DEFAULT_RESERVED, PinningEngine, unique_id
from agent.pinning.refusal import CAPACITY, INVALID, AllocationRefused
from agent.pinning.tree import allocation_in_use
from agent.pinning.usage import usage_of
from agent.standalone.journal import Event, append_event
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology
from agent.topology.native import bind_memory, set_affinity

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _command(args: argparse.Namespace) -> list[str]:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("no command given: topolet exec --cpus N -- CMD [ARGS...]")
    return argv


def _gpu_inventory(gpus: int, topo: Topology) -> tuple[GPU, ...]:
    """The node's whole GPUs, discovered once (only when the command asks for some)."""
    if gpus < 0:
        raise ConfigError("--gpus must be 0 or more")
    if not gpus:
        return ()
    from agent.gpu.discover import discover_gpus

    # A GPU in MIG mode is shared out as MIG devices, never handed over whole.
    found = tuple(g for g in discover_gpus(topo).gpus if not g.mig_mode_current)
    if not found:
        raise AllocationError(f"--gpus {gpus}: this node has no NVIDIA GPUs to hand out whole")
    return found


def _go_back(came_from: str | None, pid: int) -> None:
    """Move `pid` back to the cgroup it came from, by path, when that lies outside the layout's root."""
    if came_from is None:
        return  # it came from inside the layout: the engine moves it back under its lock
    try:
        move_pid_to_dir(came_from, pid)
    except TopoletError as exc:  # gone meanwhile: the engine falls back to the layout's root
        print(f"topolet exec: cannot return to {came_from}: {exc}", file=sys.stderr)


def _run_child(argv: list[str], env: dict[str, str]) -> int:
    """Run the command, forwarding termination signals; return its exit status as a shell would."""
    try:
        child = subprocess.Popen(argv, env={**os.environ, **env})
    except OSError as exc:
        print(f"topolet exec: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126

    def forward(signum: int, _frame: FrameType | None) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    code = child.wait()
    return 128 - code if code < 0 else code


def run_exec(args: argparse.Namespace) -> int:
    """Allocate exclusive CPUs, pin this process there (cgroup, affinity, mempolicy), run the command."""
    argv = _command(args)
    started = time.perf_counter()
    if args.cpus < 0:
        raise ConfigError("--cpus must be 0 (shared pool) or more")
    gpus: int = args.gpus
    if gpus and args.cpus == 0:
        raise ConfigError("--gpus needs exclusive CPUs: give --cpus N with N of 1 or more")
    topo = discover("/")
    layout = detect_layout(args.cgroup_root)
    state_file = StateFile(args.state_dir)
    # Without --reserved-cpus, the reservation the agent recorded stands (else the agent's default).
    given = args.reserved_cpus is not None
    reserved = CPUSet.parse(args.reserved_cpus) if given else DEFAULT_RESERVED
    try:
        inventory = _gpu_inventory(gpus, topo)
    except AllocationError:  # no GPUs here to hand out: the node cannot satisfy it
        append_event(args.state_dir, Event("refused", reason=CAPACITY))
        raise
    # Every allocation this process releases (its own, or dead ones it reaps) is counted by the agent.
    engine = PinningEngine(topo, layout, state_file, reserved, gpus=inventory,
                           defer_rebuild=True, keep_recorded_reserved=not given,
                           on_release=lambda _id: append_event(args.state_dir, Event("released")))
    me = os.getpid()
    # Where this process goes back to when it is done.  A --cgroup-root below the cgroup it runs in
    # leaves that cgroup outside the layout: it goes back there by path, since the layout's root may
    # hold no process (cgroup v2's no-internal-processes rule, once topolet's cgroups are below it).
    origin = cgroup_of_pid(layout, me)
    came_from = cgroup_dir_of_pid(layout, me) if origin is None else None
    origin = origin or ""
    name = unique_id("exec", me)
    if args.cpus == 0:
        rel = engine.join_shared(name, me)
        try:
            return _run_child(argv, {})
        finally:
            _go_back(came_from, me)
            engine.leave_shared(rel, me, return_to=origin)
    writes_before = state_file.writes
    try:
        request = Request(args.cpus, args.numa_policy, args.smt)
    except AllocationError:
        append_event(args.state_dir, Event("refused", reason=INVALID))
        raise
    try:
        alloc = engine.allocate(name, request, Owner.of_process(me), memory_binding=args.memory_binding,
                                policy=f"exec {args.numa_policy}/{args.smt}", gpus=gpus)
    except AllocationRefused as exc:
        append_event(args.state_dir, Event("refused", state_writes=state_file.writes - writes_before,
                                           reason=exc.reason))
        raise
    except TopoletError:  # the state or a cgroup could not be written: ours to fix, not the request's
        append_event(args.state_dir, Event("error", state_writes=state_file.writes - writes_before))
        raise
    try:
        engine.join(alloc, me)
        set_affinity(0, alloc.cpus)
        if alloc.mems:
            bind_memory(alloc.mems, "bind")
        append_event(args.state_dir, Event("allocated", time.perf_counter() - started,
                                           state_file.writes - writes_before))
        env = visible_devices_env([g for g in engine.gpus if g.pci_address in alloc.gpus])
        env.update({"TOPOLET_CPUS": alloc.cpus.cpulist(), "TOPOLET_ALLOCATION": alloc.id})
        if alloc.gpus:
            env["TOPOLET_GPUS"] = ",".join(alloc.gpus)
        return _run_child(argv, env)
    finally:
        writes_before = state_file.writes
        _go_back(came_from, me)  # its owner (this process) still runs: nobody reaps it meanwhile
        try:
            engine.release(alloc.id, leaving_pid=me, return_to=origin)
        except TopoletError as exc:  # the next reconcile frees it; the command's status still counts
            print(f"topolet exec: release of {alloc.id} deferred: {exc}", file=sys.stderr)
        # The release itself was counted as it was committed (on_release), by whoever committed it.
        append_event(args.state_dir, Event("", state_writes=state_file.writes - writes_before))


def _alive(layout: CgroupLayout | None, alloc: Allocation) -> bool:
    """`allocation_in_use`, where an unreadable cgroup counts as idle (status only reports)."""
    try:
        return allocation_in_use(layout, alloc)
    except TopoletError:
        return False


def status_data(state_dir: str, cgroup_root: str | None = None) -> dict[str, Any]:
    """Allocations and free CPUs per NUMA node, from the state file (read-only)."""
    topo = discover("/")
    state_file = StateFile(state_dir)
    state = state_file.load(missing_ok=True)
    found = os.path.lexists(state_file.path)  # else nothing was ever allocated through this folder
    allowed = topo.cpus
    layout: CgroupLayout | None = None
    try:
        layout = detect_layout(cgroup_root)
        allowed &= read_cpus(layout, "")
    except TopoletError:
        pass  # no cpuset controller here: every online CPU is allowed
    # What the next exec or agent start would refuse (and rebuild) is not reported as true here.
    check_live(state, cpus=topo.cpus | topo.offline, mems=CPUSet(n.id for n in topo.numa_nodes),
               parent=layout.parent if layout is not None else DEFAULT_PARENT)
    rows = usage_of(topo, allowed, state)
    return {
        "state_file": state_file.path,
        "state_found": found,
        "generation": state.generation,
        "reserved": state.reserved.cpulist(),
        "numa": [{"numa": u.numa, "cpus": u.total.cpulist(), "reserved": u.reserved.cpulist(),
                  "exclusive": u.exclusive.cpulist(),
                  "free": (u.shared - u.reserved).cpulist(), "free_count": len(u.shared - u.reserved)}
                 for u in rows],
        "allocations": [{"id": a.id, "cpus": a.cpus.cpulist(), "mems": a.mems.cpulist(), "cgroup": a.cgroup,
                         "gpus": list(a.gpus), "pid": a.owner.pid, "pod_uid": a.owner.pod_uid,
                         "policy": a.policy,
                         "alive": _alive(layout, a)}
                        for a in state.allocations],
    }


def run_status(args: argparse.Namespace) -> int:
    """Entry point of `topolet status`."""
    data = status_data(args.state_dir, args.cgroup_root)
    if args.format == "json":
        print(json.dumps(data, indent=1))
        return 0
    print(f"{'NUMA':>4}  {'CPUs':<16} {'reserved':<10} {'exclusive':<16} {'free':<16}")
    for row in data["numa"]:
        print(f"{row['numa']:>4}  {row['cpus']:<16} {row['reserved'] or '-':<10} "
              f"{row['exclusive'] or '-':<16} {row['free'] or '-':<16}")
    if not data["state_found"]:
        print(f"\nno state file at {data['state_file']}: nothing allocated there yet (`topolet exec` and "
              "the agent write it; --state-dir to look in another folder)")
        return 0
    print(f"\n{len(data['allocations'])} allocation(s)")
    for a in data["allocations"]:
        # State fields are text from a file: escape what a terminal would act on.
        owner = f"pod {printable(a['pod_uid'])}" if a["pod_uid"] else f"pid {a['pid']}"
        print(f"  {printable(a['id']):<28} cpus {a['cpus']:<12} mems {a['mems'] or '-':<6} {owner}"
              f"{'' if a['alive'] else ' (gone)'}  {printable(a['policy'])}")
    return 0
