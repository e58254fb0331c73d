"""GPU labels (valid, nvidia.com/* only with GFD compatibility; the registered "gpu" source through the
label builder and `topolet discover`) and per-NUMA GPU capacity fed from the inventory and the state."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.enforce.state import Allocation, Owner, State
from agent.gpu.capacity import numa_gpu_capacity
from agent.gpu.discover import gpus_from_topology
from agent.gpu.labels import gpu_features, gpu_labels, valid_label_key, valid_label_value
from agent.gpu.model import GPU, label_safe
from agent.gpu.planner import ExistingInstance
from agent.labels import build_label_set
from agent.labels.registry import registered_sources
from agent.topology.cpuset import CPUSet
from agent.topology.model import Topology
from tests.conftest import REPO


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", numa: int = 0, mig: bool | None = None) -> GPU:
    return GPU(index, f"GPU-{index}", name, label_safe(name), 80 << 30, f"0000:{index:02x}:00.0", 0x2330,
               numa, CPUSet(), index, (9, 0), True, mig, mig)


def test_hgx_labels(hgx_topology: Topology) -> None:
    gpus = gpus_from_topology(hgx_topology).gpus
    labels = gpu_labels(gpus, mig_layout="all-1g.10gb+me")
    assert labels == {
        "topolet.io/gpu.count": "8",
        "topolet.io/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "topolet.io/gpu.memory": "81920",
        "topolet.io/gpu.numa-nodes": "0_1",
        "topolet.io/gpu.mig-capable": "true",
        "topolet.io/gpu.mig-layout": "all-1g.10gb.me",
    }


def test_gfd_compat_adds_nvidia_labels(hgx_topology: Topology) -> None:
    gpus = gpus_from_topology(hgx_topology).gpus
    labels = gpu_labels(gpus, gfd_compat=True, driver_version="550.54.15", cuda_version="12.4")
    nv = {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}
    assert nv == {
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81920", "nvidia.com/mig.capable": "true",
        "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.family": "hopper", "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54", "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "4",
    }


def test_mixed_products_and_no_gpus() -> None:
    labels = gpu_labels([gpu(0), gpu(1, "NVIDIA A100-SXM4-80GB")])
    assert labels["topolet.io/gpu.product"] == "mixed"
    assert gpu_labels([]) == {}


def test_unknown_memory_is_left_out_not_published_as_zero() -> None:
    labels = gpu_labels([replace(gpu(0), memory_bytes=0)], gfd_compat=True)
    assert "topolet.io/gpu.memory" not in labels and "nvidia.com/gpu.memory" not in labels
    assert labels["topolet.io/gpu.count"] == "1"


def test_gpu_source_is_registered_and_yields_both_namespaces(hgx_topology: Topology) -> None:
    assert "gpu" in [s.name for s in registered_sources()]
    features = list(gpu_features(hgx_topology))
    assert {f.namespace for f in features} == {"topolet.io", "nvidia.com"}
    assert {f.name for f in features if f.namespace == "topolet.io"} >= {"gpu.count", "gpu.numa-nodes"}


@pytest.mark.parametrize("gfd", [False, True])
def test_builder_gates_nvidia_labels(hgx_topology: Topology, gfd: bool) -> None:
    result = build_label_set(hgx_topology, gfd_compat=gfd)
    assert result.failed_sources == ()
    labels = result.labels
    assert labels["topolet.io/gpu.count"] == "8"
    assert labels["topolet.io/gpu.numa-nodes"] == "0_1"
    assert labels["feature.node.kubernetes.io/pci-0302_10de.present"] == "true"
    nvidia = {k for k in labels if k.startswith("nvidia.com/")}
    assert bool(nvidia) == gfd
    if gfd:
        assert labels["nvidia.com/gpu.count"] == "8" and labels["nvidia.com/gpu.family"] == "hopper"


def _discover_labels(root: Path, *extra: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "agent.cli", "discover", "--fsroot", str(root),
                          "--format", "labels", *extra], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120, check=True)
    return dict(line.split("=", 1) for line in out.stdout.splitlines() if line)


def test_discover_labels_on_the_power9_v100_dump(dump_root: Callable[[str], Path]) -> None:
    """hwloc's POWER9 + 6 V100 dump: vendor files are missing, GPU-memory NUMA nodes vouch for them."""
    root = dump_root("nvidiagpunumanodes")
    plain = _discover_labels(root)
    assert plain["topolet.io/gpu.count"] == "6"
    assert plain["topolet.io/gpu.numa-nodes"] == "0_8"
    assert not [k for k in plain if k.startswith("nvidia.com/")]
    compat = _discover_labels(root, "--gfd-compat")
    assert compat["nvidia.com/gpu.count"] == "6"
    assert {k: v for k, v in compat.items() if not k.startswith("nvidia.com/")} == plain


