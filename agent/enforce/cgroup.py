"""cgroup cpuset access: find the cpuset hierarchy, read and write cpusets, create cgroups, move tasks.

Paths handed to these functions are relative to the cpuset controller's root ("topolet/job1",
"kubepods.slice/..."); `CgroupLayout.abspath` turns one into a file-system path.  Nothing here orders
writes across several cgroups: `agent.enforce.apply` does that.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass

from agent.enforce.mountinfo import mountinfo_cgroups, read_mountinfo
from agent.errors import EnforcementError
from agent.topology.cpuset import CPUSet

log = logging.getLogger(__name__)

DEFAULT_PARENT = "topolet"
SHARED_NAME = "shared"
"""Workload name reserved for the shared-pool cgroup (`<parent>/shared`), which holds shared workloads."""

_FILES: dict[int, dict[str, str]] = {
    1: {
        "cpus": "cpuset.cpus",
        "mems": "cpuset.mems",
        "effective_cpus": "cpuset.effective_cpus",
        "effective_mems": "cpuset.effective_mems",
    },
    2: {
        "cpus": "cpuset.cpus",
        "mems": "cpuset.mems",
        "effective_cpus": "cpuset.cpus.effective",
        "effective_mems": "cpuset.mems.effective",
    },
}

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,254}")


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """Where the cpuset controller is mounted (`root`, v1 or v2) and where topolet's cgroups live."""

    version: int  # 1 or 2
    root: str  # absolute path of the hierarchy holding the cpuset controller
    parent: str = DEFAULT_PARENT  # relative path under which workload cgroups are made

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise EnforcementError(f"unknown cgroup version {self.version}", self.root)
        if not self.parent or clean_path(self.parent) != self.parent:
            # An empty parent would make every cgroup of the hierarchy look like a workload.
            raise EnforcementError(f"invalid topolet parent cgroup {self.parent!r}", self.root)

    def abspath(self, rel: str) -> str:
        """The file-system path of cgroup `rel`."""
        rel = clean_path(rel)
        return os.path.join(self.root, rel) if rel else self.root

    def file(self, rel: str, key: str) -> str:
        """The file-system path of cpuset file `key` ("cpus", "mems", "effective_cpus", ...) of `rel`."""
        if self.version == 2 and key in ("cpus", "mems") and not clean_path(rel):
            # v2's root cgroup has no cpuset.cpus/mems: it always holds every CPU and node, which
            # only its effective files say.
            key = f"effective_{key}"
        return os.path.join(self.abspath(rel), _FILES[self.version][key])

    @property
    def shared_path(self) -> str:
        """Relative path of the cgroup that holds shared-pool workloads."""
        return f"{self.parent}/{SHARED_NAME}"

    def workload_path(self, name: str, *, shared: bool = False) -> str:
        """Relative path of workload `name`: `<parent>/<name>`, or `<parent>/shared/<name>` if shared."""
        if not _NAME_RE.fullmatch(name) or (name == SHARED_NAME and not shared):
            raise EnforcementError(f"invalid workload name {name!r}")
        return f"{self.shared_path if shared else self.parent}/{name}"


def clean_path(rel: str) -> str:
    """Normalise a relative cgroup path ("/a/b/" -> "a/b"); refuse "." and ".." components."""
    parts = [p for p in rel.strip().strip("/").split("/") if p]
    for p in parts:
        if p in (".", "..") or "\0" in p:
            raise EnforcementError(f"invalid cgroup path {rel!r}")
    return "/".join(parts)


def parent_of(rel: str) -> str:
    """The parent's relative path ("" is the hierarchy root)."""
    rel = clean_path(rel)
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def depth_of(rel: str) -> int:
    """Number of path components (the root has depth 0)."""
    rel = clean_path(rel)
    return rel.count("/") + 1 if rel else 0


# --- layout detection ----------------------------------------------------------------------------

def hierarchy_path(layout: CgroupLayout, mountinfo: str = "/proc/self/mountinfo") -> str:
    """Where `layout.root` sits inside its cgroup hierarchy, as runtimes spell cgroup paths ("" at the
    hierarchy's top; "/a/b" below it, e.g. under a kubelet `--cgroup-root`).  A bind mount of a
    subtree counts from the subtree's own place (mountinfo's root field)."""
    holding = [m for m in read_mountinfo(mountinfo)
               if layout.root == m.point or layout.root.startswith(m.point.rstrip("/") + "/")]
    if not holding:
        raise EnforcementError("the cpuset root is on no cgroup mount", layout.root)
    mount = max(holding, key=lambda m: len(m.point))
    below = layout.root[len(mount.point):].strip("/")
    path = "/".join(part for part in (mount.root.strip("/"), below) if part)
    return f"/{path}" if path else ""


