"""MIG in Kubernetes mode: the Node's `topolet.io/mig.config` label names the layout, the agent
applies it through NVML (the stand-in, given to the agent's constructor) on its enforcer thread and
answers in `topolet.io/mig.config.state` on the Node (pending, then success or failed).

The agent runs in this process on a real API server with the kubelet's stand-ins; the MIG devices
pods hold come from the pod-resources stand-in.  Also: which device plugin ids hold which GPU
instances, the state the publisher shows, and that the label sink never writes the user's label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client as k8s

from agent.cli import build_parser
from agent.cli.compose import agent_config, kube_agent
from agent.config import AgentConfig
from agent.errors import ConfigError
from agent.gpu.applier import STATE_LABEL
from agent.gpu.reconcile import CONFIG_LABEL, MigReconciler
from agent.kube.daemon import KubeAgent
from agent.kube.kubelet.podresources.client import Device
from agent.kube.mig.status import MigStatus
from agent.kube.publish.labels_sink import MANAGED_LABELS_ANNOTATION, USER_LABELS, LabelPublisher
from agent.metrics.registry import Metrics
from tests.controlplane.harness import ControlPlane
from tests.gpu.fake_nvml import FakeNVML, h100_node
from tests.kube.kubelet_standin import KubeNode, kube_node, wait_for
from tests.kube.podresources_standin import PodResourcesStandIn

__all__ = ["kube_node"]

MUTATING = {"nvmlDeviceSetMigMode", "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy",
            "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceDestroy"}


def fake(gpus: int = 2) -> FakeNVML:
    nvml = h100_node(gpus)
    nvml.nvmlInit()
    return nvml


# ---- the state label the publisher shows ---------------------------------------------------------

# Each row: the Node's labels read in turn, the enforcer's reports in turn (after the reads), and
# the state label expected at the end (None: no label).
STATUS_TABLE = [
    # A layout asked for the first time: pending until the enforcer reports.
    ([{CONFIG_LABEL: "all-1g.10gb"}], [], "pending"),
    ([{CONFIG_LABEL: "all-1g.10gb"}], [("all-1g.10gb", "success")], "success"),
    ([{CONFIG_LABEL: "nope"}], [("nope", "failed")], "failed"),
    # A restarted agent: the Node's own value stands until the first pass (no pending blip).
    ([{CONFIG_LABEL: "all-1g.10gb", STATE_LABEL: "success"}], [], "success"),
    # The user changes the label: pending at once, even though the old layout succeeded.
    ([{CONFIG_LABEL: "a"}, {CONFIG_LABEL: "b", STATE_LABEL: "success"}], [("a", "success")], "pending"),
    ([{CONFIG_LABEL: "a"}, {CONFIG_LABEL: "b"}], [("a", "success"), ("b", "failed")], "failed"),
    # No label: --mig-config (the fallback) is asked; neither: no state label at all.
    ([{}], [], None),
    ([{STATE_LABEL: "success"}], [], None),
    # No NVML or no MIG-capable GPU: the enforcer reports None; the label goes.
    ([{CONFIG_LABEL: "a"}], [("a", None)], None),
    # The label removed: not managed any more.
    ([{CONFIG_LABEL: "a"}, {}], [("a", "success")], None),
]


@pytest.mark.parametrize(("reads", "reports", "expected"), STATUS_TABLE)
def test_state_label(reads: list[dict[str, str]], reports: list[tuple[str, str | None]],
                     expected: str | None) -> None:
    status = MigStatus("")
    for labels in reads:
        status.node_labels(labels)
    for layout, state in reports:
        status.report(layout, state)
    assert status.state() == expected
    assert status.labels() == ({STATE_LABEL: expected} if expected else {})
    assert CONFIG_LABEL not in status.labels()


def test_fallback_layout_and_change_detection() -> None:
    status = MigStatus("all-balanced")
    assert status.desired is None
    assert status.node_labels({}) is True and status.desired == "all-balanced"
    assert status.node_labels({"other": "x"}) is False
    assert status.node_labels({CONFIG_LABEL: "all-1g.10gb"}) is True and status.desired == "all-1g.10gb"
    assert status.node_labels({CONFIG_LABEL: " "}) is True and status.desired == "all-balanced"


# ---- device plugin ids → what the reconciler must keep -------------------------------------------

def _reconciler(tmp_path: Any) -> tuple[FakeNVML, MigReconciler, int]:
    nvml = fake(2)
    gi = nvml.create_instance(1, "3g.40gb", 4)
    return nvml, MigReconciler(nvml, tmp_path, allow_mig_mode_change=False), gi


Expect = Callable[[int], "tuple[dict[int, set[int]], frozenset[str]] | None"]
GPU0, GPU1 = "GPU-00000000-h100", "GPU-00000001-h100"  # h100_node's UUIDs


# Each row: device plugin ids (with "{gi}" for the id of the 3g.40gb instance on GPU 1), and what
# they hold as a function of that id.
@pytest.mark.parametrize(("ids", "expected"), [
    ((), lambda gi: ({}, frozenset())),
    ((GPU0,), lambda gi: ({}, frozenset({GPU0}))),
    ((GPU1.upper() + "::3",), lambda gi: ({}, frozenset({GPU1}))),  # a time-slicing replica, any case
    (("1",), lambda gi: ({}, frozenset({GPU1}))),
    ((f"MIG-{GPU1}/{{gi}}/0",), lambda gi: ({1: {gi}}, frozenset())),
    ((f"MIG-{GPU1}/{{gi}}/0::2", "0"), lambda gi: ({1: {gi}}, frozenset({GPU0}))),
    # Not placeable: a GPU this node does not have, a malformed id, and (the stand-in models no MIG
    # device handles) the MIG-UUID and index forms.
    (("GPU-ffffffff-h100",), lambda gi: None),
    ((f"MIG-{GPU1}/x/0",), lambda gi: None),
    (("MIG-4f1e2d3c-0000-5000-8000-000000000001",), lambda gi: None),
    (("0:1",), lambda gi: None),
    (("7",), lambda gi: None),
])
def test_holds_of_device_plugin_ids(tmp_path: Any, ids: tuple[str, ...], expected: Expect) -> None:
    _, mig, gi = _reconciler(tmp_path)
    assert mig.holds_of([i.replace("{gi}", str(gi)) for i in ids]) == expected(gi)


def test_index_and_mig_uuid_ids_through_nvml_mig_devices(tmp_path: Any) -> None:
    # pynvml's MIG device queries, added to the stand-in here: MIG slot n of GPU g is its n-th GPU
    # instance by id.
    nvml, mig, gi = _reconciler(tmp_path)
    slots: dict[tuple[int, int], tuple[str, int]] = {}
    for g, gpu in enumerate(nvml.gpus):
        for n, gid in enumerate(sorted(gpu.gis)):
            slots[(g, n)] = (f"MIG-{g:04x}{gid:04x}-0000-5000-8000-000000000000", gid)
    handles = {id(gpu.handle): g for g, gpu in enumerate(nvml.gpus)}

    def by_index(handle: Any, slot: int) -> Any:
        key = (handles[id(handle)], slot)
        if key not in slots:
            raise nvml.NVMLError_NotFound(nvml.NVML_ERROR_NOT_FOUND)
        return key

    extra: dict[str, Callable[..., Any]] = {
        "nvmlDeviceGetMaxMigDeviceCount": lambda handle: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": by_index,
        "nvmlDeviceGetGpuInstanceId": lambda key: slots[key][1],
    }
    uuid_of = nvml.nvmlDeviceGetUUID
    extra["nvmlDeviceGetUUID"] = lambda h: slots[h][0] if isinstance(h, tuple) else uuid_of(h)
    for name, fn in extra.items():
        setattr(nvml, name, fn)
    assert mig.holds_of([slots[(1, 0)][0].upper()]) == ({1: {gi}}, frozenset())
    assert mig.holds_of(["1:0"]) == ({1: {gi}}, frozenset())
    assert mig.holds_of(["0:0"]) is None  # an empty slot


# ---- the label sink keeps its hands off the user's label -----------------------------------------

def node_meta(api: Any, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) of the Node `name`."""
    meta = k8s.CoreV1Api(api).read_node(name).metadata
    assert meta is not None
    return dict(meta.labels or {}), dict(meta.annotations or {})


