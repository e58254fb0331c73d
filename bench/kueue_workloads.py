"""The Kueue bench's two Workload watchers in the bench's namespace: `AdmitWatch` (when each gang's Workload
reached each step of its way to Admitted, or was rejected) and `NoopCheck` (an admission check
controller that answers Ready at once).  A Workload is the gang its controlling owner's name says
(bench/kueue_kinds.py's `gang_of`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kueue_kinds import gang_of

from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient
from tests.controlplane.kueue import kueue_path

CHECK = "topology-fit"
NOOP_CONTROLLER = "bench.topolet.io/noop"


def _watch_workloads(api: KubeClient, namespace: str, stop: threading.Event,
                     seen: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
    """Start a thread calling `seen(workload)` for every Workload event in `namespace` until `stop`; the
    function that ends its stream at once."""
    rv = api.list(kueue_path("workloads", namespace=namespace))["metadata"]["resourceVersion"]
    streams: list[Any] = []

    def run() -> None:
        nonlocal rv
        while not stop.is_set():
            try:
                with api.watch(kueue_path("workloads", namespace=namespace),
                               {"resourceVersion": rv, "allowWatchBookmarks": True, "timeoutSeconds": 60},
                               timeout=(5.0, 90.0)) as stream:
                    streams.append(stream)
                    for event in stream:
                        obj = (event or {}).get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if (event or {}).get("type") in ("ADDED", "MODIFIED"):
                            seen(obj)
                        if stop.is_set():
                            return
            except KubeAPIError:
                if stop.is_set():
                    return
                time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()

    def shutdown() -> None:
        for stream in streams:
            stream.shutdown()
    return shutdown


def _states(obj: dict[str, Any]) -> tuple[set[str], dict[str, str]]:
    """(the Workload's true condition types, its admission checks' states by name)."""
    status = obj.get("status") or {}
    true = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    return true, {a.get("name"): a.get("state") for a in status.get("admissionChecks") or []}


class AdmitWatch:
    """When each gang's Workload was first seen with QuotaReserved, with it and our check Pending, with
    our check Ready, and Admitted (monotonic), which gangs the check rejected, and what it last said."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self.api = api
        self.admitted: dict[str, float] = {}
        self.reserved: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.rejected: dict[str, str] = {}  # gang -> the check's message
        self.said: dict[str, str] = {}  # gang -> the check's latest state and message
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._shutdown = _watch_workloads(api, namespace, self._stop, self._seen)

    def _seen(self, obj: dict[str, Any]) -> None:
        owners = (obj.get("metadata") or {}).get("ownerReferences") or []
        if not owners:
            return
        now, gang = time.monotonic(), gang_of(owners[0]["name"])
        true, states = _states(obj)
        if "QuotaReserved" in true:
            self.reserved.setdefault(gang, now)
            if states.get(CHECK) == "Pending":
                self.pending.setdefault(gang, now)
        if states.get(CHECK) == "Ready":
            self.ready.setdefault(gang, now)
        message = next((a.get("message", "") for a in (obj.get("status") or {}).get("admissionChecks") or []
                        if a.get("name") == CHECK), "")
        if message:
            self.said[gang] = f"{states.get(CHECK)}: {message}"
        if states.get(CHECK) == "Rejected" and gang not in self.rejected:
            self.rejected[gang] = message
            self.last = now
        if "Admitted" in true:
            self.admitted.setdefault(gang, now)
            self.last = now

    def close(self) -> None:
        self._stop.set()
        self._shutdown()


class NoopCheck:
    """An admission check controller that decides nothing: it sets CHECK Ready, with no podSetUpdates,
    the moment its watch sees a Workload with quota reserved and CHECK Pending, from a small writer pool
    (as topolet's check writes off its watch).  What Kueue's own flow costs any check."""

    def __init__(self, api_factory: Callable[[], KubeClient], namespace: str, writers: int = 4) -> None:
        self._namespace = namespace
        self._local = threading.local()
        self._factory = api_factory
        self._pool = ThreadPoolExecutor(writers, thread_name_prefix="noop-check")
        self._done: set[str] = set()  # Workloads answered (or being answered)
        self._done_lock = threading.Lock()
        self._stop = threading.Event()
        self._shutdown = _watch_workloads(api_factory(), namespace, self._stop, self._seen)

    def _write(self, name: str) -> None:
        if not hasattr(self._local, "api"):
            self._local.api = self._factory()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": name, "namespace": self._namespace},
                "status": {"admissionChecks": [{"name": CHECK, "state": "Ready", "message": "no-op",
                                                "lastTransitionTime": now}]}}
        try:
            self._local.api.apply(kueue_path("workloads", name, namespace=self._namespace,
                                             subresource="status"), body, NOOP_CONTROLLER)
        except KubeAPIError as exc:  # seen again on its next event
            with self._done_lock:
                self._done.discard(name)
            print(f"# no-op check: {name}: {exc}", flush=True)

    def _seen(self, obj: dict[str, Any]) -> None:
        true, states = _states(obj)
        name = (obj.get("metadata") or {}).get("name")
        if "QuotaReserved" in true and states.get(CHECK) == "Pending" and name:
            with self._done_lock:
                if name in self._done:
                    return
                self._done.add(name)
            self._pool.submit(self._write, name)

    def close(self) -> None:
        self._stop.set()
        self._shutdown()
        self._pool.shutdown(wait=False, cancel_futures=True)
