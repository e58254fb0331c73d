"""`topolet agent --enforcement off` on a real control plane, reading a hardware dump (`--fsroot`).

The agent runs as a real process, as any user, with no cgroup hierarchy: it sees the dump's 64 CPUs
in 4 NUMA nodes (tests/data/hwloc/dumps/64fake-4n2s2ca2c2t), records allocations in its state file
and publishes the NodeResourceTopology they imply.  The kubelet's part is only the pod status: a
container counts as started once the status lists it running with a container ID, patched here the
way `tests/kube/kubelet_standin.py` reports it (no process, no cgroup).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.api.qos import QOSClass
from agent.enforce.state import State
from agent.enforce.state_file import StateFile
from tests.kube.kubelet_standin import (
    container_status,
    install_nrt_crd,
    metric_sum,
    new_container_id,
    node_nrt,
    pod_status,
    stop_process,
    wait_for,
)

DUMP = "64fake-4n2s2ca2c2t"


@dataclass
class DumpNode:
    """A Node in the API whose agent runs with `--enforcement off --fsroot <dump>`."""

    name: str
    namespace: str
    api: Any
    fsroot: Path
    tmp: Path
    agent: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def state_dir(self) -> str:
        return str(self.tmp / "state")

    def in_process_args(self, pod_resources: str, reconcile_seconds: float) -> Any:
        """`topolet agent`'s config for an in-process KubeAgent on this node (enforcement off, no
        labels, metrics on a free port) that asks `pod_resources` for the kubelet's assignments."""
        from agent.cli import build_parser
        from agent.cli.compose import agent_config

        return agent_config(build_parser().parse_args([
            "agent", "--mode", "kubernetes", "--kubeconfig", str(self.tmp / "agent.kubeconfig"),
            "--node-name", self.name, "--state-dir", self.state_dir, "--fsroot", str(self.fsroot),
            "--enforcement", "off", "--features-dir", str(self.tmp / "features.d"),
            "--listen", "127.0.0.1:0", "--label-sink", "none", "--reconcile-seconds", str(reconcile_seconds),
            "--pod-resources-socket", pod_resources]))

    def start_agent(self, *extra: str) -> None:
        from tests.conftest import REPO, topolet_bin

        log = self.tmp / f"agent-{time.monotonic_ns()}.log"
        self.logs.append(log)
        argv = [topolet_bin(), "agent", "--mode", "kubernetes",
                "--kubeconfig", str(self.tmp / "agent.kubeconfig"), "--node-name", self.name,
                "--state-dir", self.state_dir, "--fsroot", str(self.fsroot),
                "--features-dir", str(self.tmp / "features.d"), "--listen", "127.0.0.1:0",
                "--label-sink", "file", "--reconcile-seconds", "1", "--enforcement", "off", *extra]
        env = {**os.environ, "PYTHONPATH": str(REPO), "POD_NAMESPACE": self.namespace}
        with open(log, "wb") as out:
            self.agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def stop_agent(self) -> None:
        stop_process(self.agent)

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs)

    def info_line(self) -> str:
        """The `topolet_info` sample of the running agent's /metrics."""
        import re

        m = re.search(r"serving /metrics and /healthz on [^:]*:(\d+)", self.logs[-1].read_text())
        assert m, "agent serves no metrics yet"
        with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return next(line for line in text.splitlines() if line.startswith("topolet_info{"))

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` with `labels` on the running agent's /metrics."""
        import re

        m = re.search(r"serving /metrics and /healthz on [^:]*:(\d+)", self.logs[-1].read_text())
        assert m, "agent serves no metrics yet"
        return metric_sum(int(m.group(1)), name, **labels)

    def create_running_pod(self, name: str, resources: dict[str, str] | None,
                           annotations: dict[str, str] | None = None) -> str:
        """A pod bound to this node whose one container the status says runs; returns its uid."""
        core = k8s.CoreV1Api(self.api)
        res = {"requests": dict(resources), "limits": dict(resources)} if resources else {}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": annotations or {}},
                "spec": {"nodeName": self.name, "automountServiceAccountToken": False,
                         "containers": [{"name": "c0", "image": "registry.k8s.io/pause:3.10",
                                         "resources": res}]}}
        made = core.create_namespaced_pod(self.namespace, body)
        qos = QOSClass.GUARANTEED if resources else QOSClass.BESTEFFORT
        started = made.metadata.creation_timestamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        core.patch_namespaced_pod_status(name, self.namespace, pod_status(
            qos, [container_status("c0", new_container_id(), started)], started))
        return str(made.metadata.uid)

    def nrt(self) -> dict[str, Any] | None:
        return node_nrt(self.api, self.name)

    def available(self, resource: str) -> dict[str, int]:
        """{zone name: available} of `resource` in the published NRT ({} while there is none)."""
        obj = self.nrt() or {}
        return {z["name"]: int(r["available"]) for z in obj.get("zones") or []
                for r in z.get("resources") or [] if r["name"] == resource}

    def state(self) -> State:
        return StateFile(self.state_dir).load(missing_ok=True)


@pytest.fixture
def dump_node(control_plane: Any, dump_root: Any, tmp_path: Path) -> Iterator[DumpNode]:
    """A Node, a namespace and the NRT CRD; the agent (not started) reads the 64-CPU dump."""
    api = control_plane.client()
    core = k8s.CoreV1Api(api)
    tag = uuid.uuid4().hex[:8]
    name, namespace = f"dump-{tag}", f"t-{tag}"
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    install_nrt_crd(api)
    control_plane.write_kubeconfig(tmp_path / "agent.kubeconfig", control_plane.admin_token)
    node = DumpNode(name, namespace, api, dump_root(DUMP), tmp_path)
    try:
        yield node
    finally:
        node.stop_agent()
        try:
            core.delete_node(name)
        except Exception:  # noqa: BLE001 - the API server may be stopped by a failed test
            pass
        api.close()


def test_agent_without_enforcement_publishes_what_it_would_pin(dump_node: DumpNode) -> None:
    node = dump_node
    node.start_agent()
    before = wait_for(lambda: node.available("cpu"), "the first NodeResourceTopology")
    assert before == {"node-0": 16, "node-1": 16, "node-2": 16, "node-3": 16}, before
    assert 'enforcement="off"' in node.info_line()

    shared = node.create_running_pod("shared", None)
    memory_before = node.available("memory")
    assert len(memory_before) == 4 and all(v > 0 for v in memory_before.values()), memory_before
    uid = node.create_running_pod("pinned", {"cpu": "4", "memory": "256Mi"},
                                  {"topolet.io/numa-policy": "single-numa-node",
                                   "topolet.io/memory-binding": "true"})

    def one_zone_lost_four() -> dict[str, int] | None:
        now = node.available("cpu")
        return now if sum(now.values()) == 60 else None

    after = wait_for(one_zone_lost_four, "the NRT to count the pinned pod's 4 CPUs")
    assert sorted(after.values()) == [12, 16, 16, 16], after
    assert node.metric("topolet_cpus", state="exclusive") == 4  # the state now, read when scraped
    assert node.metric("topolet_allocations_total", result="allocated") == 1
    (alloc,) = node.state().allocations
    assert alloc.owner.pod_uid == uid and len(alloc.cpus) == 4
    assert alloc.owner.pod_uid != shared
    # Its memory is bound to the zone of its CPUs, and that zone's available memory shows it.
    (zone,) = [name for name, cpus in after.items() if cpus == 12]
    assert node.available("memory") == {**memory_before, zone: memory_before[zone] - 256 * 2**20}

    k8s.CoreV1Api(node.api).delete_namespaced_pod("pinned", node.namespace, grace_period_seconds=0)
    wait_for(lambda: node.available("cpu") == before, "the NRT to give the CPUs back")
    assert node.available("memory") == memory_before
    assert not node.state().allocations
    assert node.metric("topolet_cpus", state="exclusive") == 0
    assert node.metric("topolet_allocations_total", result="released") == 1
    assert node.metric("topolet_allocations_total", result="refused") == 0
    assert node.metric("topolet_allocations_total", result="error") == 0
    assert "Traceback" not in node.log_text()


def test_controller_zone_is_where_the_pod_is_pinned(dump_node: DumpNode) -> None:
    node = dump_node
    node.start_agent()
    before = wait_for(lambda: node.available("cpu"), "the first NodeResourceTopology")
    uid = node.create_running_pod("zoned", {"cpu": "6", "memory": "256Mi"}, {"topolet.io/numa-zone": "2"})
    bad = node.create_running_pod("bad-zone", {"cpu": "2", "memory": "256Mi"}, {"topolet.io/numa-zone": "9"})
    want = {**before, "node-2": before["node-2"] - 6}
    wait_for(lambda: node.available("cpu") == want, "node-2 of the NRT to lose the zoned pod's 6 CPUs")
    assert [a.owner.pod_uid for a in node.state().allocations] == [uid]

    def reasons() -> list[str]:
        events = k8s.CoreV1Api(node.api).list_namespaced_event(
            node.namespace, field_selector=f"involvedObject.uid={bad}").items
        return [e.reason for e in events]

    assert wait_for(reasons, "an Event for the pod whose zone does not exist") == ["AllocationFailed"]
    # The node cannot place it in a zone it does not have: a refusal (alignment), not an error.
    assert node.metric("topolet_allocation_refusals_total", reason="alignment") == 1
    assert node.metric("topolet_allocations_total", result="error") == 0
