"""GPU labels (valid, nvidia.com/* only with GFD compatibility) and per-NUMA GPU capacity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agent.gpu.capacity import numa_gpu_capacity
from agent.gpu.discover import discover_sysfs
from agent.gpu.labels import gpu_labels, valid_label_key, valid_label_value
from agent.gpu.model import GPU, label_safe
from agent.gpu.planner import ExistingInstance
from agent.topology.cpuset import CPUSet
from tests.gpu.sysfs_fixture import build_hgx


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", numa: int = 0, mig: bool | None = None) -> GPU:
    return GPU(index, f"GPU-{index}", name, label_safe(name), 80 << 30, f"0000:{index:02x}:00.0", 0x2330,
               numa, CPUSet(), index, (9, 0), True, mig, mig)


def test_hgx_labels(tmp_path: Path) -> None:
    gpus = discover_sysfs(build_hgx(tmp_path)).gpus
    labels = gpu_labels(gpus, mig_layout="all-1g.10gb+me")
    assert labels == {
        "topolet.io/gpu.count": "8",
        "topolet.io/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "topolet.io/gpu.memory": "81920",
        "topolet.io/gpu.numa-nodes": "0_1",
        "topolet.io/gpu.mig-capable": "true",
        "topolet.io/gpu.mig-layout": "all-1g.10gb.me",
    }


def test_gfd_compat_adds_nvidia_labels(tmp_path: Path) -> None:
    gpus = discover_sysfs(build_hgx(tmp_path)).gpus
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
