"""The crash-safe state file: every exclusive allocation, recorded before the cgroup change it describes.

`StateFile(folder, on_write=None)`: `.lock()`, `.load()`, `.load_or_rebuild(rebuild, check=None,
commit=True)`, `.commit(state)`, `.corrupt_copies()`, `.check_folder()`, `.writes`.  The rule: under
`lock()`, commit the new state first, then apply the cgroups.  Writes are atomic (temp file, fsync,
rename, fsync the folder); a file that does not decode or fails `check` is rebuilt and kept as a
corrupt copy when a commit replaces it.
The protocol and crash cases: agent/enforce/README.md, "The state file".
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from agent.enforce.state import State, printable
from agent.enforce.state_codec import decode, encode
from agent.errors import StateError

log = logging.getLogger("agent.enforce.state")

DEFAULT_FOLDER = "/var/lib/topolet"
STATE_NAME = "state.json"
LOCK_NAME = "state.lock"
_MAX_BYTES = 16 << 20  # a state file this big is not ours
CORRUPT_PREFIX = f"{STATE_NAME}.corrupt-"
KEEP_CORRUPT = 8  # corrupt copies kept for a post-mortem; a file corrupted in a loop fills no disk


class StateFile:
    """`<folder>/state.json` with its lock file; counts its writes (`writes`, and `on_write` if given)."""

    def __init__(self, folder: str = DEFAULT_FOLDER, *, on_write: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self.path = os.path.join(folder, STATE_NAME)
        self.lock_path = os.path.join(folder, LOCK_NAME)
        self.on_write = on_write
        self.writes = 0
        self._refused = False  # the file on disk decodes but `check_live` refused it
        # The last bytes decoded and their State (immutable): every reader of one file version (the
        # pod watch, NRI's CreateContainer, a scrape) decodes it once.
        self._decoded: tuple[bytes, State] | None = None

    def _decode(self, data: bytes) -> State:
        last = self._decoded
        if last is not None and last[0] == data:
            return last[1]
        state = decode(data)
        self._decoded = (data, state)
        return state

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
            return self._decode(data)
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
                state = self._decode(data)
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
                on_disk: int | None = self._decode(data).generation
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

    def _open_lock(self) -> int:
        """Make the folder if missing and open its lock file (a descriptor); StateError, in one line,
        when the folder cannot hold the state (a file where it should be, no permission, read-only)."""
        try:
            os.makedirs(self.folder, mode=0o755, exist_ok=True)
            return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            not_folder = os.path.exists(self.folder) and not os.path.isdir(self.folder)
            raise StateError(f"state folder {self.folder}: "
                             f"{'not a folder' if not_folder else exc.strerror or exc}") from exc

    def check_folder(self) -> None:
        """Raise StateError now if the folder cannot hold the state (an agent checks at start)."""
        os.close(self._open_lock())

    @contextmanager
    def lock(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the exclusive cross-process lock on the state (flock; not re-entrant).

        Raises StateError if `timeout` seconds pass without getting it.
        """
        fd = self._open_lock()
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
