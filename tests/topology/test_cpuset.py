"""`CPUSet`: ids bounded by the kernel's limit, iteration and cpulists that agree with a plain reference."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import CPUListError
from agent.topology.cpuset import MAX_CPUS, CPUSet

ids = st.sets(st.integers(min_value=0, max_value=MAX_CPUS - 1), max_size=300)


def reference_cpulist(cpus: list[int]) -> str:
    """Ranges of consecutive ids, written independently of CPUSet's own formatter."""
    ranges: list[list[int]] = []
    for c in sorted(cpus):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


@given(ids)
def test_iteration_and_cpulist_match_the_reference(cpus: set[int]) -> None:
    s = CPUSet(cpus)
    assert list(s) == sorted(cpus)
    assert len(s) == len(cpus)
    assert s.cpulist() == reference_cpulist(list(cpus))


def test_the_largest_set_the_kernel_allows_round_trips() -> None:
    top = CPUSet.parse(f"0-{MAX_CPUS - 1}")
    assert list(top) == list(range(MAX_CPUS))
    assert top.cpulist() == f"0-{MAX_CPUS - 1}"
    assert top.max() == MAX_CPUS - 1
    assert list(CPUSet.parse(f"0,{MAX_CPUS - 1}")) == [0, MAX_CPUS - 1]


@pytest.mark.parametrize("text", [str(MAX_CPUS), f"0-{MAX_CPUS}", "0-1048575"])
def test_ids_past_the_kernel_limit_are_refused(text: str) -> None:
    with pytest.raises(CPUListError, match=f"limit \\(ids 0-{MAX_CPUS - 1}\\)"):
        CPUSet.parse(text)


def test_every_constructor_enforces_the_limit() -> None:
    with pytest.raises(CPUListError):
        CPUSet([MAX_CPUS])
    with pytest.raises(CPUListError):
        CPUSet([-1])
    with pytest.raises(CPUListError):
        CPUSet.from_mask(1 << MAX_CPUS)
    with pytest.raises(CPUListError):
        CPUSet.parse_mask("1" + "0" * (MAX_CPUS // 4))  # bit MAX_CPUS of a cpumask
    # unpickling goes through the checked constructor, so a forged pickle cannot carry a huge set
    assert pickle.loads(pickle.dumps(CPUSet([3, 8191]))) == CPUSet([3, 8191])
    rebuild, _ = CPUSet([3]).__reduce__()
    with pytest.raises(CPUListError):
        rebuild(1 << MAX_CPUS)  # type: ignore[operator]


def test_a_huge_input_is_not_echoed_back_whole() -> None:
    text = "0-3," * 250_000 + "x"
    with pytest.raises(CPUListError) as err:
        CPUSet.parse(text)
    assert len(str(err.value)) < 200
