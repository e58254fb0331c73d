"""The allocator on topologies discovered from real-machine dumps: offline CPUs, memory-only and GPU
memory nodes, SMT4, many small NUMA nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.alloc.exclusive import allocate
from agent.alloc.request import Request
from agent.api.policies import ALLOC_NUMA_POLICIES, SMT_POLICIES
from agent.errors import AllocationError
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology

DUMPS = ["128ia64-17n4s2c", "16em64t-4s2c2t-offlines", "256ppc-8n8s4t", "nvidiagpunumanodes",
         "fakeheterocpunuma"]


@pytest.fixture(scope="module", params=DUMPS)
def machine(request: pytest.FixtureRequest, dump_root: Callable[[str], Path]) -> Topology:
    return discover(str(dump_root(request.param)))


@pytest.mark.slow  # five real machines, 60 examples each (CONTRIBUTING.md, Test tiers)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_answers_on_real_machines_are_valid(machine: Topology, data: st.DataObject) -> None:
    free = CPUSet.from_mask(data.draw(st.integers(0, machine.cpus.mask)) & machine.cpus.mask)
    request = Request(cpus=data.draw(st.integers(0, len(machine.cpus))),
                      numa_policy=data.draw(st.sampled_from(ALLOC_NUMA_POLICIES)),
                      smt=data.draw(st.sampled_from(SMT_POLICIES)))
    try:
        got = allocate(machine, free, request)
    except AllocationError as exc:
        assert str(exc)
        return
    assert len(got) == request.cpus
    assert got <= free
    if request.numa_policy == "single-numa-node":
        assert len({machine.numa_of(c) for c in got}) <= 1
    if request.smt == "full-cores":
        for core in machine.cores:
            assert not core.cpus & got or core.cpus & machine.cpus <= got


def test_memory_only_nodes_never_count_as_cpu_nodes(dump_root: Callable[[str], Path]) -> None:
    topo = discover(str(dump_root("nvidiagpunumanodes")))
    memory_only = [n.id for n in topo.numa_nodes if n.memory_only]
    assert memory_only, "the dump is meant to have GPU memory nodes"
    with pytest.raises(AllocationError, match="none of the preferred NUMA nodes"):
        allocate(topo, topo.cpus, Request(cpus=1, numa_policy="single-numa-node",
                                          preferred_numa=frozenset(memory_only)))
