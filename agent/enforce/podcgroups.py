"""Pod cgroups narrowed as the kubelet makes them, before any container exists (the pod-cgroup route).

`PodCgroupWatcher(layout, driver, pod_cpuset, shared_pool)` watches the QoS folders with inotify and
writes each new pod cgroup at once: its policy's `(cpus, mems)`, else the shared pool; with a bundle
folder, each container cgroup of a mixed pod too; and rewrites any cpuset file a later write undid
(`undone`).  Call `write_pod(uid)` when a pod's answer changes and `keep_shared()` when the pool does;
neither callable passed in may call back into the watcher.
Why this order wins against runc and the kubelet: agent/enforce/README.md, "The pod-cgroup route".
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass

from agent.api.qos import QOSClass
from agent.enforce import inotify
from agent.enforce.apply import CgroupWrite, apply_assignment
from agent.enforce.bundles import bundle_container, container_id_of_cgroup
from agent.enforce.cgroup import CgroupLayout, exists, list_children, read_cpus, read_mems
from agent.enforce.inotify import Inotify, InotifyEvent
from agent.enforce.kubepods import CgroupDriver, pod_uid_of_cgroup, qos_cgroup_path
from agent.enforce.subtrees import write_subtrees
from agent.errors import EnforcementError
from agent.topology.cpuset import EMPTY, CPUSet

log = logging.getLogger(__name__)

PodCpuset = tuple[CPUSet, CPUSet]
"""(cpus, mems) for a pod's cgroup; mems EMPTY leaves its memory nodes as they are."""
PodPolicy = Callable[[str], PodCpuset | None]
"""Pod UID (as the API spells it) → its pod cgroup's (cpus, mems), or None: the shared pool."""
ContainerPolicy = Callable[[str, str], PodCpuset | None]
"""(pod UID, container name) → that container's cgroup's (cpus, mems), or None: its pod's."""

SHARED_QOS = (QOSClass.BURSTABLE, QOSClass.BESTEFFORT)
_FOLDER_EVENTS = inotify.CREATE | inotify.DELETE | inotify.ONLYDIR
_FILE_EVENTS = inotify.MODIFY


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """A pod's cgroup as the kubelet made it."""

    uid: str
    qos: QOSClass
    path: str  # relative to the layout's root


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    """A container's cgroup in a pod whose containers differ, as runc made it."""

    uid: str
    name: str
    path: str  # relative to the layout's root


Owner = str | QOSClass | ContainerCgroup
"""Whose cpuset file a watched file is: a pod's (its UID), a QoS folder's, or a container's."""


