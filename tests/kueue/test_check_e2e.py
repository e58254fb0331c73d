"""The `topolet.io/topology-fit` check end to end under real Kueue v0.17.0 (its manager, webhooks and
batch/Job integration) on a test cluster of its own (`kueue` fixture): Kueue reserves quota and starts
Jobs, `topolet controller --kueue on` decides the check, the kueue component's placement policy pins
the pods, the real kube-scheduler binds them and the nodes' agents pin them in the zones.

Each node of DUMP has 4 NUMA zones of 16 CPUs: single-numa-node pods of 12 CPUs take a zone each, so
the two nodes hold 8 such pods; a gang of 6 leaves room for no second one."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient
from tests.admission.test_controller import metric, scrape
from tests.controlplane.harness import free_port
from tests.controlplane.kueue import KueueScope, job, kueue_path
from tests.kube.kubelet_standin import wait_for
from tests.kueue.test_check import DUMP, FAILSAFE, KUEUE, install_policy, slots

# Read-only: a test that puts it in a body copies it (a shared dict once carried one test's TAS
# annotation into the next test's pods).
NUMA = MappingProxyType({"topolet.io/numa-policy": "single-numa-node"})


class CheckStates:
    """Every state of one admission check that a watch on the namespace's Workloads sees, by Job uid
    (a `with` block: the watch runs in a thread from entry to exit)."""

    def __init__(self, api: KubeClient, ns: str, check: str) -> None:
        self.api, self.ns, self.check = api, ns, check
        self._seen: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, name="check-states", daemon=True)

    def __enter__(self) -> CheckStates:
        listed = self.api.list(kueue_path("workloads", namespace=self.ns))
        self._stream = self.api.watch(kueue_path("workloads", namespace=self.ns),
                                      {"resourceVersion": listed["metadata"]["resourceVersion"]},
                                      timeout=(5.0, 600.0))
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stream.shutdown()
        self._thread.join(timeout=10)
        self._stream.close()

    def _run(self) -> None:
        with contextlib.suppress(KubeAPIError):
            for event in self._stream:
                obj = (event or {}).get("object") or {}
                uid = (obj.get("metadata", {}).get("labels") or {}).get("kueue.x-k8s.io/job-uid")
                for entry in obj.get("status", {}).get("admissionChecks") or []:
                    if uid and entry.get("name") == self.check:
                        with self._lock:
                            self._seen.setdefault(uid, []).append(dict(entry))

    def of(self, job_uid: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._seen.get(job_uid, []))


class Setup:
    """Two agent-served nodes, the check, a flavor for those nodes, a ClusterQueue with `quota` and the
    check, a LocalQueue "lq" in a fresh namespace, and the controller."""

    def __init__(self, kueue: KueueScope, dump_root: Callable[[str], Path], quota_cpu: int,
                 *controller_args: str) -> None:
        self.kueue = kueue
        self.api = kueue.api
        tag = uuid.uuid4().hex[:8]
        self.label = f"test.topolet.io/{tag}"
        self.nodes = [kueue.cluster.add_node(f"kq-{tag}-{i}", dump_root(DUMP),
                                             labels={self.label: "true"}).name for i in range(2)]
        for name in self.nodes:
            wait_for(lambda n=name: kueue.cluster.nrt(n), f"the NRT of {name}")
        install_policy(self.api)
        self.check = f"fit-{tag}"
        kueue.admission_check(self.check)
        # The flavor's node labels reach the pods through Kueue, and the engine reads them too.
        kueue.resource_flavor(f"rf-{tag}", {self.label: "true"})
        kueue.cluster_queue(f"cq-{tag}", f"rf-{tag}", {"cpu": str(quota_cpu), "memory": "64Gi"},
                            admission_checks=[self.check])
        self.ns = kueue.namespace()
        kueue.local_queue(self.ns, "lq", f"cq-{tag}")
        self.controller = kueue.cluster.start_controller("--resync-seconds", "2", "--kueue", "on",
                                                         *controller_args)

    def submit(self, name: str, count: int, cpu: str = "12") -> dict[str, Any]:
        body = job(name, "lq", parallelism=count, indexed=True, annotations=NUMA,
                   requests={"cpu": cpu, "memory": "64Mi"})
        return self.kueue.create_job(self.ns, body)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """Add the namespace's Workloads (owner uid, conditions, check states) to a wait's timeout: what a
        CI log needs when a gang never reaches the state a test waits for."""
        try:
            yield
        except AssertionError as exc:
            listed = self.api.list(kueue_path("workloads", namespace=self.ns)).get("items") or []
            lines = [f"{wl['metadata']['name']} (job-uid "
                     f"{(wl['metadata'].get('labels') or {}).get('kueue.x-k8s.io/job-uid')}): "
                     + "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')}"
                                 for c in wl.get("status", {}).get("conditions") or [])
                     + " | checks: " + "; ".join(f"{c['name']} {c['state']} {c.get('message', '')!r}"
                                                 for c in wl.get("status", {}).get("admissionChecks") or [])
                     for wl in listed]
            told = "\n".join(lines or ["(none)"])
            raise AssertionError(f"{exc}\nWorkloads in {self.ns}:\n{told}") from exc

    def workload(self, job_uid: str) -> dict[str, Any]:
        return self.kueue.workload_of(self.ns, job_uid) or {}

    def state(self, job_uid: str) -> dict[str, Any]:
        for entry in self.workload(job_uid).get("status", {}).get("admissionChecks") or []:
            if entry["name"] == self.check:
                return dict(entry)
        return {}

    def pods(self, name: str) -> list[dict[str, Any]]:
        out = self.api.list(f"/api/v1/namespaces/{self.ns}/pods", {"labelSelector": f"job-name={name}"})
        return [p for p in out.get("items") or [] if not p["metadata"].get("deletionTimestamp")]

    def running_as_decided(self, name: str, job_uid: str, count: int) -> bool:
        """Every pod of the Job bound on its slot's node, with its zone, and the agent pinned it there."""
        state = self.state(job_uid)
        pods = self.pods(name)
        if (state.get("state") != "Ready" or len(pods) != count
                or not all(p["spec"].get("nodeName") for p in pods)):
            return False
        placed = slots(state)
        for pod in pods:
            ann = pod["metadata"]["annotations"]
            node, zone = placed[int(ann["batch.kubernetes.io/job-completion-index"])]
            assert pod["spec"]["nodeName"] == node and ann["topolet.io/numa-zone"] == str(zone)
            assert FAILSAFE not in pod["spec"]["nodeSelector"] and "topolet.io/placements" not in ann
            sim = self.kueue.cluster.nodes[node]
            allocs = [a for a in sim.state().allocations if a.owner.pod_uid == pod["metadata"]["uid"]]
            if not allocs:
                return False
            assert {sim.topology.numa_of(c) for c in allocs[0].cpus} == {zone}
        return True

    def delete(self, name: str) -> None:
        self.api.request("DELETE", f"/apis/batch/v1/namespaces/{self.ns}/jobs/{name}",
                         body={"propagationPolicy": "Background"}, content_type="application/json")

    def set_active(self, job_uid: str, active: bool) -> None:
        wl = self.workload(job_uid)
        self.api.patch(f"{KUEUE}/namespaces/{self.ns}/workloads/{wl['metadata']['name']}",
                       {"spec": {"active": active}}, "application/merge-patch+json")