def _v2_has_cpuset(root: str) -> bool:
    try:
        with open(os.path.join(root, "cgroup.controllers")) as f:
            return "cpuset" in f.read().split()
    except OSError:
        return False


def detect_layout(
    root: str | None = None,
    *,
    parent: str = DEFAULT_PARENT,
    mountinfo: str = "/proc/self/mountinfo",
) -> CgroupLayout:
    """Find the hierarchy with the cpuset controller (v1 mount, or v2 with cpuset), or check `root`."""
    if root is not None:
        if os.path.exists(os.path.join(root, "cgroup.controllers")):
            if not _v2_has_cpuset(root):
                raise EnforcementError("cgroup v2 root without the cpuset controller", root)
            return CgroupLayout(2, root, parent)
        if os.path.exists(os.path.join(root, "cpuset.cpus")):
            return CgroupLayout(1, root, parent)
        raise EnforcementError("not a cpuset cgroup root", root)
    mounts = read_mountinfo(mountinfo)
    # A controller is bound to one hierarchy at a time, so at most one mount below qualifies.
    for m in mounts:
        if m.fstype == "cgroup" and "cpuset" in m.options:
            return CgroupLayout(1, m.point, parent)
    for m in mounts:
        if m.fstype == "cgroup2" and _v2_has_cpuset(m.point):
            return CgroupLayout(2, m.point, parent)
    raise EnforcementError("no cgroup hierarchy with the cpuset controller is mounted", mountinfo)


# --- file access ---------------------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise EnforcementError(f"cannot read: {exc.strerror}", path) from exc


_REFUSAL_HINTS = {
    1: " (outside the parent's set, narrower than a child's, or offline)",
    # v2 intersects with the parent instead of refusing; what it refuses is taking CPUs that a
    # sibling partition root holds exclusively.
    2: " (a sibling partition root holds some of these CPUs exclusively, or they are offline)",
}


def _write(path: str, value: str, refusal_hint: str = _REFUSAL_HINTS[1]) -> None:
    # os.write, not a buffered file: the kernel's refusal must surface here, not at close().
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise EnforcementError(f"cannot open for writing: {exc.strerror}", path) from exc
    try:
        os.write(fd, (value + "\n").encode())
    except OSError as exc:
        hint = ""
        if exc.errno == errno.ENOSPC:
            hint = " (the cpuset has no cpus or mems)"
        elif exc.errno == errno.EBUSY and os.path.basename(path) == "cgroup.procs":
            # v2's "no internal processes" rule (the hierarchy root is exempt).
            hint = " (cgroup v2 puts no process in a cgroup that enables controllers for its children)"
        elif exc.errno == errno.EINVAL and os.path.basename(path).startswith("cpuset."):
            hint = refusal_hint
        raise EnforcementError(f"kernel refused {value!r}: {exc.strerror}{hint}", path) from exc
    finally:
        os.close(fd)


def _parse_set(text: str) -> CPUSet:
    return CPUSet.parse(text.strip())


def _read_set(layout: CgroupLayout, rel: str, key: str) -> CPUSet:
    path = layout.file(rel, key)
    try:
        return _parse_set(_read(path))
    except EnforcementError:
        if layout.version == 2 and os.path.isdir(layout.abspath(rel)) and not os.path.exists(path):
            # v2 hands a cgroup the cpuset files only when its parent enables the controller for
            # its children; a kubelet or runtime that did not leaves nothing here to pin.
            raise EnforcementError("the cpuset controller is not enabled for this cgroup "
                                   "(its parent's cgroup.subtree_control lacks cpuset)", path) from None
        raise


def read_cpus(layout: CgroupLayout, rel: str, *, effective: bool = False) -> CPUSet:
    """A cgroup's configured (or effective) cpus.  In v2 an empty configured set means "inherit"."""
    return _read_set(layout, rel, "effective_cpus" if effective else "cpus")


