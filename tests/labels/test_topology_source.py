"""topolet's own topology labels."""

from __future__ import annotations

from agent.labels import build_labels
from agent.labels.topology import MAX_GROUPS
from tests.labels.machines import empty_machine, machine

T = "topolet.io/"


def ours(labels: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(T): v for k, v in labels.items() if k.startswith(T)}


def test_two_socket_smt_machine() -> None:
    labels = ours(build_labels(machine(sockets=2, cores_per_socket=16, threads=2, l3_per_socket=2)))
    assert labels == {
        "cpu.sockets": "2",
        "cpu.cores": "32",
        "cpu.threads-per-core": "2",
        "numa.nodes": "2",
        "numa.cpu-nodes": "2",
        "cache.l3-groups": "4",
    }


def test_single_socket_without_smt() -> None:
    labels = ours(build_labels(machine(sockets=1, cores_per_socket=8, threads=1)))
    assert labels["cpu.threads-per-core"] == "1"
    assert labels["numa.nodes"] == "1"
    assert labels["cache.l3-groups"] == "1"


def test_hybrid_part_names_its_kinds() -> None:
    topo = machine(cores_per_socket=24, threads=1, kinds=[("cpu_core", 8), ("cpu_atom", 16)])
    labels = ours(build_labels(topo))
    assert labels["cpu.kinds"] == "2"
    assert labels["cpu.kind-cpu_core.count"] == "8"
    assert labels["cpu.kind-cpu_atom.count"] == "16"


def test_one_kind_is_not_hybrid() -> None:
    labels = ours(build_labels(machine(kinds=[("cpu_core", 4)])))
    assert not any(k.startswith("cpu.kind") for k in labels)


def test_kinds_with_blank_or_odd_names_still_label() -> None:
    labels = ours(build_labels(machine(cores_per_socket=4, threads=1, kinds=[("", 2), ("big core", 2)])))
    assert labels["cpu.kind-rank0.count"] == "2"
    assert labels["cpu.kind-big_core.count"] == "2"


def test_memory_tiers() -> None:
    labels = ours(build_labels(machine(sockets=2, memory_only_tiers=["HBM", "CXL", "HBM", ""])))
    assert labels["memory.tiers"] == "CXL-HBM-unknown"
    assert labels["memory.tier-HBM.nodes"] == "2"
    assert labels["memory.tier-CXL.nodes"] == "1"
    assert labels["memory.tier-unknown.nodes"] == "1"
    assert labels["numa.nodes"] == "6"
    assert labels["numa.cpu-nodes"] == "2"


def test_tier_names_cannot_break_the_tier_list() -> None:
    labels = ours(build_labels(machine(memory_only_tiers=["CXL-1", "far mem"])))
    assert labels["memory.tiers"] == "CXL_1-far_mem"
    assert sorted(labels["memory.tiers"].split("-")) == ["CXL_1", "far_mem"]


def test_no_tier_labels_without_memory_only_nodes() -> None:
    labels = ours(build_labels(machine(sockets=2)))
    assert not any(k.startswith("memory.") for k in labels)


def test_label_count_is_bounded() -> None:
    kinds = [(f"k{i}", 1) for i in range(40)]
    tiers = [f"T{i}" for i in range(40)]
    labels = ours(build_labels(machine(cores_per_socket=40, threads=1, kinds=kinds,
                                       memory_only_tiers=tiers)))
    assert sum(k.startswith("cpu.kind-") for k in labels) == MAX_GROUPS
    assert sum(k.startswith("memory.tier-") for k in labels) == MAX_GROUPS
    assert len(labels) <= 6 + 2 * (1 + MAX_GROUPS)


def test_unknown_counts_are_left_out_not_zero() -> None:
    assert ours(build_labels(empty_machine())) == {}