class PodCgroupWatcher:
    """Writes each pod cgroup as the kubelet makes it, and keeps the shared QoS folders at the pool.

    `start()` watches the QoS folders, writes what is there already and the shared folders, then
    serves inotify on a thread of its own until `stop()`.
    """

    def __init__(self, layout: CgroupLayout, driver: CgroupDriver | str, pod_cpuset: PodPolicy,
                 shared_pool: Callable[[], CPUSet], *, kubelet_root: tuple[str, ...] = (),
                 container_cpuset: ContainerPolicy | None = None, bundles: str = "") -> None:
        self.folders = {q: qos_cgroup_path(q, driver, kubelet_root) for q in QOSClass}  # checks both
        self.layout = layout
        self.driver = CgroupDriver(driver)
        self.kubelet_root = kubelet_root
        self.pod_cpuset = pod_cpuset
        self.shared_pool = shared_pool
        self.container_cpuset = container_cpuset
        self.bundles = bundles  # the runtime's bundle folder ("" : containers are not told apart)
        self.containers_written = 0  # container cgroups written as they appeared
        self.undone = 0  # writes of others to a written cpuset file, rewritten
        # The thread and the callers write one at a time; a caller that writes these cgroups in an
        # ordered step of its own (with `shared_targets()`) holds it across that step.
        self.lock = threading.RLock()
        self._inotify: Inotify | None = None
        self._watching: dict[int, QOSClass] = {}  # wd → the QoS class whose folder it is
        self._awaiting: int | None = None  # wd of kubepods' parent while kubepods is missing
        self._files: dict[int, Owner] = {}  # wd → whose cpuset file it is
        self._pod_folders: dict[int, str] = {}  # wd → the UID of the Guaranteed pod whose folder it is
        self._pods: dict[str, PodCgroup] = {}
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None
        self._looking = False  # looking at what a folder holds: shared pods are written once, after

    # -- the public side ----------------------------------------------------------------------

    def start(self) -> None:
        """Watch, write what exists, then serve events on a thread; raises EnforcementError when the
        folder kubepods would be made in does not exist."""
        if self._thread is not None:
            raise EnforcementError("pod cgroup watcher already started", self.layout.root)
        self._inotify = Inotify()
        try:
            with self.lock:
                self._arm()
            self._wake = os.pipe2(os.O_CLOEXEC)
        except BaseException:
            self._inotify.close()
            self._inotify = None
            raise
        self._thread = threading.Thread(target=self._run, name="pod-cgroups", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and drop every watch; cgroups keep what was written."""
        if self._thread is not None and self._wake is not None:
            os.write(self._wake[1], b"x")
            self._thread.join(timeout=10)
        self._thread = None
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._watching.clear()
        self._files.clear()
        self._pod_folders.clear()
        self._awaiting = None

    def pods(self) -> dict[str, PodCgroup]:
        """The pod cgroups that exist now, by pod UID."""
        with self.lock:
            return dict(self._pods)

    def write_pod(self, uid: str) -> list[CgroupWrite]:
        """Write pod `uid`'s cgroup as the policy says now, if it exists (else it is written when it
        appears); returns the writes made."""
        with self.lock:
            pod = self._pods.get(uid)
            if pod is None:
                return []
            if pod.qos in SHARED_QOS:  # its folder may have to widen first (a pod the policy pins)
                return self.keep_shared()
            cpus, mems = self._target(uid)
            try:
                return write_subtrees(self.layout, [(pod.path, cpus, mems)])
            except EnforcementError:
                if not exists(self.layout, pod.path):
                    self._forget(uid)
                    return []
                raise

    def keep_shared(self) -> list[CgroupWrite]:
        """Bring the Burstable and BestEffort folders to the pool (plus what the policy gives pods in
        them) and each pod in them to its own set; returns the writes made."""
        with self.lock:
            targets = self.shared_targets()
            return write_subtrees(self.layout, targets) if targets else []

    def shared_targets(self, only: QOSClass | None = None) -> list[tuple[str, CPUSet, CPUSet]]:
        """(cgroup, cpus, mems) of each shared QoS folder that exists (or only `only`'s), then of each
        pod in it: what `keep_shared()` writes, for a caller that writes them in its own ordered step
        (`subtree_targets` of each)."""
        with self.lock:
            pool = self.shared_pool()
            targets: list[tuple[str, CPUSet, CPUSet]] = []
            for qos in SHARED_QOS:
                folder = self.folders[qos]
                if (only is not None and qos is not only) or not exists(self.layout, folder):
                    continue
                pods = [(p.path, *self._target(p.uid)) for p in self._pods.values() if p.qos is qos]
                targets.append((folder, pool.union(*(c for _, c, _ in pods)), EMPTY))
                targets.extend(pods)
            return targets

    # -- watching -----------------------------------------------------------------------------

    def _target(self, uid: str) -> PodCpuset:
        return self.pod_cpuset(uid) or (self.shared_pool(), EMPTY)

    def _drifted(self, owner: Owner) -> bool:
        """Whether the cgroup behind a watched file no longer holds its set (one or two reads: most
        writes seen are our own)."""
        if isinstance(owner, QOSClass):
            targets = self.shared_targets(owner)
            if not targets:
                return False
            rel, cpus, mems = targets[0]
        elif isinstance(owner, ContainerCgroup):
            answer = self._container_target(owner)
            if answer is None:
                return False
            rel, (cpus, mems) = owner.path, answer
        elif owner in self._pods:
            rel, (cpus, mems) = self._pods[owner].path, self._target(owner)
        else:
            return False
        return read_cpus(self.layout, rel) != cpus or bool(mems and read_mems(self.layout, rel) != mems)

    def _add(self, path: str, mask: int) -> int | None:
        assert self._inotify is not None
        return self._inotify.add_watch(path, mask)

    def _arm(self) -> None:
        """Watch the QoS folders (or, while kubepods is missing, the folder it will be made in) and
        write what they hold."""
        kubepods = self.folders[QOSClass.GUARANTEED]
        if not exists(self.layout, kubepods):
            above = os.path.dirname(self.layout.abspath(kubepods))
            self._awaiting = self._add(above, inotify.CREATE | inotify.ONLYDIR)
            if self._awaiting is None:
                raise EnforcementError("no folder to watch for the kubelet's kubepods cgroup", above)
            if not exists(self.layout, kubepods):
                return
            self._inotify_rm(self._awaiting)  # made before the watch was set
            self._awaiting = None
        self._watch_folder(QOSClass.GUARANTEED)
        self._write_shared()

    def _watch_folder(self, qos: QOSClass) -> None:
        """Watch one QoS folder, then look at what it holds already (the watch sees only what comes)."""
        folder = self.folders[qos]
        wd = self._add(self.layout.abspath(folder), _FOLDER_EVENTS)
        if wd is None:
            return  # not made yet: its parent's watch sees it come
        self._watching[wd] = qos
        if qos in SHARED_QOS:
            self._watch_files(folder, qos)
        self._look(qos)

    def _look(self, qos: QOSClass) -> None:
        """Take in every folder a QoS folder holds now (its shared pods are written by the caller)."""
        looking, self._looking = self._looking, True
        try:
            for child in list_children(self.layout, self.folders[qos]):
                self._appeared(qos, child)
        finally:
            self._looking = looking

    def _watch_files(self, rel: str, owner: Owner) -> None:
        for name in ("cpus", "mems"):
            wd = self._add(self.layout.file(rel, name), _FILE_EVENTS)
            if wd is not None:
                self._files[wd] = owner

    def _appeared(self, qos: QOSClass, rel: str) -> None:
        """A folder in a QoS folder: a pod's cgroup (watched, then written) or a QoS class's folder."""
        name = rel.rsplit("/", 1)[-1]
        if qos is QOSClass.GUARANTEED:
            for other in SHARED_QOS:
                if rel == self.folders[other]:
                    self._watch_folder(other)
                    if not self._looking:
                        self._write_shared()
                    return
        uid = pod_uid_of_cgroup(name, qos, self.driver, self.kubelet_root)
        if uid is None:
            return
        self._pods[uid] = PodCgroup(uid, qos, rel)
        # The files first: a write of the kubelet's landing after ours must be seen.
        self._watch_files(rel, uid)
        if qos is QOSClass.GUARANTEED and self.bundles and self.container_cpuset is not None:
            wd = self._add(self.layout.abspath(rel), inotify.CREATE | inotify.ONLYDIR)
            if wd is not None:
                self._pod_folders[wd] = uid
                for child in list_children(self.layout, rel):  # made before the watch was set
                    self._container_appeared(uid, child)
        if not (self._looking and qos in SHARED_QOS):  # else one keep_shared() after the look
            self._write_quietly(uid)

    def _inotify_rm(self, wd: int) -> None:
        if self._inotify is not None:
            self._inotify.rm_watch(wd)

    def _forget(self, uid: str) -> None:
        self._pods.pop(uid, None)
        for wd in [wd for wd, owner in self._files.items()
                   if owner == uid or (isinstance(owner, ContainerCgroup) and owner.uid == uid)]:
            del self._files[wd]
            self._inotify_rm(wd)
        for wd in [wd for wd, owner in self._pod_folders.items() if owner == uid]:
            del self._pod_folders[wd]
            self._inotify_rm(wd)

    def _container_target(self, c: ContainerCgroup) -> PodCpuset | None:
        return self.container_cpuset(c.uid, c.name) if self.container_cpuset is not None else None

    def _container_appeared(self, uid: str, rel: str) -> None:
        """A folder in a Guaranteed pod's cgroup: when it is a container of a pod whose containers
        differ, its set is written now, before runc starts its process."""
        found = bundle_container(self.bundles, container_id_of_cgroup(rel.rsplit("/", 1)[-1]))
        if found is None or found.pod_uid != uid:
            return  # the sandbox, or no bundle to tell which container it is
        c = ContainerCgroup(uid, found.name, rel)
        if self._container_target(c) is None:
            return  # the pod's own set is this container's
        self._watch_files(rel, c)
        self._write_container(c)

    def _write_container(self, c: ContainerCgroup) -> list[CgroupWrite]:
        answer = self._container_target(c)
        if answer is None:
            return []
        cpus, mems = answer
        try:
            writes = apply_assignment(self.layout, {c.path: cpus}, {c.path: mems} if mems else None)
        except EnforcementError as exc:
            if exists(self.layout, c.path):
                log.warning("container %s of pod %s: %s", c.name, c.uid, exc)
            return []
        if writes:
            self.containers_written += 1
            log.info("container %s of pod %s: %s", c.name, c.uid, _shown(writes))
        return writes

    def _write_quietly(self, uid: str) -> None:
        try:
            writes = self.write_pod(uid)
        except EnforcementError as exc:
            log.warning("pod cgroup of %s: %s", uid, exc)
            return
        if writes:
            log.info("pod cgroup of %s: %s", uid, _shown(writes))

    def _write_shared(self) -> None:
        try:
            writes = self.keep_shared()
        except EnforcementError as exc:
            log.warning("shared QoS cgroups: %s", exc)
            return
        if writes:
            log.info("shared QoS cgroups: %s", _shown(writes))

    def _rewrite(self, owner: Owner) -> None:
        """A watched cpuset file was written (by us, or by someone else): write it back if it drifted."""
        if isinstance(owner, ContainerCgroup):
            if exists(self.layout, owner.path) and self._drifted(owner) and self._write_container(owner):
                self.undone += 1
            return
        try:
            if not self._drifted(owner):
                return
            shared = isinstance(owner, QOSClass) or self._pods[owner].qos in SHARED_QOS
            writes = self.keep_shared() if shared else self.write_pod(owner)
        except EnforcementError as exc:
            path = self.folders[owner] if isinstance(owner, QOSClass) else self._pods[owner].path
            if exists(self.layout, path):
                log.warning("cpuset of %s: %s", owner, exc)
            return
        if writes:
            self.undone += 1
            log.warning("cpuset of %s was rewritten by someone else; restored: %s", owner, _shown(writes))

    def _handle(self, events: list[InotifyEvent]) -> None:
        written: dict[Owner, None] = {}  # each file once per batch: our own writes come in runs
        with self.lock:
            for ev in events:
                if ev.mask & inotify.Q_OVERFLOW:
                    self._rescan()
                elif ev.wd == self._awaiting:
                    kubepods = os.path.basename(self.folders[QOSClass.GUARANTEED])
                    if ev.mask & inotify.CREATE and ev.name == kubepods:
                        self._inotify_rm(ev.wd)
                        self._awaiting = None
                        self._arm()
                elif ev.wd in self._watching:
                    self._folder_event(self._watching[ev.wd], ev)
                elif ev.wd in self._pod_folders:
                    uid = self._pod_folders[ev.wd]
                    if ev.mask & inotify.IGNORED:
                        del self._pod_folders[ev.wd]
                    elif ev.mask & inotify.CREATE and ev.mask & inotify.ISDIR and uid in self._pods:
                        self._container_appeared(uid, f"{self._pods[uid].path}/{ev.name}")
                elif ev.wd in self._files:
                    if ev.mask & inotify.IGNORED:
                        del self._files[ev.wd]
                    elif ev.mask & inotify.MODIFY:
                        written[self._files[ev.wd]] = None
            for owner in written:
                if isinstance(owner, (QOSClass, ContainerCgroup)) or owner in self._pods:
                    self._rewrite(owner)

    def _folder_event(self, qos: QOSClass, ev: InotifyEvent) -> None:
        folder = self.folders[qos]
        if ev.mask & inotify.IGNORED:  # the folder itself is gone
            del self._watching[ev.wd]
            for uid in [u for u, p in self._pods.items() if p.qos is qos]:
                self._forget(uid)
            if qos is QOSClass.GUARANTEED:
                self._arm()
        elif ev.mask & inotify.CREATE and ev.mask & inotify.ISDIR:
            self._appeared(qos, f"{folder}/{ev.name}")
        elif ev.mask & inotify.DELETE and ev.mask & inotify.ISDIR:
            gone = pod_uid_of_cgroup(ev.name, qos, self.driver, self.kubelet_root)
            if gone is not None:
                self._forget(gone)

    def _rescan(self) -> None:
        """Events were lost: look at every watched folder again."""
        log.warning("inotify queue overflowed: looking at every pod cgroup again")
        for uid in list(self._pods):
            if not exists(self.layout, self._pods[uid].path):
                self._forget(uid)
        for qos in list(self._watching.values()):
            self._look(qos)
        self._write_shared()

    def _run(self) -> None:
        assert self._inotify is not None and self._wake is not None
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake[0] in ready:
                return
            try:
                self._handle(self._inotify.read())
            except Exception:  # a policy callable's bug must not end the watch
                log.exception("pod cgroup watcher")


def _shown(writes: list[CgroupWrite]) -> str:
    return ", ".join(f"{w.path} {w.key}={w.value}" for w in writes)
