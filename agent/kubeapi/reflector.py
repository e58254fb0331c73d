"""The one list+watch loop of both halves: the node agent's pod watch and the controller's stores.

`Reflector(kube, path, what, query=None, ...)` lists a collection in pages (`page_size`, default
`LIST_PAGE_SIZE`: `KubeClient.list_paged`), then watches it from the list's resourceVersion, on a
thread of its own (`.start()`, `.stop()`; `.relist()` lists once on the
caller's thread, `.request_relist()` asks the thread to).  A subclass says how to read one object
(`read`), what to do with the complete set after a list (`listed`) and with each watch event
(`handle`); the class docstring gives the rules for expiry, errors, bad objects and back-off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast

from agent.api.objects import as_list, metadata_of
from agent.errors import KubeAPIError
from agent.kubeapi.backoff import API_BACKOFF, Backoff, Outage
from agent.kubeapi.client import LIST_PAGE_SIZE, KubeClient, ObjectHook, WatchStream, one_line

_log = logging.getLogger(__name__)
T = TypeVar("T")

WATCH_TIMEOUT_SECONDS = 300  # the server ends a watch after this; it is resumed from the last version
LIST_TIMEOUT = (5.0, 120.0)  # (connect, read) of each page of a list
CONNECT_TIMEOUT_SECONDS = 5.0
NOT_SERVED_RETRY_SECONDS = 10.0  # a collection whose API is not served is listed again after this
SHORT_WATCH_SECONDS = 1.0  # a watch the server ends this soon, without an event, counts as a failure
CHANGES = ("ADDED", "MODIFIED", "DELETED")


class Expired(KubeAPIError):
    """The watch's resourceVersion is too old (410 Gone: history compacted, or a new watch cache)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 410)


