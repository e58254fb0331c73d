"""`record` classes behave as the frozen dataclasses they replace: construction, equality, immutability."""

from __future__ import annotations

import copy
import pickle
import weakref

import pytest

from agent.topology.cpuset import CPUSet
from agent.topology.model import NumaNode, Package, Topology
from agent.topology.record import cached_property, fields_of, is_record, record, replace


def test_positional_keyword_and_default_construction_agree() -> None:
    a = NumaNode(1, CPUSet([0]), 10, 5, (), (10,), False, CPUSet([0]), "")
    b = NumaNode(id=1, cpus=CPUSet([0]), memory_bytes=10, memory_free_bytes=5, hugepages=(),
                 distances=(10,), memory_only=False, local_cpus=CPUSet([0]), tier="", gpu_pci="")
    assert a == b and hash(a) == hash(b)
    assert a.gpu_pci == ""
    assert fields_of(a)[:2] == ("id", "cpus") and is_record(a) and not is_record((1, 2))
    assert repr(Package(2, CPUSet([1, 2]))) == "Package(id=2, cpus=CPUSet('1-2'))"


def test_equality_needs_the_same_class_and_values() -> None:
    p = Package(0, CPUSet([0]))
    assert p != Package(1, CPUSet([0]))
    assert p != (0, CPUSet([0]))
    assert len({p, Package(0, CPUSet([0]))}) == 1


def test_records_are_frozen_and_copies_are_equal() -> None:
    p = Package(0, CPUSet([0]))
    with pytest.raises(AttributeError):
        p.id = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.id  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(p)) == p
    assert copy.deepcopy(p) == p
    assert replace(p, id=4) == Package(4, CPUSet([0])) and p.id == 0


@pytest.mark.parametrize("args,kwargs", [((1,), {}), ((1, CPUSet(), 3), {}), ((1,), {"id": 1}),
                                         ((), {"id": 1, "cpus": CPUSet(), "extra": 2})])
def test_wrong_arguments_raise_type_error(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        Package(*args, **kwargs)  # type: ignore[arg-type]


def test_topology_keeps_its_cached_lookups_and_weak_references() -> None:
    t = Topology(cpus=CPUSet([0, 1]), offline=CPUSet(), packages=(Package(0, CPUSet([0, 1])),), cores=(),
                 caches=(), numa_nodes=(), kinds=(), pci_devices=(), cpu_info=None)  # type: ignore[arg-type]
    assert t.warnings == ()
    assert t.package_of(1) == 0 and t.package_of(1) == 0  # the second answer comes from the cache
    assert weakref.ref(t)() is t


@record
class _Box:
    n: int

    @cached_property
    def double(self) -> list[int]:
        """Twice n, in a new list each time it is computed."""
        return [2 * self.n]


def test_a_cached_property_is_computed_once_per_instance_and_is_no_field() -> None:
    a, b = _Box(1), _Box(2)
    assert a.double is a.double and a.double == [2] and b.double == [4]
    assert vars(a) == {"double": [2]}
    assert a == _Box(1) and fields_of(a) == ("n",)
    assert _Box.double.__doc__ == "Twice n, in a new list each time it is computed."
    with pytest.raises(AttributeError):
        a.double = [3]  # type: ignore[misc]
