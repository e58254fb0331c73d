"""`topolet alloc`: run the allocator over a file of JSON-lines requests, one JSON answer per line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.alloc.topology_file import load_topology
from agent.errors import AllocationError, CPUListError, TopoletError
from agent.topology.cpuset import EMPTY, CPUSet
from agent.topology.model import Topology


def parse_request(line: str) -> tuple[CPUSet, Request]:
    """One request line → (free set, Request); AllocationError says what is wrong with the line."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise AllocationError(f"request is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise AllocationError("request must be a JSON object")
    unknown = set(data) - {"free", "cpus", "numa_policy", "smt", "reserved", "preferred_numa"}
    if unknown:
        raise AllocationError(f"unknown request field(s): {', '.join(sorted(unknown))}")
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
    if not isinstance(cpus, int) or isinstance(cpus, bool):
        raise AllocationError(f"cpus must be a non-negative integer, got {cpus!r}")
    return free, Request(cpus=cpus, numa_policy=data.get("numa_policy", "best-effort"),
                         smt=data.get("smt", "any"), preferred_numa=preferred, reserved=reserved)


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
    """The answer object for one request line: {"cpus": cpulist} or {"error": why}."""
    try:
        free, request = parse_request(line)
        return {"cpus": allocate(topology, free, request).cpulist()}
    except TopoletError as exc:
        return {"error": str(exc)}


def answers(topology: Topology, lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Answers for each non-blank request line, in order."""
    for line in lines:
        if line.strip():
            yield answer(topology, line)


def run_alloc(args: argparse.Namespace) -> int:
    """Entry point of `topolet alloc`."""
    topology = load_topology(args.topology, args.name)
    out: TextIO = sys.stdout
    if args.requests == "-":
        return _stream(topology, sys.stdin, out)
    try:
        f = open(args.requests, encoding="utf-8")  # noqa: SIM115 - closed below, after streaming
    except OSError as exc:
        raise TopoletError(f"cannot read requests: {exc.strerror}: {args.requests}") from exc
    with f:
        return _stream(topology, f, out)


def _stream(topology: Topology, lines: Iterable[str], out: TextIO) -> int:
    for a in answers(topology, lines):
        out.write(json.dumps(a) + "\n")
        out.flush()
    return 0