class Reflector(Generic[T]):
    """List, then watch from the list's resourceVersion, until stopped.

    - A list is paged (`page_size` objects a request, `limit` then `continue`): every page reads the
      first page's snapshot, whose resourceVersion the watch starts from, and each page's objects are
      read (`read`) as it arrives, so no response, nor the memory to decode it, grows with the
      collection.  A continue token that expires mid-list starts the list again from its first page
      (client-go falls back to one unpaged list instead); a second expiry in a row is a failure,
      backed off like any other.
    - Every object read (`read`) is moved past before it is handled: the version advances first, so
      one that cannot be read or handled is skipped, counted (`on_invalid`, `.skipped`) and never
      replayed; it costs only itself.  An unreadable event line counts the same way.
    - A watch the server ends is resumed from the last version (bookmarks move it too); one that ends
      at once without an event is a failure, so a misbehaving server is never asked in a tight loop.
    - 410 Gone (as the watch's HTTP status or an ERROR event) lists again at once; straight after a
      list, or from the list itself, only after a back-off.  Any other ERROR event or failure waits
      the API loops' back-off (`agent.kubeapi.backoff`, one log line per outage) and watches again
      from the same version; a 404 lists again.  Nothing is handed on meanwhile: an object we cannot
      see is not an object gone.
    - With `not_served_is_empty`, a collection whose API is not served (404 on the list: e.g. a CRD not
      installed) is listed as empty and synced, and listed again every NOT_SERVED_RETRY_SECONDS.
    """

    def __init__(self, kube: KubeClient, path: str, what: str, query: Mapping[str, object] | None = None,
                 *, on_list: Callable[[], None] | None = None, on_invalid: Callable[[], None] | None = None,
                 backoff: Backoff = API_BACKOFF, watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
                 list_timeout: tuple[float, float] = LIST_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT_SECONDS, not_served_is_empty: bool = False,
                 page_size: int | None = LIST_PAGE_SIZE, object_hook: ObjectHook | None = None,
                 log: logging.Logger = _log) -> None:
        self.kube = kube
        self.path = path
        self.what = what  # names the collection in requests and logs ("pods on n1", "queued Jobs")
        self.query = dict(query or {})
        self.on_list = on_list  # told of each successful list (topolet_pod_lists_total)
        self.on_invalid = on_invalid  # told of each skipped object (topolet_invalid_objects_total)
        self.watch_timeout = watch_timeout_seconds
        self.list_timeout = list_timeout
        self.connect_timeout = connect_timeout
        self.not_served_is_empty = not_served_is_empty
        self.page_size = page_size  # objects per list request (None: one unpaged request)
        self.object_hook = object_hook  # each JSON object listed or watched, as decoded (agent.kubeapi.bulk)
        self.log = log
        self.outage = Outage(f"watch of {what}", log, backoff)
        self.resource_version: str | None = None
        self.lists = 0
        self.watches = 0
        self.skipped = 0  # objects (or event lines) that could not be read or handled
        self.synced = threading.Event()  # set after the first successful list
        self.connected = False
        self._fresh = False  # listed, and no event seen since: a 410 now is not history moving on
        self._stop = threading.Event()
        self._relist = threading.Event()
        self._thread: threading.Thread | None = None
        self._stream: WatchStream | None = None

    # -- what a subclass says ------------------------------------------------------------------

    def read(self, obj: dict[str, Any]) -> T:
        """One object as the subclass keeps it; ValueError (logged, skipped) when it cannot."""
        raise NotImplementedError

    def listed(self, items: list[T]) -> None:
        """The complete collection after a list (its unreadable objects left out)."""

    def handle(self, kind: str, item: T) -> None:
        """One ADDED, MODIFIED or DELETED object; an exception skips this object only."""

    def fetch(self) -> dict[str, Any]:
        """The collection as one list object, listed in pages: the snapshot's `metadata` and its objects
        as `read` gives them, page by page, the unreadable ones skipped (a subclass may wrap it)."""
        return self.kube.list_paged(self.path, self.query, page_size=self.page_size, read=self._read_all,
                                    timeout=self.list_timeout, what=f"list {self.what}",
                                    object_hook=self.object_hook)

    # -- thread --------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.what}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def request_relist(self) -> None:
        """End the current watch and list again (as after an expired watch); safe from any thread."""
        self._relist.set()
        self._wake()

    def _wake(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.shutdown()  # wake the read blocked on the stream

    def run(self) -> None:
        """List and watch until stopped; every failure is retried (see the class docstring)."""
        need_list = True
        while not self._stop.is_set():
            listing = False  # a 410 from the list itself (a continue token expired twice) backs off
            try:
                if need_list or self._relist.is_set():
                    need_list = listing = True
                    self._relist.clear()
                    if not self.relist():
                        self._stop.wait(NOT_SERVED_RETRY_SECONDS)
                        continue
                    need_list = listing = False
                    self.outage.recovered()
                self.watch_once()
                self.outage.recovered()
            except Exception as exc:  # noqa: BLE001 - the API may fail in any way; we keep trying
                if self._stop.is_set():
                    break
                if self._relist.is_set():
                    continue  # our own wake-up broke the stream
                self.connected = False
                status = getattr(exc, "status", None)
                need_list = need_list or status in (404, 410)
                if status == 410 and not self._fresh and not listing:
                    self.log.info("%s: resourceVersion %s expired: relisting", self.what,
                                  self.resource_version)
                    continue
                self._stop.wait(self.outage.failed(one_line(exc)))

    # -- list and watch ------------------------------------------------------------------------

    def relist(self) -> bool:
        """List the collection and hand it to `listed`; False when its API is not served (and
        `not_served_is_empty`: then listed as empty).  Raises KubeAPIError."""
        try:
            body = self.fetch()
        except KubeAPIError as exc:
            if not (self.not_served_is_empty and exc.not_found):
                raise
            self.resource_version = None
            self.listed([])
            self.synced.set()
            return False
        rv = metadata_of(body).get("resourceVersion")
        if not isinstance(rv, str) or not rv:
            raise KubeAPIError(f"list {self.what}: the list has no resourceVersion")
        items = cast(list[T], as_list(body.get("items")))  # read by `fetch`, page by page
        self.resource_version = rv
        self.lists += 1
        self._fresh = True
        if self.on_list is not None:
            self.on_list()
        self.connected = True
        self.listed(items)
        self.synced.set()
        return True

    def watch_once(self) -> None:
        """One watch request from the last resourceVersion, until the server ends it."""
        stream = self.kube.watch(
            self.path, {**self.query, "allowWatchBookmarks": True, "resourceVersion": self.resource_version,
                        "timeoutSeconds": self.watch_timeout},
            timeout=(self.connect_timeout, self.watch_timeout + 30), what=f"watch {self.what}",
            object_hook=self.object_hook)
        self._stream = stream
        self.watches += 1
        self.connected = True
        started, events = time.monotonic(), 0
        try:
            for event in stream:
                if self._stop.is_set() or self._relist.is_set():  # checked after `_stream` is set
                    return
                self.receive(event)
                events += 1
                if events == 1:
                    self.outage.recovered()  # the watch works: an outage ends here, not at its end
        finally:
            self._stream = None
            stream.close()
        if events == 0 and time.monotonic() - started < SHORT_WATCH_SECONDS and not self._stop.is_set() \
                and not self._relist.is_set():
            raise KubeAPIError(f"watch {self.what}: the server ended the watch at once, without an event")

    def receive(self, event: dict[str, Any] | None) -> None:
        """One watch event (None: a line that is not a JSON object).  Raises Expired for a 410 ERROR
        event, KubeAPIError for another; a bad object is skipped (see the class docstring)."""
        if event is None:
            self.skip("a watch event that is not a JSON object")
            return
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            self.skip(f"a watch event without an object ({str(kind)[:40]})")
            return
        if kind == "ERROR":
            code, message = obj.get("code"), str(obj.get("message"))[:200]
            if code == 410:
                raise Expired(f"watch {self.what}: {message}")
            raise KubeAPIError(f"watch {self.what}: error event: {message}",
                               code if isinstance(code, int) else None)
        self._fresh = False
        rv = metadata_of(obj).get("resourceVersion")
        if isinstance(rv, str) and rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        if kind not in CHANGES:
            self.skip(f"an event of unknown type {str(kind)[:40]}")
            return
        item = self._read(obj)
        if item is None:
            return
        try:
            self.handle(str(kind), item)
        except Exception:  # noqa: BLE001 - one object never stops the watch
            self.log.exception("%s: handling a %s event failed", self.what, kind)
            self.skip("its change could not be handled")

    def _read_all(self, objs: list[Any]) -> list[T]:
        """One page's objects as `read` gives them, the unreadable ones skipped."""
        return [item for obj in objs if (item := self._read(obj)) is not None]

    def _read(self, obj: object) -> T | None:
        if not isinstance(obj, dict):
            self.skip("not a JSON object")
            return None
        try:
            return self.read(obj)
        except ValueError as exc:
            self.skip(str(exc)[:200])
        except Exception:  # noqa: BLE001 - a defect in reading still costs only this object
            self.log.exception("%s: reading an object failed", self.what)
            self.skip("unreadable")
        return None

    def skip(self, why: str) -> None:
        """Count (and log) one object that could not be read or handled."""
        self.skipped += 1
        if self.on_invalid is not None:
            self.on_invalid()
        self.log.warning("%s: skipping an object: %s", self.what, why)
