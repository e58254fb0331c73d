"""The one cpulist/cpumask parser (C), through `agent.topology.native` and `CPUSet`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import CPUListError
from agent.topology import native
from agent.topology.cpuset import CPUSet

MAX_CPUS = 1 << 20

CPULIST_ROWS = [
    ("0-3,8,10-15", [0, 1, 2, 3, 8, 10, 11, 12, 13, 14, 15]),
    ("", []),
    ("\n", []),
    ("0\n", [0]),
    ("  7 \t\n", [7]),
    ("0-3\n\x00\x00\x00", [0, 1, 2, 3]),
    ("5,1,3", [1, 3, 5]),
    ("0-2,1-3", [0, 1, 2, 3]),
    ("0 , 2", [0, 2]),
    ("0-9:2/5", [0, 1, 5, 6]),  # kernel pattern: 2 of every 5
    ("0-7:2", [0, 2, 4, 6]),  # stride shorthand
    ("63-65", [63, 64, 65]),
    ("8191", [8191]),  # CPUSet's own bound (the kernel's, agent.topology.cpuset.MAX_CPUS)
]

CPUMASK_ROWS = [
    ("ff,00000001", [0, *range(32, 40)]),
    ("00000000,00000000,0000000f\n", [0, 1, 2, 3]),
    ("", []),
    ("0", []),
    ("00000000", []),
    ("f0\x00\x00", [4, 5, 6, 7]),
    ("80000000,00000000,00000000", [95]),
    ("FFFFFFFF", list(range(32))),
]

BAD_CPULISTS = ["3-1", "1,,2", "1,", ",1", "a", "-1", "1 2", "1-", "0-3:0/4", "0-3:5/4", "0x3",
                "1\x002", "1.5", str(MAX_CPUS), "0-" + str(MAX_CPUS), "99999999999999999999999"]
BAD_CPUMASKS = ["g", "123456789", "ff,,1", ",ff", "ff,", "0x3", "ff 00", "f\x00f"]


@pytest.mark.parametrize(("text", "cpus"), CPULIST_ROWS)
def test_cpulist_table(text: str, cpus: list[int]) -> None:
    assert CPUSet.parse(text) == CPUSet(cpus)


@pytest.mark.parametrize(("text", "cpus"), CPUMASK_ROWS)
def test_cpumask_table(text: str, cpus: list[int]) -> None:
    assert CPUSet.parse_mask(text) == CPUSet(cpus)


@pytest.mark.parametrize("text", BAD_CPULISTS)
def test_bad_cpulist_names_the_text(text: str) -> None:
    with pytest.raises(CPUListError) as err:
        native.parse_cpulist(text)
    assert repr(text) in str(err.value)


@pytest.mark.parametrize("text", BAD_CPUMASKS)
def test_bad_cpumask_names_the_text(text: str) -> None:
    with pytest.raises(CPUListError) as err:
        native.parse_cpumask(text)
    assert repr(text) in str(err.value)


def test_too_large_id_says_so() -> None:
    assert native.parse_cpulist(str(MAX_CPUS - 1)) == 1 << (MAX_CPUS - 1)
    with pytest.raises(CPUListError, match="too large"):
        native.parse_cpulist(str(MAX_CPUS))


def test_non_ascii_and_non_str_are_errors() -> None:
    with pytest.raises(CPUListError):
        native.parse_cpulist("0-3\u00e9")
    with pytest.raises(CPUListError):
        native.parse_cpulist(b"0-3")  # type: ignore[arg-type]


def test_mask_wider_than_the_first_buffer() -> None:
    """Ids past the first buffer (4096 CPUs) make the wrapper retry with the size C asks for."""
    top = MAX_CPUS - 1
    assert native.parse_cpulist(f"0,{top}") == 1 | 1 << top
    words = ["80000000"] + ["00000000"] * (MAX_CPUS // 32 - 1)
    assert native.parse_cpumask(",".join(words)) == 1 << top


def test_mask_with_many_leading_zero_words() -> None:
    words = ["00000000"] * (MAX_CPUS // 32 + 10) + ["00000003"]
    assert native.parse_cpumask(",".join(words)) == 3


cpu_sets = st.sets(st.integers(min_value=0, max_value=5000), max_size=200).map(CPUSet)
dense_sets = st.sets(st.integers(min_value=0, max_value=300)).map(CPUSet)


def kernel_mask(cpus: CPUSet) -> str:
    """Render a set the way the kernel writes a cpumask file (independent of the C formatter)."""
    nwords = max(1, (cpus.mask.bit_length() + 31) // 32)
    return ",".join(f"{(cpus.mask >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(nwords)))


@given(st.one_of(cpu_sets, dense_sets))
def test_cpulist_round_trip(cpus: CPUSet) -> None:
    assert CPUSet.parse(cpus.cpulist()) == cpus


@given(st.one_of(cpu_sets, dense_sets))
def test_cpumask_round_trip(cpus: CPUSet) -> None:
    assert CPUSet.parse_mask(kernel_mask(cpus)) == cpus


@given(st.one_of(cpu_sets, dense_sets), st.sampled_from(["", "\n", "\x00", "\n\x00\x00", " \t"]))
def test_trailing_junk_is_tolerated(cpus: CPUSet, tail: str) -> None:
    assert CPUSet.parse(cpus.cpulist() + tail) == cpus
    assert CPUSet.parse_mask(kernel_mask(cpus) + tail) == cpus


@given(st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 50)), max_size=30))
def test_overlapping_unsorted_ranges(ranges: list[tuple[int, int]]) -> None:
    text = ",".join(f"{lo}-{lo + span}" for lo, span in ranges)
    expected = CPUSet(c for lo, span in ranges for c in range(lo, lo + span + 1))
    assert CPUSet.parse(text) == expected


@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_raises_cpulist_error(text: str) -> None:
    for parse in (native.parse_cpulist, native.parse_cpumask):
        try:
            mask = parse(text)
        except CPUListError:
            continue
        assert mask >= 0
        assert mask.bit_length() <= MAX_CPUS