def test_user_labels_are_refused_and_never_removed(control_plane: ControlPlane) -> None:
    import uuid

    assert CONFIG_LABEL in USER_LABELS
    with control_plane.client() as api:
        core = k8s.CoreV1Api(api)
        name = f"mig-{uuid.uuid4().hex[:8]}"
        # An annotation that (wrongly) lists the user's label as ours, e.g. from an older agent.
        core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(
            name=name, labels={CONFIG_LABEL: "all-1g.10gb", "topolet.io/numa.nodes": "1"},
            annotations={MANAGED_LABELS_ANNOTATION: f"{CONFIG_LABEL},topolet.io/numa.nodes"})))
        try:
            pub = LabelPublisher(api, name, "topolet-system", sink="node")
            with pytest.raises(ConfigError, match="user"):
                pub.publish({CONFIG_LABEL: "all-7g.80gb"})
            assert pub.publish({STATE_LABEL: "success"}) is True
            labels, _ = node_meta(api, name)
            assert labels[CONFIG_LABEL] == "all-1g.10gb"  # kept, though the annotation listed it
            assert labels[STATE_LABEL] == "success"
            assert "topolet.io/numa.nodes" not in labels  # ours, no longer published: removed
        finally:
            core.delete_node(name)


# ---- the agent on a real API server --------------------------------------------------------------