def test_quota_for_two_room_for_one(kueue: KueueScope, dump_root: Callable[[str], Path]) -> None:
    """Three gangs of 6 queued with quota for two: the one that fits runs pinned, the others Retry (and
    are never Ready while it holds its zones) until it is gone; a gang that can never fit is Rejected
    and Kueue deactivates it.  The controller is killed right after its first Ready write on the way."""
    # Quota for two gangs of 6 (72 CPUs each) and the one-pod huge Job (20).
    s = Setup(kueue, dump_root, 164, "--crash-at", "after-decision")
    gangs = {name: s.submit(name, 6)["metadata"]["uid"] for name in ("a", "b", "c")}

    def ready() -> list[str]:
        return [n for n, uid in gangs.items() if s.state(uid).get("state") == "Ready"]

    wait_for(lambda: s.controller.popen.poll() is not None,
             "the controller to kill itself after a Ready write", timeout=120)
    assert s.controller.popen.returncode == -signal.SIGKILL
    (first,) = wait_for(ready, "one gang Ready")
    decided = s.state(gangs[first])
    s.kueue.cluster.start_controller("--resync-seconds", "2", "--kueue", "on")

    retried: dict[str, str] = {}

    def others_retry_and_one_runs() -> bool:
        assert ready() == [first], "two gangs of 6 Ready at once: double-booked"
        for name, uid in gangs.items():
            state = s.state(uid)
            if name != first and state.get("state") == "Retry":
                retried[name] = state["message"]
        return s.running_as_decided(first, gangs[first], 6) and len(retried) >= 1

    wait_for(others_retry_and_one_runs, f"{first} running pinned, another gang told Retry", timeout=150)
    assert s.state(gangs[first]) == decided, "the Ready gang was decided again after the restart"
    message = next(iter(retried.values()))
    assert "does not fit now" in message and "zone" in message, message

    # Kueue resets the check to Pending as it deactivates the Workload, so Rejected may last a moment
    # only: a watch sees every version of the Workload, where polling could miss it.
    with CheckStates(s.api, s.ns, s.check) as seen:
        huge = s.submit("huge", 1, cpu="20")["metadata"]["uid"]
        rejected = wait_for(lambda: next((st for st in seen.of(huge) if st.get("state") == "Rejected"), None),
                            "huge Rejected")
    assert "can never fit" in rejected["message"]
    wait_for(lambda: s.workload(huge)["spec"].get("active") is False, "Kueue to deactivate huge")

    s.delete(first)
    rest = [n for n in gangs if n != first]

    def next_one_runs() -> str | None:
        now = [n for n in ready() if n != first]
        assert len(now) <= 1, "two gangs of 6 Ready at once: double-booked"
        return now[0] if now and s.running_as_decided(now[0], gangs[now[0]], 6) else None

    second = wait_for(next_one_runs, f"one of {rest} Ready and running once {first} is gone", timeout=240)
    assert second in rest


