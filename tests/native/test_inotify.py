"""inotify through the C helper (`agent.enforce.inotify`): folders made and removed, files written."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from agent.enforce import inotify
from agent.enforce.inotify import Inotify, InotifyEvent
from agent.errors import EnforcementError


def ready(watch: Inotify) -> bool:
    """Whether events are queued (the descriptor polls readable)."""
    return bool(select.select([watch], [], [], 0)[0])


def test_folder_made_written_and_removed(tmp_path: Path) -> None:
    with Inotify() as watch:
        assert not ready(watch) and watch.read() == []  # nothing queued: no block, no events
        folder = watch.add_watch(str(tmp_path), inotify.CREATE | inotify.DELETE | inotify.ONLYDIR)
        assert folder is not None
        (tmp_path / "pod1").mkdir()
        (tmp_path / "cpuset.cpus").write_text("0\n")  # a file: not asked for
        assert ready(watch)
        assert watch.read() == [
            InotifyEvent(folder, inotify.CREATE | inotify.ISDIR, "pod1"),
            InotifyEvent(folder, inotify.CREATE, "cpuset.cpus"),
        ]
        written = watch.add_watch(str(tmp_path / "cpuset.cpus"), inotify.MODIFY)
        assert written is not None and written != folder
        with open(tmp_path / "cpuset.cpus", "w") as f:
            f.write("1\n")
        (tmp_path / "pod1").rmdir()
        assert watch.read() == [
            InotifyEvent(written, inotify.MODIFY, ""),  # the watched path itself: no name
            InotifyEvent(folder, inotify.DELETE | inotify.ISDIR, "pod1"),
        ]
        assert watch.rm_watch(written)
        assert watch.read() == [InotifyEvent(written, inotify.IGNORED, "")]
        assert not watch.rm_watch(written)  # gone already


def test_watching_again_gives_the_same_descriptor(tmp_path: Path) -> None:
    with Inotify() as watch:
        first = watch.add_watch(str(tmp_path), inotify.CREATE)
        assert watch.add_watch(str(tmp_path), inotify.CREATE | inotify.DELETE) == first


def test_many_events_are_read_in_several_reads(tmp_path: Path) -> None:
    # More events than one read's 256 records, with names of every length up to NAME_MAX.
    with Inotify() as watch:
        wd = watch.add_watch(str(tmp_path), inotify.CREATE)
        names = [f"{i:03d}" + "x" * (i % 253) for i in range(600)]
        for name in names:
            (tmp_path / name).mkdir()
        got = watch.read()
        assert [e.name for e in got] == names
        assert {(e.wd, e.mask) for e in got} == {(wd, inotify.CREATE | inotify.ISDIR)}


def test_watched_folder_removed_ends_its_watch(tmp_path: Path) -> None:
    folder = tmp_path / "kubepods"
    folder.mkdir()
    with Inotify() as watch:
        wd = watch.add_watch(str(folder), inotify.CREATE)
        folder.rmdir()
        assert [e.mask for e in watch.read() if e.wd == wd] == [inotify.IGNORED]  # asked for or not


def test_missing_path_and_errors(tmp_path: Path) -> None:
    watch = Inotify()
    assert watch.add_watch(str(tmp_path / "absent"), inotify.CREATE) is None
    (tmp_path / "file").write_text("")
    with pytest.raises(EnforcementError, match="ENOTDIR"):
        watch.add_watch(str(tmp_path / "file"), inotify.CREATE | inotify.ONLYDIR)
    fd = watch.fileno()
    watch.close()
    watch.close()
    with pytest.raises(EnforcementError, match="closed"):
        watch.read()
    with pytest.raises(OSError):
        os.fstat(fd)  # the descriptor is really closed


def test_descriptor_is_nonblocking_and_closed_on_exec() -> None:
    with Inotify() as watch:
        assert not os.get_blocking(watch.fileno())
        assert not os.get_inheritable(watch.fileno())
