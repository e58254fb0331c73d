"""The crash-safe state file: every exclusive allocation, recorded before the cgroup change it describes.

Protocol (the caller's; the API makes it the natural order):

    sf = StateFile(folder)
    with sf.lock():                                        # one writer across processes
        state = sf.load_or_rebuild(lambda: rebuild_from_cgroups(layout, reserved))
        state = sf.commit(state.with_allocation(alloc))    # 1. durable record first ...
        apply_with_shared_pool(layout, ...)                # 2. ... then the cgroups follow

A crash before `commit` leaves the old state and untouched cgroups.  A crash after it leaves a state
naming CPUs the cgroups may not have yet: the next start loads it and drift repair brings the
cgroups to it, and an allocation whose owner died (`Owner.process_alive`) is released.  Releasing
runs the same way: commit the state without the allocation, then remove the cgroup and widen the
pool; a workload cgroup the state does not name is garbage to collect.

On disk: `{"version": 1, "checksum": "sha256:<hex>", "body": {...}}`, the checksum taken over the
canonical JSON of the body (sorted keys, no spaces).  Writes go to a temp file in the same folder,
fsync, rename, fsync the folder: a reader sees the old file or the new one, never a torn one.

A checksum proves the file is whole, not that it is true: `check_live` holds a loaded state against
the live machine (its CPUs and memory nodes, topolet's and the kubelet's cgroup trees, init never an
owner), and a state that fails is handled like a corrupt one.  Only a regular file is read as the
state (opened non-blocking, so a FIFO put there cannot hang a reader).  A corrupt file is kept as
`state.json.corrupt-<UTC time>` (the newest `KEEP_CORRUPT` of them) at the moment a commit replaces
it, so a command that fails before committing leaves the folder as it found it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from agent.enforce.cgroup import (
    CgroupLayout,
    clean_path,
    exists,
    list_children,
    read_cpuset,
    read_procs,
)
from agent.enforce.procfs import parent_pid, start_time
from agent.errors import CPUListError, EnforcementError, StateError
from agent.topology.cpuset import EMPTY, CPUSet

log = logging.getLogger(__name__)

VERSION = 1
DEFAULT_FOLDER = "/var/lib/topolet"
STATE_NAME = "state.json"
LOCK_NAME = "state.lock"
REBUILT_POLICY = "rebuilt"
_MAX_BYTES = 16 << 20  # a state file this big is not ours
CORRUPT_PREFIX = f"{STATE_NAME}.corrupt-"
KEEP_CORRUPT = 8  # corrupt copies kept for a post-mortem; a file corrupted in a loop fills no disk
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,254}")
# A held GPU: its PCI address ("0000:18:00.0") or UUID ("GPU-8f6b...", "MIG-...").
_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# A component of the kubelet's pod tree: `kubepods` (cgroupfs), `kubepods.slice`, or a systemd
# slice that nests it under a kubelet --cgroup-root (`kubelet-kubepods-burstable.slice`).
_KUBEPODS_RE = re.compile(r"(?:[^/]*-)?kubepods(?:-[^/]*)?(?:\.slice)?")


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds an allocation: a process (pid + start time, so a recycled pid is told apart) or a
    pod's container; all None when unknown (an allocation rebuilt from an empty cgroup)."""

    pid: int | None = None
    start_time: int | None = None  # clock ticks since boot, /proc/PID/stat field 22
    pod_uid: str | None = None
    container: str | None = None

    def __post_init__(self) -> None:
        if self.pid is not None and (isinstance(self.pid, bool) or self.pid <= 0):
            raise StateError(f"invalid owner pid {self.pid!r}")
        if self.start_time is not None and (self.pid is None or self.start_time < 0):
            raise StateError(f"invalid owner start time {self.start_time!r}")
        for text in (self.pod_uid, self.container):
            if text is not None and not text:
                raise StateError("empty owner pod UID or container")

    @classmethod
    def of_process(cls, pid: int) -> Owner:
        """The owner record of live process `pid`."""
        ticks = start_time(pid)
        if ticks is None:
            raise StateError(f"no process {pid}")
        return cls(pid=pid, start_time=ticks)

    def process_alive(self, proc: str = "/proc") -> bool:
        """Whether the owning process still runs: the same pid with the same start time."""
        return self.pid is not None and self.start_time is not None and (
            start_time(self.pid, proc) == self.start_time
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """One exclusive allocation: its CPUs and memory nodes, the cgroup that holds them, its owner."""

    id: str
    cpus: CPUSet
    mems: CPUSet  # empty: memory not bound
    cgroup: str  # relative to the cpuset controller root
    owner: Owner
    policy: str  # what produced it, e.g. "single-numa-node"; "rebuilt" after a rebuild
    created_at: float  # seconds since the epoch
    gpus: tuple[str, ...] = ()  # whole GPUs held with the CPUs: PCI addresses or UUIDs

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID_RE.fullmatch(self.id):
            raise StateError(f"invalid allocation id {self.id!r}")
        if not isinstance(self.gpus, tuple) or not all(
                isinstance(g, str) and _GPU_RE.fullmatch(g) for g in self.gpus):
            raise StateError(f"allocation {self.id}: invalid GPU list {self.gpus!r}")
        if len(set(self.gpus)) != len(self.gpus):
            raise StateError(f"allocation {self.id} names a GPU twice")
        if not self.cpus:
            raise StateError(f"allocation {self.id} has no CPUs")
        try:
            clean = clean_path(self.cgroup)
        except EnforcementError as exc:
            raise StateError(f"allocation {self.id}: {exc}") from exc
        if not clean or clean != self.cgroup:
            raise StateError(f"allocation {self.id}: cgroup path {self.cgroup!r} is not clean")
        if not self.policy:
            raise StateError(f"allocation {self.id} has no policy")
        if not math.isfinite(self.created_at) or self.created_at < 0:
            raise StateError(f"allocation {self.id}: invalid created_at")


@dataclass(frozen=True, slots=True)
class State:
    """Every allocation (sorted by id), the reserved CPUs and a generation bumped on every commit.

    Construction validates: ids and cgroups are unique, no CPU is in two allocations or reserved,
    no GPU is in two allocations.
    """

    allocations: tuple[Allocation, ...] = ()
    reserved: CPUSet = EMPTY
    generation: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.generation, bool) or self.generation < 0:
            raise StateError(f"invalid generation {self.generation!r}")
        ordered = tuple(sorted(self.allocations, key=lambda a: a.id))
        object.__setattr__(self, "allocations", ordered)
        taken = self.reserved
        ids: set[str] = set()
        cgroups: set[str] = set()
        gpus: set[str] = set()
        for a in ordered:
            if a.id in ids:
                raise StateError(f"allocation id {a.id} appears twice")
            if a.cgroup in cgroups:
                raise StateError(f"cgroup {a.cgroup} holds two allocations")
            if not a.cpus.isdisjoint(taken):
                raise StateError(f"allocation {a.id}: CPUs {a.cpus & taken} are reserved or allocated twice")
            if not gpus.isdisjoint(a.gpus):
                twice = sorted(gpus.intersection(a.gpus))
                raise StateError(f"allocation {a.id}: GPUs {twice} are allocated twice")
            gpus.update(a.gpus)
            ids.add(a.id)
            cgroups.add(a.cgroup)
            taken |= a.cpus

    def get(self, alloc_id: str) -> Allocation | None:
        """The allocation named `alloc_id`, or None."""
        return next((a for a in self.allocations if a.id == alloc_id), None)

    def allocated(self) -> CPUSet:
        """Every CPU held by an allocation."""
        return EMPTY.union(*(a.cpus for a in self.allocations))

    def held_gpus(self) -> frozenset[str]:
        """Every GPU (PCI address or UUID) held by an allocation."""
        return frozenset(g for a in self.allocations for g in a.gpus)

    def with_allocation(self, alloc: Allocation) -> State:
        """This state plus `alloc` (replacing one with the same id); raises StateError on conflict."""
        rest = tuple(a for a in self.allocations if a.id != alloc.id)
        return dataclasses.replace(self, allocations=(*rest, alloc))

    def without(self, alloc_id: str) -> State:
        """This state less allocation `alloc_id` (unchanged if absent)."""
        return dataclasses.replace(
            self, allocations=tuple(a for a in self.allocations if a.id != alloc_id)
        )

    def to_body(self) -> dict[str, Any]:
        """The JSON body (what the checksum covers).

        `gpus` is written only when an allocation holds GPUs, so a file without any still loads in
        a topolet that predates the field.
        """
        return {
            "generation": self.generation,
            "reserved": self.reserved.cpulist(),
            "allocations": [
                {
                    **({"gpus": list(a.gpus)} if a.gpus else {}),
                    "id": a.id,
                    "cpus": a.cpus.cpulist(),
                    "mems": a.mems.cpulist(),
                    "cgroup": a.cgroup,
                    "owner": {
                        "pid": a.owner.pid,
                        "start_time": a.owner.start_time,
                        "pod_uid": a.owner.pod_uid,
                        "container": a.owner.container,
                    },
                    "policy": a.policy,
                    "created_at": a.created_at,
                }
                for a in self.allocations
            ],
        }

    @classmethod
    def from_body(cls, body: object) -> State:
        """Validate a decoded JSON body field by field; raises StateError on anything off."""
        b = _obj(body, "body", {"generation", "reserved", "allocations"})
        allocs = b["allocations"]
        if not isinstance(allocs, list):
            raise StateError("allocations is not a list")
        return cls(
            allocations=tuple(_allocation(a, i) for i, a in enumerate(allocs)),
            reserved=_cpulist(b["reserved"], "reserved"),
            generation=_int(b["generation"], "generation"),
        )