def test_discover_labels_on_the_hgx_fixture(hgx_root: Path) -> None:
    plain = _discover_labels(hgx_root)
    assert plain["topolet.io/gpu.count"] == "8" and plain["topolet.io/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert not [k for k in plain if k.startswith("nvidia.com/")]


_text = st.text(st.characters(codec="utf-8"), max_size=90)


@given(st.lists(st.tuples(_text, st.integers(-1, 7)), min_size=1, max_size=6), _text, _text, _text,
       st.booleans())
def test_labels_always_valid(specs: list[tuple[str, int]], layout: str, driver: str, cuda: str,
                             gfd: bool) -> None:
    gpus = [replace(gpu(i, name, numa), product=label_safe(name)) for i, (name, numa) in enumerate(specs)]
    labels = gpu_labels(gpus, gfd_compat=gfd, mig_layout=layout, driver_version=driver, cuda_version=cuda)
    assert labels["topolet.io/gpu.count"] == str(len(gpus))
    for k, v in labels.items():
        assert valid_label_key(k) and valid_label_value(v), (k, v)
        assert gfd or not k.startswith("nvidia.com/")


def test_numa_capacity_whole_gpus_and_mig() -> None:
    gpus = [gpu(0, numa=0), gpu(1, numa=0, mig=True), gpu(2, numa=1), gpu(3, numa=-1)]
    mig = {1: [ExistingInstance("3g.40gb", 0, 4, in_use=True), ExistingInstance("3g.40gb", 4, 4),
               ExistingInstance("1g.10gb+me", 0, 1)]}
    cap = numa_gpu_capacity(gpus, mig, gpus_in_use={2})
    assert cap == {
        0: {"nvidia.com/gpu": (1, 1), "nvidia.com/mig-3g.40gb": (2, 1), "nvidia.com/mig-1g.10gb.me": (1, 1)},
        1: {"nvidia.com/gpu": (1, 0)},
        -1: {"nvidia.com/gpu": (1, 1)},
    }


def test_capacity_from_inventory_and_state(hgx_root: Path, hgx_topology: Topology) -> None:
    """Held GPUs come from the state file (PCI addresses), the inventory from discovery."""
    gpus = gpus_from_topology(hgx_topology, hgx_root).gpus
    state = State((
        Allocation("a", CPUSet([0]), CPUSet(), "topolet/a", Owner(), "exec", 1.0, ("0000:18:00.0",)),
        Allocation("b", CPUSet([60]), CPUSet(), "topolet/b", Owner(), "exec", 1.0,
                   ("0000:9a:00.0", "0000:ab:00.0")),
    ))
    cap = numa_gpu_capacity(gpus, None, state.held_gpus())
    assert cap == {0: {"nvidia.com/gpu": (4, 3)}, 1: {"nvidia.com/gpu": (4, 2)}}
    assert gpus[7].uuid
    by_uuid = numa_gpu_capacity(gpus, None, {gpus[7].uuid, 3})  # a UUID and an index
    assert by_uuid == {0: {"nvidia.com/gpu": (4, 3)}, 1: {"nvidia.com/gpu": (4, 3)}}
