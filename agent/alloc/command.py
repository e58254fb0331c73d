"""`topolet alloc`: run the allocator over a file of JSON-lines requests, one JSON answer per line.

Every non-blank request line gets exactly one answer line, `{"cpus": cpulist}` or `{"error": why}`,
and the stream goes on after a bad one: a line that is not UTF-8, not JSON, nests too deeply, or is
longer than `MAX_LINE_BYTES` (its excess is skipped, never held) is an error answer like any other.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any, TextIO

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.topology_file import clip, excerpt, load_topology, open_input
from agent.api.policies import DEFAULT_SMT, NumaPolicy
from agent.errors import AllocationError, CPUListError, TopoletError
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology

# A request holds a few cpulists.  The longest a kernel allows (every other CPU of an 8,192-CPU
# machine, ranges no help) is about 20 KiB, so three of them fit with room to spare; a longer line
# is answered as too long and never decoded.
MAX_LINE_BYTES = 256 << 10
_CHUNK = 1 << 16


def parse_request(line: str) -> tuple[CPUSet, Request]:
    """One request line → (free set, Request); AllocationError says what is wrong with the line."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise AllocationError(f"request is not JSON ({exc})") from exc
    except RecursionError as exc:
        raise AllocationError("request nests too deeply to be a request") from exc
    if not isinstance(data, dict):
        raise AllocationError("request must be a JSON object")
    unknown = set(data) - {"free", "cpus", "numa_policy", "smt", "reserved", "preferred_numa"}
    if unknown:
        names = ", ".join(clip(k, 40) for k in sorted(unknown)[:5])
        raise AllocationError(f"unknown request field(s): {names}{', ...' if len(unknown) > 5 else ''}")
    free = _cpulist(data, "free", required=True)
    reserved = _cpulist(data, "reserved", required=False)
    preferred = data.get("preferred_numa")
    if preferred is not None:
        if not isinstance(preferred, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in preferred):
            raise AllocationError("preferred_numa must be a list of NUMA node ids")
        preferred = frozenset(preferred)
    for key in ("numa_policy", "smt"):
        if key in data and not isinstance(data[key], str):
            raise AllocationError(f"{key} must be a string")
    cpus = data.get("cpus")
    if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 0:
        raise AllocationError(f"cpus must be a non-negative integer, got {excerpt(cpus)}")
    return free, Request(cpus=cpus, numa_policy=data.get("numa_policy", NumaPolicy.BEST_EFFORT.value),
                         smt=data.get("smt", DEFAULT_SMT), preferred_numa=preferred, reserved=reserved)


def _cpulist(data: dict[str, Any], key: str, required: bool) -> CPUSet:
    value = data.get(key)
    if value is None and not required:
        return EMPTY
    if not isinstance(value, str):
        raise AllocationError(f"{key} must be a cpulist string")
    try:
        return CPUSet.parse(value)
    except CPUListError as exc:
        raise AllocationError(f"{key}: {exc}") from exc


def answer(topology: Topology, line: str) -> dict[str, str]:
    """The answer object for one request line: {"cpus": cpulist} or {"error": why}.

    A request for 0 CPUs is answered with the empty set, as kubelet's CPU manager answers it (its
    replayed tables hold that case), but never silently: the answer carries a `warning`.
    """
    try:
        free, request = parse_request(line)
        if request.cpus == 0:
            return {"cpus": "", "warning": "cpus is 0: nothing allocated"}
        return {"cpus": allocate(topology, free, request).cpulist()}
    except TopoletError as exc:
        return {"error": clip(str(exc))}


def answers(topology: Topology, lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Answers for each non-blank request line, in order."""
    for line in lines:
        if line.strip():
            yield answer(topology, line)


def request_lines(f: IO[bytes]) -> Iterator[str | AllocationError]:
    """Each line of a byte stream decoded, or the AllocationError that stands for it (not UTF-8, too long)."""
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES:
            # Skip the rest of the line a chunk at a time: its length is the sender's to choose.
            skipped = len(raw)
            while not raw.endswith(b"\n"):
                raw = f.readline(_CHUNK)
                if not raw:
                    break
                skipped += len(raw)
            yield AllocationError(f"request line is longer than {MAX_LINE_BYTES} bytes ({skipped})")
            continue
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield AllocationError(f"request is not UTF-8 (byte {exc.start} of the line)")


def run_alloc(args: argparse.Namespace) -> int:
    """Entry point of `topolet alloc`."""
    topology = load_topology(args.topology, args.name)
    out: TextIO = sys.stdout
    if args.requests == "-":
        return _stream(topology, sys.stdin.buffer, out)
    try:
        f = open_input(args.requests)
    except OSError as exc:
        raise TopoletError(f"cannot read requests: {exc.strerror}: {args.requests}") from exc
    with f:
        return _stream(topology, f, out)


def _stream(topology: Topology, f: IO[bytes], out: TextIO) -> int:
    for line in request_lines(f):
        if isinstance(line, AllocationError):
            a = {"error": str(line)}
        elif line.strip():
            a = answer(topology, line)
        else:
            continue
        out.write(json.dumps(a) + "\n")
        out.flush()
    return 0
