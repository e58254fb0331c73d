"""The C helper's cpulist/cpumask parsers and its word arrays, as plain Python ints.

The bottom of `agent.topology`: it imports only the cffi module, so `cpuset` (which parses through
it), `raw` and `native` (which hands `CPUSet`s out of the scan) all build on it and data flows one way:
`bitmask` → `cpuset` → `raw` → `native` → `discover`.
"""

from __future__ import annotations

import errno
import sys

import agent._native as _native
from agent.errors import CPUListError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time, and `discover` is timed as a whole process
    from typing import Any

ffi: Any = _native.ffi
lib: Any = _native.lib

WORD = 8
FIRST_WORDS = 64  # 4096 CPUs: enough for one call on nearly every machine
_LITTLE = sys.byteorder == "little"


def words_to_int(data: bytes) -> int:
    """A bitmap of native-endian uint64 words (lowest word first) as one int."""
    if _LITTLE:
        return int.from_bytes(data, "little")
    mask = 0
    for i in range(len(data) // WORD - 1, -1, -1):
        mask = mask << 64 | int.from_bytes(data[i * WORD : (i + 1) * WORD], sys.byteorder)
    return mask


def int_to_words(mask: int) -> tuple[Any, int]:
    """One int as a cffi uint64 word array and its length in words."""
    nwords = max(1, (mask.bit_length() + 63) // 64)
    buf = ffi.new("uint64_t[]", nwords)
    if _LITTLE:
        ffi.memmove(buf, mask.to_bytes(nwords * WORD, "little"), nwords * WORD)
    else:
        for i in range(nwords):
            buf[i] = mask >> (64 * i) & 0xFFFFFFFFFFFFFFFF
    return buf, nwords


def errname(code: int) -> str:
    """The errno name of `code` ("ENOENT"), or "E<code>" when it has none."""
    return errno.errorcode.get(code, f"E{code}")


def shown(text: object) -> str:
    """`text` for an error message, cut short so a huge input is not echoed back whole."""
    r = repr(text)
    return r if len(r) <= 64 else r[:60] + "..."


def _parse(fn: Any, kind: str, text: str) -> int:
    if not isinstance(text, str):
        raise CPUListError(f"invalid {kind} {shown(text)}: not a string")
    try:
        data = text.encode("ascii")
    except UnicodeEncodeError:
        raise CPUListError(f"invalid {kind} {shown(text)}: not ASCII text") from None
    cap = FIRST_WORDS
    nwords = ffi.new("size_t *")
    while True:
        buf = ffi.new("uint64_t[]", cap)
        rc = fn(data, len(data), buf, cap, nwords)
        if rc != errno.ENOSPC:
            break
        cap = nwords[0]
    if rc:
        why = "CPU id too large" if rc == errno.ERANGE else "malformed"
        raise CPUListError(f"invalid {kind} {shown(text)}: {why}")
    return words_to_int(ffi.buffer(buf, nwords[0] * WORD)[:])


def parse_cpulist(text: str) -> int:
    """Parse a kernel cpulist ("0-3,8,10-15") into a CPU bitmask; raises CPUListError."""
    return _parse(lib.topo_parse_cpulist, "cpulist", text)


def parse_cpumask(text: str) -> int:
    """Parse a kernel cpumask ("ff,00000001") into a CPU bitmask; raises CPUListError."""
    return _parse(lib.topo_parse_cpumask, "cpumask", text)