def _obj(value: object, what: str, keys: set[str], optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateError(f"{what} is not an object")
    if not keys <= set(value) <= keys | optional:
        raise StateError(f"{what} has keys {sorted(value)}, expected {sorted(keys)}")
    return value


def _int(value: object, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise StateError(f"{what} is not an integer")
    return value


def _str(value: object, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise StateError(f"{what} is not a string")
    return value


def _cpulist(value: object, what: str) -> CPUSet:
    text = _str(value, what)
    try:
        return CPUSet.parse(text)
    except CPUListError as exc:
        raise StateError(f"{what}: {exc}") from exc


def _allocation(value: object, index: int) -> Allocation:
    what = f"allocations[{index}]"
    a = _obj(value, what, {"id", "cpus", "mems", "cgroup", "owner", "policy", "created_at"},
             frozenset({"gpus"}))
    o = _obj(a["owner"], f"{what}.owner", {"pid", "start_time", "pod_uid", "container"})
    created = a["created_at"]
    if not isinstance(created, int | float) or isinstance(created, bool):
        raise StateError(f"{what}.created_at is not a number")
    gpus = a.get("gpus", [])
    if not isinstance(gpus, list):
        raise StateError(f"{what}.gpus is not a list")
    return Allocation(
        id=_str(a["id"], f"{what}.id"),
        cpus=_cpulist(a["cpus"], f"{what}.cpus"),
        mems=_cpulist(a["mems"], f"{what}.mems"),
        cgroup=_str(a["cgroup"], f"{what}.cgroup"),
        owner=Owner(
            pid=_int(o["pid"], f"{what}.owner.pid", optional=True),
            start_time=_int(o["start_time"], f"{what}.owner.start_time", optional=True),
            pod_uid=_str(o["pod_uid"], f"{what}.owner.pod_uid", optional=True),
            container=_str(o["container"], f"{what}.owner.container", optional=True),
        ),
        policy=_str(a["policy"], f"{what}.policy"),
        created_at=float(created),
        gpus=tuple(_str(g, f"{what}.gpus[{i}]") for i, g in enumerate(gpus)),
    )


def _canonical(body: object) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text.encode()


def encode(state: State) -> bytes:
    """The file's bytes for `state`."""
    body = state.to_body()
    checksum = "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()
    doc = {"version": VERSION, "checksum": checksum, "body": body}
    return (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def _no_constants(name: str) -> object:
    raise StateError(f"non-finite number {name} in the state file")


def decode(data: bytes) -> State:
    """Parse and check a state file's bytes; raises StateError for anything but a valid version-1 file."""
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateError(f"not a JSON document: {exc}") from exc
    if not isinstance(doc, dict):
        raise StateError("not a JSON object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateError("no version")
    if version != VERSION:
        raise StateError(f"unknown state file version {version}")
    _obj(doc, "state file", {"version", "checksum", "body"})
    want = doc["checksum"]
    got = "sha256:" + hashlib.sha256(_canonical(doc["body"])).hexdigest()
    if want != got:
        raise StateError("checksum mismatch")
    return State.from_body(doc["body"])


def check_live(state: State, *, cpus: CPUSet, mems: CPUSet | None = None, parent: str) -> None:
    """Raise StateError when the live machine contradicts `state`.

    `cpus` are the machine's possible CPUs and `mems` (None: not checked) its memory nodes; every
    cgroup must lie under topolet's `parent` or in the kubelet's `kubepods` tree; and no allocation
    may name pid 1 as its owner (init never exits, so its allocation would never be freed).
    """
    if not state.reserved <= cpus:
        raise StateError(f"reserved CPUs {state.reserved - cpus} are not on this machine")
    for a in state.allocations:
        if not a.cpus <= cpus:
            raise StateError(f"allocation {a.id}: CPUs {a.cpus - cpus} are not on this machine")
        if mems is not None and not a.mems <= mems:
            raise StateError(f"allocation {a.id}: memory nodes {a.mems - mems} are not on this machine")
        if not (a.cgroup.startswith(parent + "/") or any(map(_KUBEPODS_RE.fullmatch, a.cgroup.split("/")))):
            raise StateError(f"allocation {a.id}: cgroup {printable(a.cgroup)} is neither under "
                             f"{parent}/ nor the kubelet's kubepods")
        if a.owner.pid == 1:
            raise StateError(f"allocation {a.id}: pid 1 cannot own an allocation")


def printable(text: str) -> str:
    """`text` with every non-printable character escaped (`\\x1b`), safe to show on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class StateFile:
    """`<folder>/state.json` with its lock file; counts its writes (`writes`, and `on_write` if given)."""

    def __init__(self, folder: str = DEFAULT_FOLDER, *, on_write: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self.path = os.path.join(folder, STATE_NAME)
        self.lock_path = os.path.join(folder, LOCK_NAME)
        self.on_write = on_write
        self.writes = 0
        self._refused = False  # the file on disk decodes but `check_live` refused it

    def _read(self) -> bytes | None:
        # Non-blocking: opening a FIFO for reading would wait for a writer forever; no symlinks.
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StateError(f"{self.path} is not a regular file; move it away")
            chunks: list[bytes] = []
            left = _MAX_BYTES + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        if len(data) > _MAX_BYTES:
            raise StateError(f"{self.path} is larger than {_MAX_BYTES} bytes")
        return data

    def load(self, *, missing_ok: bool = False) -> State:
        """The recorded state; raises StateError if the file is corrupt, or missing unless `missing_ok`."""
        data = self._read()
        if data is None:
            if missing_ok:
                return State()
            raise StateError(f"no state file at {self.path}")
        try:
            return decode(data)
        except StateError as exc:
            raise StateError(f"{self.path}: {exc}") from exc

    def load_or_rebuild(self, rebuild: Callable[[], State], *, check: Callable[[State], None] | None = None,
                        commit: bool = True) -> State:
        """The recorded state, or (file missing, corrupt, or refused by `check`) `rebuild()`'s; call
        under `lock()`.

        The rebuilt state is committed at once, or with `commit=False` left for the caller's next
        commit to write (so a command that then fails writes nothing).  The corrupt file is kept as
        a timestamped copy when that commit replaces it.
        """
        data = self._read()
        generation = 0
        if data is not None:
            try:
                state = decode(data)
                if check is not None:
                    try:
                        check(state)
                    except StateError:
                        # Whole but untrue: replace it as if corrupt, from the generation it holds.
                        generation = state.generation
                        self._refused = True
                        raise
                return state
            except StateError as exc:
                log.warning("state file %s is unusable (%s); rebuilding from live cgroups", self.path,
                            printable(str(exc)))
        else:
            log.info("no state file at %s; rebuilding from live cgroups", self.path)
        rebuilt = dataclasses.replace(rebuild(), generation=generation)
        return self.commit(rebuilt) if commit else rebuilt

    def commit(self, state: State) -> State:
        """Durably replace the file with `state`, generation bumped; return what was written.

        Refuses (StateError) a state whose generation is not the one on disk: it was derived from
        an older file, and writing it would lose another writer's change.
        """
        os.makedirs(self.folder, mode=0o755, exist_ok=True)
        data = self._read()
        if data is not None:
            try:
                on_disk: int | None = decode(data).generation
            except StateError:
                on_disk = None  # replacing garbage is the point of a rebuild
            if on_disk is None or self._refused:
                self._keep_corrupt()
            if on_disk is not None and on_disk != state.generation:
                raise StateError(
                    f"stale state: generation {state.generation} in hand, {on_disk} on disk at {self.path}"
                )
        new = dataclasses.replace(state, generation=state.generation + 1)
        self._write_atomically(encode(new))
        self._refused = False
        self.writes += 1
        if self.on_write is not None:
            self.on_write()
        return new

    def _keep_corrupt(self) -> None:
        """Link the file about to be replaced to `state.json.corrupt-<UTC time>`; keep the newest few."""
        now = time.time_ns()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z"
        try:
            os.link(self.path, os.path.join(self.folder, CORRUPT_PREFIX + stamp))
        except OSError as exc:  # the rebuild matters more than the post-mortem copy
            log.warning("cannot keep a copy of corrupt %s: %s", self.path, exc.strerror)
        kept = sorted(n for n in os.listdir(self.folder) if n.startswith(CORRUPT_PREFIX))
        for name in kept[:-KEEP_CORRUPT]:
            try:
                os.unlink(os.path.join(self.folder, name))
            except FileNotFoundError:
                pass

    def corrupt_copies(self) -> list[str]:
        """Paths of the kept corrupt copies, oldest first."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        return [os.path.join(self.folder, n) for n in sorted(names) if n.startswith(CORRUPT_PREFIX)]

    def _write_atomically(self, data: bytes) -> None:
        self._sweep_temps()
        tmp = os.path.join(self.folder, f".{STATE_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            # The rename is durable only once the folder's entry is on disk.
            dfd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise StateError(f"cannot write {self.path}: {exc.strerror}") from exc

    def _sweep_temps(self) -> None:
        # Temp files of writers that died mid-write; a live writer's (pid alive) is left alone.
        prefix = f".{STATE_NAME}."
        for name in os.listdir(self.folder):
            if not (name.startswith(prefix) and name.endswith(".tmp")):
                continue
            pid_text = name[len(prefix):].split(".", 1)[0]
            if not pid_text.isdigit() or _pid_alive(int(pid_text)):
                continue
            try:
                os.unlink(os.path.join(self.folder, name))
            except FileNotFoundError:
                pass

    @contextmanager
    def lock(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the exclusive cross-process lock on the state (flock; not re-entrant).

        Raises StateError if `timeout` seconds pass without getting it.
        """
        os.makedirs(self.folder, mode=0o755, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            msg = f"state lock {self.lock_path} is held by another process"
                            raise StateError(msg) from None
                        time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_of(procs: list[int]) -> Owner:
    # The workload's first process is the one whose parent is outside the cgroup.
    inside = set(procs)
    roots = [p for p in procs if parent_pid(p) not in inside]
    for pid in roots or procs:
        ticks = start_time(pid)
        if ticks is not None:
            return Owner(pid=pid, start_time=ticks)
    return Owner()


def rebuild_from_cgroups(layout: CgroupLayout, reserved: CPUSet = EMPTY) -> State:
    """A state read from the live topolet cgroup tree: each workload cgroup under `layout.parent`
    (not the shared one) with its cpus, mems and first process becomes an allocation.

    CPUs that are reserved or already claimed by an earlier cgroup (by creation time, then name)
    are left out of a later one, which is dropped if nothing remains, so the result never
    double-assigns a CPU; each loss is logged.
    """
    if not exists(layout, layout.parent):
        return State(reserved=reserved)
    found: list[tuple[float, str, str, CPUSet, CPUSet, list[int]]] = []
    for rel in list_children(layout, layout.parent):
        name = rel.rsplit("/", 1)[-1]
        if rel == layout.shared_path:
            continue
        if not _ID_RE.fullmatch(name):
            log.warning("rebuild: skipping cgroup %s: not a workload name", rel)
            continue
        try:
            cpus, mems = read_cpuset(layout, rel)
            procs = read_procs(layout, rel)
            created = os.stat(layout.abspath(rel)).st_mtime
        except (EnforcementError, FileNotFoundError) as exc:
            log.warning("rebuild: skipping cgroup %s: %s", rel, exc)
            continue
        if not cpus:
            continue  # never given CPUs: nothing was allocated to it
        found.append((created, name, rel, cpus, mems, procs))
    taken = reserved
    allocations: list[Allocation] = []
    for created, name, rel, cpus, mems, procs in sorted(found, key=lambda f: (f[0], f[1])):
        kept = cpus - taken
        if kept != cpus:
            log.error("rebuild: cgroup %s holds CPUs %s reserved or held by another", rel, cpus & taken)
        if not kept:
            continue
        taken |= kept
        allocations.append(
            Allocation(name, kept, mems, rel, _owner_of(procs), REBUILT_POLICY, max(created, 0.0))
        )
    return State(tuple(allocations), reserved)