def test_an_evicted_workload_gets_a_fresh_placement(kueue: KueueScope,
                                                    dump_root: Callable[[str], Path]) -> None:
    """Deactivate a running Ready Workload and reactivate it: Kueue suspends the Job and restores its
    template (no slot of ours survives on it), our check goes back to Pending, and the re-admission is
    a new decision whose pods run where it says; the old decision's zones are free again."""
    port = free_port()
    s = Setup(kueue, dump_root, 200, "--listen", f"127.0.0.1:{port}")
    uid = s.submit("a", 6)["metadata"]["uid"]
    wait_for(lambda: s.running_as_decided("a", uid, 6), "a running pinned", timeout=150)
    # The ledger finds a's pods by their slots and lets go once the nodes' NRTs show them pinned.
    wait_for(lambda: metric(scrape(port)[1], "topolet_admission_ledger_entries") == 0,
             "the ledger to clear a's entries as the NRTs show its pods", timeout=90)
    before = s.state(uid)

    s.set_active(uid, False)

    def restored() -> bool:
        got = s.api.get(f"/apis/batch/v1/namespaces/{s.ns}/jobs/a")
        tpl = got["spec"]["template"]
        return (got["spec"].get("suspend") is True
                and "topolet.io/placements" not in (tpl["metadata"].get("annotations") or {})
                and FAILSAFE not in (tpl["spec"].get("nodeSelector") or {}) and not s.pods("a"))

    wait_for(restored, "Kueue to suspend a and restore its template", timeout=120)
    assert s.state(uid).get("state") != "Ready"
    time.sleep(1)
    s.set_active(uid, True)
    wait_for(lambda: s.running_as_decided("a", uid, 6) and s.state(uid) != before,
             "a re-admitted and running", timeout=240)
    assert s.state(uid)["lastTransitionTime"] >= before["lastTransitionTime"]
    # 2 zones are left beside a's new 6 (none held for the old decision): a gang of 2 goes in.
    two = s.submit("two", 2)["metadata"]["uid"]
    wait_for(lambda: s.running_as_decided("two", two, 2), "two running beside a", timeout=150)

