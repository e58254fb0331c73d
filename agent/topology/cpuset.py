"""`CPUSet`: the one immutable set-of-CPU-ids type, stored as an integer bitmask."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from agent.errors import CPUListError


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
            if c < 0:
                raise CPUListError(f"negative CPU id {c}")
            mask |= 1 << c
        object.__setattr__(self, "_mask", mask)

    @classmethod
    def from_mask(cls, mask: int) -> CPUSet:
        if mask < 0:
            raise CPUListError("negative CPU mask")
        s = cls.__new__(cls)
        object.__setattr__(s, "_mask", mask)
        return s

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        """Parse a kernel cpulist ("0-3,8,10-15:2" ranges; empty means no CPUs)."""
        from agent.topology import native

        return cls.from_mask(native.parse_cpulist(text))

    @classmethod
    def parse_mask(cls, text: str) -> CPUSet:
        """Parse a kernel cpumask ("ff,00000001": comma-separated 32-bit hex words, high first)."""
        from agent.topology import native

        return cls.from_mask(native.parse_cpumask(text))

    @property
    def mask(self) -> int:
        return self._mask

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    def __iter__(self) -> Iterator[int]:
        m = self._mask
        while m:
            low = m & -m
            yield low.bit_length() - 1
            m ^= low

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
        return CPUSet.from_mask(self._mask | other._mask)

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask & other._mask)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask & ~other._mask)

    def __xor__(self, other: CPUSet) -> CPUSet:
        return CPUSet.from_mask(self._mask ^ other._mask)

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
        return CPUSet.from_mask(m)

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
        parts: list[str] = []
        start = prev = -2
        for c in self:
            if c != prev + 1:
                if start >= 0:
                    parts.append(str(start) if start == prev else f"{start}-{prev}")
                start = c
            prev = c
        if start >= 0:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        return ",".join(parts)

    def __str__(self) -> str:
        return self.cpulist()

    def __repr__(self) -> str:
        return f"CPUSet('{self.cpulist()}')"

    def __reduce__(self) -> tuple[object, tuple[int]]:
        return (CPUSet.from_mask, (self._mask,))


EMPTY = CPUSet()