def read_mems(layout: CgroupLayout, rel: str, *, effective: bool = False) -> CPUSet:
    """A cgroup's configured (or effective) memory nodes."""
    return _read_set(layout, rel, "effective_mems" if effective else "mems")


def read_cpuset(layout: CgroupLayout, rel: str, *, effective: bool = False) -> tuple[CPUSet, CPUSet]:
    """(cpus, mems) of a cgroup."""
    return read_cpus(layout, rel, effective=effective), read_mems(layout, rel, effective=effective)


def read_partition(layout: CgroupLayout, rel: str) -> str:
    """A v2 cgroup's `cpuset.cpus.partition` ("member", "root", "isolated", "root invalid (...)");
    "member" on v1 and for the v2 root, which have no such file."""
    if layout.version == 1 or not clean_path(rel):
        return "member"
    return _read(os.path.join(layout.abspath(rel), "cpuset.cpus.partition")).strip()


def write_set(layout: CgroupLayout, rel: str, key: str, value: CPUSet) -> None:
    """Write one cpuset file ("cpus" or "mems") of one cgroup, as it is: no ordering, no checks."""
    if key not in ("cpus", "mems"):
        raise EnforcementError(f"not a writable cpuset file: {key}")
    _write(layout.file(rel, key), value.cpulist(), _REFUSAL_HINTS[layout.version])


def write_cpuset(layout: CgroupLayout, rel: str, cpus: CPUSet, mems: CPUSet | None = None) -> None:
    """Write one cgroup's cpus (and mems); the kernel refuses values that break its parent/child rules."""
    write_set(layout, rel, "cpus", cpus)
    if mems is not None:
        write_set(layout, rel, "mems", mems)


def read_procs(layout: CgroupLayout, rel: str) -> list[int]:
    """Process ids (thread-group leaders) in a cgroup, ascending."""
    text = _read(os.path.join(layout.abspath(rel), "cgroup.procs"))
    try:
        return sorted({int(tok) for tok in text.split()})
    except ValueError as exc:
        raise EnforcementError("unparsable cgroup.procs", layout.abspath(rel)) from exc


def at_own_namespace_root(proc_cgroup: str = "/proc/self/cgroup") -> bool:
    """Whether this process sits at the root of its cgroup v2 namespace (`0::/`), as a container does
    that its runtime gave a private cgroup namespace (containerd and runc do on v2).

    Where the v2 hierarchy is mounted with nsdelegate (systemd always mounts it so), the kernel
    refuses this process every write to that cgroup's files (EPERM), its cpuset included.
    """
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    return "0::/" in lines


def move_pid(layout: CgroupLayout, rel: str, pid: int) -> None:
    """Move process `pid` (all its threads) into cgroup `rel`."""
    if pid <= 0:
        raise EnforcementError(f"invalid pid {pid}", layout.abspath(rel))
    _write(os.path.join(layout.abspath(rel), "cgroup.procs"), str(pid))


def move_pid_to_dir(directory: str, pid: int) -> None:
    """Move process `pid` into the cgroup at file-system path `directory` (one outside any layout's
    root, such as the cgroup a process came from)."""
    if pid <= 0:
        raise EnforcementError(f"invalid pid {pid}", directory)
    if not os.path.isfile(os.path.join(directory, "cgroup.procs")):
        raise EnforcementError("not a cgroup", directory)
    _write(os.path.join(directory, "cgroup.procs"), str(pid))


def exists(layout: CgroupLayout, rel: str) -> bool:
    """Whether cgroup `rel` exists."""
    return os.path.isdir(layout.abspath(rel))


