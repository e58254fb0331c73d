"""Where the cgroup hierarchies are mounted: the cgroup and cgroup2 entries of a mountinfo table.

`mountinfo_cgroups(text)` parses a mountinfo text into `CgroupMount`s (fstype, mount point, super
options, the mounted subtree's root), unescaping mountinfo's octal escapes; `read_mountinfo(path)`
reads one, raising `EnforcementError` when it cannot.  Used by `agent.enforce.cgroup`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from agent.errors import EnforcementError


def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


class CgroupMount(NamedTuple):
    """One cgroup or cgroup2 mount."""

    fstype: str  # "cgroup" (v1) or "cgroup2"
    point: str  # where it is mounted
    options: frozenset[str]  # its super options (v1: the controllers)
    root: str  # the mounted subtree's place in its hierarchy ("/" for the whole hierarchy)


def mountinfo_cgroups(text: str) -> list[CgroupMount]:
    """Every cgroup/cgroup2 mount of a mountinfo text."""
    found: list[CgroupMount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3 or rf[0] not in ("cgroup", "cgroup2"):
            continue
        found.append(CgroupMount(rf[0], _unescape_mountinfo(lf[4]), frozenset(rf[2].split(",")),
                                 _unescape_mountinfo(lf[3])))
    return found


def read_mountinfo(mountinfo: str) -> list[CgroupMount]:
    """The cgroup mounts of the mountinfo file at `mountinfo`; EnforcementError when it cannot be read."""
    try:
        with open(mountinfo) as f:
            return mountinfo_cgroups(f.read())
    except OSError as exc:
        raise EnforcementError(f"cannot read mount table: {exc.strerror}", mountinfo) from exc
