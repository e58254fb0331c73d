"""inotify(7) through the C helper: watch cgroup folders for new and removed children, files for writes.

`Inotify()` holds one non-blocking, close-on-exec descriptor; wait for it to be readable (its
`fileno()` in `select`/`poll`), then `read()` what is queued.  Errors are `EnforcementError`.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import agent._native as _native
from agent.errors import EnforcementError

_ffi = _native.ffi
_lib = _native.lib

MODIFY: int = _lib.TOPO_IN_MODIFY
CREATE: int = _lib.TOPO_IN_CREATE
DELETE: int = _lib.TOPO_IN_DELETE
DELETE_SELF: int = _lib.TOPO_IN_DELETE_SELF
MOVE_SELF: int = _lib.TOPO_IN_MOVE_SELF
Q_OVERFLOW: int = _lib.TOPO_IN_Q_OVERFLOW  # events were lost: look again at everything watched
IGNORED: int = _lib.TOPO_IN_IGNORED  # the watch is gone (removed, or its file was)
ONLYDIR: int = _lib.TOPO_IN_ONLYDIR
ISDIR: int = _lib.TOPO_IN_ISDIR

_EVENTS = 256  # records per read: 4 KiB of the kernel's queue at a time
_NAMES = _EVENTS * 16


def _error(what: str, rc: int, path: str | None = None) -> EnforcementError:
    return EnforcementError(f"{what} failed: {errno.errorcode.get(rc, f'E{rc}')} {os.strerror(rc)}", path)


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    """One event: its watch, its bits (`CREATE | ISDIR`, ...) and the name in the watched folder
    it is about ("" for the watched path itself)."""

    wd: int
    mask: int
    name: str


class Inotify:
    """One inotify descriptor and its watches."""

    def __init__(self) -> None:
        fd = _ffi.new("int32_t *")
        rc = _lib.topo_inotify_init(fd)
        if rc:
            raise _error("inotify_init1", rc)
        self._fd: int | None = int(fd[0])
        self._events = _ffi.new("topo_inotify_event_t[]", _EVENTS)
        self._names = _ffi.new("char[]", _NAMES)
        self._count = _ffi.new("size_t *")

    def fileno(self) -> int:
        if self._fd is None:
            raise EnforcementError("inotify descriptor is closed")
        return self._fd

    def add_watch(self, path: str, mask: int) -> int | None:
        """Watch `path` for the events in `mask`; its watch descriptor, or None when `path` does not
        exist.  Watching a path again returns the same descriptor (with the new mask)."""
        wd = _ffi.new("int32_t *")
        rc = _lib.topo_inotify_add_watch(self.fileno(), os.fsencode(path), mask, wd)
        if rc == errno.ENOENT:
            return None
        if rc:
            raise _error("inotify_add_watch", rc, path)
        return int(wd[0])

    def rm_watch(self, wd: int) -> bool:
        """Stop watch `wd`; False when it was gone already (its path removed)."""
        rc = _lib.topo_inotify_rm_watch(self.fileno(), wd)
        if rc == errno.EINVAL:
            return False
        if rc:
            raise _error("inotify_rm_watch", rc)
        return True

    def read(self) -> list[InotifyEvent]:
        """Every event queued now, oldest first; [] when none (never blocks)."""
        out: list[InotifyEvent] = []
        while True:
            rc = _lib.topo_inotify_read(self.fileno(), self._events, _EVENTS, self._names, _NAMES,
                                        self._count)
            if rc:
                raise _error("read from inotify", rc)
            n = int(self._count[0])
            if n == 0:
                return out
            names = bytes(_ffi.buffer(self._names, _NAMES))
            for i in range(n):
                ev = self._events[i]
                name = ""
                if ev.name >= 0:
                    end = names.index(b"\0", ev.name)
                    name = os.fsdecode(names[ev.name:end])
                out.append(InotifyEvent(int(ev.wd), int(ev.mask), name))

    def close(self) -> None:
        """Close the descriptor (every watch goes with it); idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