def agent_args(node: KubeNode, *extra: str) -> AgentConfig:
    return agent_config(build_parser().parse_args([
        "agent", "--mode", "kubernetes", "--kubeconfig", str(node.tmp / "agent.kubeconfig"),
        "--node-name", node.name, "--state-dir", node.state_dir,
        "--features-dir", str(node.tmp / "features.d"), "--cgroup-root", node.root,
        "--listen", "127.0.0.1:0", "--label-sink", "node", "--reconcile-seconds", "0.5",
        "--pod-resources-socket", "", *extra]))


@contextmanager
def running(agent: KubeAgent) -> Iterator[KubeAgent]:
    """The agent's loop on a thread, stopped afterwards."""
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), name="agent", daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        stop.set()
        thread.join(30)
        agent.api.close()
        assert not thread.is_alive()


@pytest.fixture
def mig_node(kube_node: KubeNode, monkeypatch: pytest.MonkeyPatch) -> KubeNode:
    monkeypatch.setenv("POD_NAMESPACE", kube_node.namespace)
    return kube_node


def node_labels(node: KubeNode) -> dict[str, str]:
    return node_meta(node.api, node.name)[0]


def set_config(node: KubeNode, layout: str | None) -> None:
    k8s.CoreV1Api(node.api).patch_node(node.name, {"metadata": {"labels": {CONFIG_LABEL: layout}}})


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_node_label_drives_the_layout_pending_then_success_and_failed(mig_node: KubeNode) -> None:
    node = mig_node
    nvml = fake(2)
    seen_while_creating: list[str | None] = []
    create = nvml.nvmlDeviceCreateGpuInstanceWithPlacement

    def watching_create(*args: Any) -> Any:
        if not seen_while_creating:  # what a reader of the Node sees while the change runs
            seen_while_creating.append(node_labels(node).get(STATE_LABEL))
        return create(*args)

    setattr(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", watching_create)  # noqa: B010
    metrics = Metrics()
    agent = kube_agent(agent_args(node), metrics, nvml=nvml)
    with running(agent):
        wait_for(lambda: node.nrt() is not None, "the agent's first NRT")
        assert STATE_LABEL not in node_labels(node) and not nvml.layout(0)  # nothing asked yet

        set_config(node, "all-1g.10gb")
        wait_for(lambda: node_labels(node).get(STATE_LABEL) == "success", "state success")
        assert seen_while_creating == ["pending"]
        assert all(len(nvml.layout(g)) == 7 for g in range(2))
        assert node_labels(node)[CONFIG_LABEL] == "all-1g.10gb"  # the user's label, untouched
        assert sample(metrics, "topolet_mig_operations_total", op="gpu_instance_create",
                      result="success") == 14
        assert sample(metrics, "topolet_mig_config_state", state="success") == 1

        # Steady: further passes change nothing in NVML and write no label.
        nvml.calls.clear()
        label_writes = sample(metrics, "topolet_api_writes_total", kind="labels")
        passes = sample(metrics, "topolet_reconcile_duration_seconds_count") or 0
        wait_for(lambda: (sample(metrics, "topolet_reconcile_duration_seconds_count") or 0) >= passes + 3,
                 "three more reconciles")
        assert not MUTATING & set(nvml.calls)
        assert sample(metrics, "topolet_api_writes_total", kind="labels") == label_writes

        # A layout this GPU does not know: failed, and the GPUs keep what they hold.
        set_config(node, "no-such-layout")
        wait_for(lambda: node_labels(node).get(STATE_LABEL) == "failed", "state failed")
        assert not MUTATING & set(nvml.calls)
        assert all(len(nvml.layout(g)) == 7 for g in range(2))
        assert sample(metrics, "topolet_mig_config_state", state="failed") == 1

        # The label removed: nothing managed, the state label goes too.
        set_config(node, None)
        wait_for(lambda: STATE_LABEL not in node_labels(node), "the state label removed")
        annotations = node_meta(node.api, node.name)[1]
        assert CONFIG_LABEL not in annotations.get(MANAGED_LABELS_ANNOTATION, "").split(",")


def test_mig_goes_on_with_the_api_down(mig_node: KubeNode, control_plane: ControlPlane) -> None:
    node = mig_node
    nvml = fake(1)
    set_config(node, "all-3g.40gb")
    agent = kube_agent(agent_args(node), Metrics(), nvml=nvml)
    with running(agent):
        wait_for(lambda: node_labels(node).get(STATE_LABEL) == "success", "state success")
        assert [p for p, _, _ in nvml.layout(0)] == ["3g.40gb", "3g.40gb"]
        # The pod watch goes first: an API server with a watch open lingers until the harness kills
        # it, and the watch plays no part in MIG.
        agent.watcher.stop()
        control_plane.stop_apiserver()
        try:
            # Someone destroys an instance while the API is down: the last layout read comes back.
            gi = next(iter(nvml.gpus[0].gis.values()))
            for ci in list(gi.cis.values()):
                nvml.nvmlComputeInstanceDestroy(ci.handle)
            nvml.nvmlGpuInstanceDestroy(gi.handle)
            assert len(nvml.layout(0)) == 1
            wait_for(lambda: len(nvml.layout(0)) == 2, "the instance recreated with the API down")
            assert not control_plane.apiserver_running()
        finally:
            control_plane.start_apiserver()
        wait_for(lambda: node_labels(node).get(STATE_LABEL) == "success", "state success after the outage")


def test_no_mig_change_before_the_node_is_read(mig_node: KubeNode, control_plane: ControlPlane) -> None:
    # The API is down at start: --mig-config is not applied blind (the Node's label may name another
    # layout); once the Node is read, its label wins over the flag.
    node = mig_node
    nvml = fake(1)
    set_config(node, "all-7g.80gb")
    metrics = Metrics()
    control_plane.stop_apiserver()
    try:
        agent = kube_agent(agent_args(node, "--mig-config", "all-1g.10gb"), metrics, nvml=nvml)
        with running(agent):
            wait_for(lambda: (sample(metrics, "topolet_reconcile_duration_seconds_count") or 0) >= 3,
                     "three reconciles with the API down")
            assert not MUTATING & set(nvml.calls)
            # Publishing failed, and says so (the NRT and labels need the API; they are retried).
            for kind in ("nrt", "labels"):
                assert (sample(metrics, "topolet_api_write_errors_total", kind=kind) or 0) >= 1, kind
            assert sample(metrics, "topolet_api_writes_total", kind="nrt") == 0
            control_plane.start_apiserver()
            wait_for(lambda: node_labels(node).get(STATE_LABEL) == "success", "state success")
            assert nvml.layout(0) == [("7g.80gb", 0, 8)]
            wait_for(lambda: (sample(metrics, "topolet_api_writes_total", kind="nrt") or 0) >= 1,
                     "the NRT written once the API is back")
    finally:
        control_plane.start_apiserver()


def test_instances_pods_hold_are_kept(mig_node: KubeNode) -> None:
    # A pod holds a MIG device (no CUDA process yet): a layout that needs its slot fails, and the
    # instance stays; once the kubelet no longer lists it, the layout applies.
    node = mig_node
    nvml = fake(1)
    gi = nvml.create_instance(0, "3g.40gb", 4)
    held = nvml.gpus[0].gis[gi]
    set_config(node, "all-1g.10gb")
    device = Device("nvidia.com/mig-3g.40gb", (f"MIG-{nvml.gpus[0].uuid}/{gi}/0",), frozenset())
    with PodResourcesStandIn({(node.namespace, "train", "c0"): [device]}) as kubelet:
        args = replace(agent_args(node), pod_resources_socket=kubelet.path)
        agent = kube_agent(args, Metrics(), nvml=nvml)
        with running(agent):
            wait_for(lambda: node_labels(node).get(STATE_LABEL) == "failed", "state failed")
            assert nvml.gpus[0].gis.get(gi) is held and "List" in kubelet.calls
            kubelet.assignments = {}
            wait_for(lambda: node_labels(node).get(STATE_LABEL) == "success", "state success")
            assert len(nvml.layout(0)) == 7


def test_a_kubelet_that_does_not_answer_holds_mig_back(mig_node: KubeNode) -> None:
    # Its socket is there but answers garbage: which instances pods hold is unknown, so the idle
    # instance the layout would replace stays, and the state stays pending.
    node = mig_node
    nvml = fake(1)
    nvml.create_instance(0, "3g.40gb", 4)
    set_config(node, "all-1g.10gb")
    metrics = Metrics()
    with PodResourcesStandIn({}, mode="garbage") as kubelet:
        args = replace(agent_args(node), pod_resources_socket=kubelet.path)
        agent = kube_agent(args, metrics, nvml=nvml)
        with running(agent):
            wait_for(lambda: node_labels(node).get(STATE_LABEL) == "pending", "state pending")
            passes = sample(metrics, "topolet_reconcile_duration_seconds_count") or 0
            wait_for(lambda: (sample(metrics, "topolet_reconcile_duration_seconds_count") or 0) >= passes + 3,
                     "three more reconciles")
            assert kubelet.calls and not MUTATING & set(nvml.calls)
            assert node_labels(node)[STATE_LABEL] == "pending"
            assert nvml.layout(0) == [("3g.40gb", 4, 4)]
