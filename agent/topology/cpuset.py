"""`CPUSet`: the one immutable set-of-CPU-ids type, stored as an integer bitmask.

CPU ids are bounded by `MAX_CPUS` (8192, ids 0-8191): Linux numbers CPUs below `nr_cpu_ids`, which
never exceeds the build's `CONFIG_NR_CPUS`, and 8192 is the largest value that option takes on any
architecture (x86_64 with MAXSMP, which the big distributions ship, and powerpc; arm64 stops at
4096).  A larger id is not a CPU but corrupt input, and refusing it keeps every set small enough
that no operation on one can run long or exhaust memory.
"""

from __future__ import annotations

from agent.errors import CPUListError
from agent.topology import bitmask

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections costs start-up time, and `discover` is timed as a whole process
    from collections.abc import Iterable, Iterator

MAX_CPUS = 8192


def _too_large(mask: int) -> CPUListError:
    return CPUListError(f"CPU id {mask.bit_length() - 1} is past the kernel's limit (ids 0-{MAX_CPUS - 1})")


class CPUSet:
    """An immutable, hashable set of CPU ids; set algebra runs on one Python int.

    Parse with `CPUSet.parse("0-3,8")` (cpulist) or `CPUSet.parse_mask("ff,00000001")` (cpumask);
    both go through the C helper, which owns the one parser.  `str()` gives the canonical cpulist.
    """

    __slots__ = ("_mask",)
    _mask: int

    def __init__(self, cpus: Iterable[int] = ()) -> None:
        mask = 0
        for c in cpus:
            if not 0 <= c < MAX_CPUS:
                raise CPUListError(f"CPU id {c} is outside the kernel's range 0-{MAX_CPUS - 1}")
            mask |= 1 << c
        object.__setattr__(self, "_mask", mask)

    @classmethod
    def from_mask(cls, mask: int) -> CPUSet:
        """The set whose CPU ids are the bits of `mask`; raises CPUListError past `MAX_CPUS`."""
        if mask < 0:
            raise CPUListError("negative CPU mask")
        if mask.bit_length() > MAX_CPUS:
            raise _too_large(mask)
        return _of(mask)

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse a kernel cpulist ("0-3,8,10-15:2" ranges; empty means no CPUs)."""
        return _checked(bitmask.parse_cpulist(text), "cpulist", text)

    @classmethod
    def parse_mask(cls, text: str) -> CPUSet:
        """Parse a kernel cpumask ("ff,00000001": comma-separated 32-bit hex words, high first)."""
        return _checked(bitmask.parse_cpumask(text), "cpumask", text)

    @property
    def mask(self) -> int:
        return self._mask

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    def __iter__(self) -> Iterator[int]:
        # One pass over the binary digits: peeling bits off the int would copy it once per CPU.
        bits = bin(self._mask)[:1:-1]  # bit 0 first
        i = bits.find("1")
        while i >= 0:
            yield i
            i = bits.find("1", i + 1)

    def __len__(self) -> int:
        return self._mask.bit_count()

    def __bool__(self) -> bool:
        return self._mask != 0

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and cpu >= 0 and bool(self._mask >> cpu & 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPUSet) and other._mask == self._mask

    def __hash__(self) -> int:
        return hash(self._mask)

    def __or__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask | other._mask)

    def __and__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask & other._mask)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask & ~other._mask)

    def __xor__(self, other: CPUSet) -> CPUSet:
        return _of(self._mask ^ other._mask)

    def __le__(self, other: CPUSet) -> bool:
        return self._mask & ~other._mask == 0

    def __lt__(self, other: CPUSet) -> bool:
        return self <= other and self._mask != other._mask

    def __ge__(self, other: CPUSet) -> bool:
        return other <= self

    def __gt__(self, other: CPUSet) -> bool:
        return other < self

    def union(self, *others: CPUSet) -> CPUSet:
        m = self._mask
        for o in others:
            m |= o._mask
        return _of(m)

    def isdisjoint(self, other: CPUSet) -> bool:
        return self._mask & other._mask == 0

    def min(self) -> int:
        """Lowest CPU id; raises ValueError on the empty set."""
        if not self._mask:
            raise ValueError("min() of an empty CPUSet")
        return (self._mask & -self._mask).bit_length() - 1

    def max(self) -> int:
        if not self._mask:
            raise ValueError("max() of an empty CPUSet")
        return self._mask.bit_length() - 1

    def sorted(self) -> list[int]:
        return list(self)

    def cpulist(self) -> str:
        """Canonical kernel cpulist: ascending ranges, "" for the empty set."""
        bits = bin(self._mask)[:1:-1]  # bit 0 first; each range is a run of ones
        parts: list[str] = []
        start = bits.find("1")
        while start >= 0:
            end = bits.find("0", start)
            if end < 0:
                end = len(bits)
            parts.append(str(start) if end == start + 1 else f"{start}-{end - 1}")
            start = bits.find("1", end)
        return ",".join(parts)

    def __str__(self) -> str:
        return self.cpulist()

    def __repr__(self) -> str:
        return f"CPUSet('{self.cpulist()}')"

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (CPUSet.from_mask, (self._mask,))


def _of(mask: int) -> CPUSet:
    """A CPUSet of a mask already known to be in range (set algebra on CPUSets stays in range)."""
    s = CPUSet.__new__(CPUSet)
    object.__setattr__(s, "_mask", mask)
    return s


def _checked(mask: int, kind: str, text: str) -> CPUSet:
    if mask.bit_length() > MAX_CPUS:
        raise CPUListError(f"invalid {kind} {bitmask.shown(text)}: {_too_large(mask)}")
    return _of(mask)


EMPTY = CPUSet()