def list_children(layout: CgroupLayout, rel: str) -> list[str]:
    """Relative paths of the direct child cgroups of `rel`, sorted."""
    base = clean_path(rel)
    try:
        names = sorted(e.name for e in os.scandir(layout.abspath(base)) if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise EnforcementError(f"cannot list: {exc.strerror}", layout.abspath(base)) from exc
    return [f"{base}/{n}" if base else n for n in names]


def _enable_v2_cpuset(layout: CgroupLayout, rel: str) -> None:
    # v2 hands the cpuset files to a child only when its parent lists +cpuset in subtree_control.
    control = os.path.join(layout.abspath(rel), "cgroup.subtree_control")
    if "cpuset" not in _read(control).split():
        _write(control, "+cpuset")


def cgroup_of_pid(layout: CgroupLayout, pid: int, *, proc: str = "/proc",
                  mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The cgroup of `pid` in the cpuset hierarchy, relative to `layout.root`; None when it lies
    outside `layout.root` or cannot be read (the process is gone)."""
    absolute = cgroup_dir_of_pid(layout, pid, proc=proc, mountinfo=mountinfo)
    if absolute is None:
        return None
    rel = os.path.relpath(absolute, layout.root)
    if rel == ".":
        return ""
    return None if rel.startswith("..") else clean_path(rel)


def cgroup_dir_of_pid(layout: CgroupLayout, pid: int, *, proc: str = "/proc",
                      mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The file-system path of `pid`'s cgroup in the hierarchy of `layout` (inside `layout.root` or
    not); None when it cannot be read (the process is gone) or that hierarchy is not mounted."""
    try:
        with open(f"{proc}/{pid}/cgroup") as f:
            lines = f.read().splitlines()
        with open(mountinfo) as f:
            mounts = mountinfo_cgroups(f.read())
    except OSError:
        return None
    path = None
    for line in lines:
        _, controllers, where = (line.split(":", 2) + ["", ""])[:3]
        if (layout.version == 1 and "cpuset" in controllers.split(",")) or \
                (layout.version == 2 and line.startswith("0::")):
            path = where
            break
    if path is None:
        return None
    for m in mounts:
        if (layout.version == 1 and m.fstype == "cgroup" and "cpuset" in m.options) or \
                (layout.version == 2 and m.fstype == "cgroup2"):
            return os.path.normpath(os.path.join(m.point, path.lstrip("/")))
    return None


def create_cgroup(
    layout: CgroupLayout, rel: str, cpus: CPUSet | None = None, mems: CPUSet | None = None
) -> str:
    """Create cgroup `rel` and any missing ancestors; return its clean relative path.

    v1 starts a new cgroup with empty cpus and mems, which no task may join: new ancestors get their
    parent's cpus and mems, the new leaf its parent's mems and the given `cpus`/`mems`.  Existing
    cgroups are left as they are (apart from the given values).
    """
    rel = clean_path(rel)
    if not rel:
        raise EnforcementError("cannot create the hierarchy root", layout.root)
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        up = "/".join(parts[: i - 1])
        leaf = i == len(parts)
        if layout.version == 2:
            _enable_v2_cpuset(layout, up)
        try:
            os.mkdir(layout.abspath(sub))
        except FileExistsError:
            continue
        except OSError as exc:
            raise EnforcementError(f"cannot create cgroup: {exc.strerror}", layout.abspath(sub)) from exc
        if layout.version == 1:
            up_cpus, up_mems = read_cpuset(layout, up)
            write_set(layout, sub, "mems", up_mems)
            if not leaf:
                write_set(layout, sub, "cpus", up_cpus)
    if mems is not None:
        write_set(layout, rel, "mems", mems)
    if cpus is not None:
        write_set(layout, rel, "cpus", cpus)
    return rel


def remove_cgroup(layout: CgroupLayout, rel: str, *, move_procs_to: str | None = None) -> bool:
    """Remove cgroup `rel` (a leaf); move its processes to `move_procs_to` first if given.

    Returns False when it did not exist.  Raises EnforcementError if processes remain in it.
    """
    rel = clean_path(rel)
    if not rel:
        raise EnforcementError("cannot remove the hierarchy root", layout.root)
    if not exists(layout, rel):
        return False
    if list_children(layout, rel):
        raise EnforcementError("cgroup has child cgroups", layout.abspath(rel))
    # Processes may fork while we move them, and an exiting one lingers briefly: retry a few times.
    for attempt in range(50):
        if move_procs_to is not None:
            for pid in read_procs(layout, rel):
                try:
                    move_pid(layout, move_procs_to, pid)
                except EnforcementError:
                    if os.path.exists(f"/proc/{pid}"):
                        raise
        try:
            os.rmdir(layout.abspath(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno != errno.EBUSY or attempt == 49:
                raise EnforcementError(f"cannot remove cgroup: {exc.strerror}", layout.abspath(rel)) from exc
        if move_procs_to is None and read_procs(layout, rel):
            raise EnforcementError("cgroup still has processes", layout.abspath(rel))
        time.sleep(0.01)
    raise EnforcementError("cannot remove cgroup", layout.abspath(rel))
