"""`topolet exec --gpus N` and the engine's GPU+CPU choice.

Three layers, each as real as this machine allows:

- the alignment logic (`allocate_with_gpus`, the very function the engine calls) on 8-GPU,
  two-NUMA HGX machines built as sysfs trees and scanned by the C helper;
- the engine on THIS machine's real cgroups and state file, with a GPU inventory built for the test:
  a stand-in for the GPUs only (the CPUs, cgroups, processes and state file are real);
- `topolet exec` as a real process: where the node has no GPUs, `--gpus 1` must fail with one clear
  line and run nothing; with a stand-in inventory patched into the launcher's discovery, the command
  must see CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES and the state must hold its GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.alloc.devices import allocate_with_gpus
from agent.alloc.request import Request
from agent.enforce.cgroup import read_cpuset
from agent.enforce.state import Owner
from agent.enforce.state_file import StateFile
from agent.errors import AllocationError
from agent.gpu.discover import discover_gpus, gpus_from_topology
from agent.gpu.model import GPU
from agent.gpu.visible import visible_devices_env
from agent.pinning.engine import PinningEngine
from agent.pinning.refusal import AllocationRefused
from agent.standalone.journal import Event, drain_events
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import Topology
from tests.conftest import REPO
from tests.gpu.sysfs_fixture import build_hgx
from tests.standalone.conftest import Node

NODE0 = CPUSet([*range(0, 56), *range(112, 168)])
NODE1 = CPUSet([*range(56, 112), *range(168, 224)])


def stand_in_gpus(topology: Topology, count: int = 2, *, uuids: bool = False) -> tuple[GPU, ...]:
    """GPUs that do not exist, placed on this machine's first NUMA node (a stand-in for GPUs only)."""
    node = topology.numa_nodes[0]
    name = "NVIDIA H100 80GB HBM3"
    return tuple(GPU(i, f"GPU-stand-in-{i}" if uuids else "", name, "NVIDIA-H100-80GB-HBM3", 80 << 30,
                     f"0000:{0x18 + i:02x}:00.0", 0x2330, node.id, node.cpus, i, (9, 0), True, None, None)
                 for i in range(count))


# --- alignment on the 8-GPU HGX fixtures --------------------------------------------------------

@pytest.fixture(scope="module", params=["known", "minus-one"], ids=["numa-files", "numa-minus-one"])
def hgx(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[Topology, tuple[GPU, ...]]:
    """An HGX H100 node (4 GPUs per NUMA node) as the C scan sees it; with numa_node files saying
    0/1, or -1 as some kernels write (the node then comes from the GPUs' local CPUs)."""
    root = build_hgx(tmp_path_factory.mktemp("hgx"), numa=request.param)
    topo = discover(str(root))
    return topo, gpus_from_topology(topo, root).gpus


def _nodes(topo: Topology, cpus: CPUSet) -> set[int]:
    return {topo.numa_of(c) for c in cpus}


def test_cpus_come_from_the_gpus_node(hgx: tuple[Topology, tuple[GPU, ...]]) -> None:
    topo, gpus = hgx
    cpus, chosen = allocate_with_gpus(topo, topo.cpus, Request(8), gpus, (), 1)
    assert [g.numa_node for g in chosen.gpus] == [0] and _nodes(topo, cpus) == {0}
    # Node 0's GPUs all held: the GPU is on node 1, and the CPUs follow it there although node 0
    # (where the CPU allocator alone would start) is entirely free.
    held = {g.pci_address for g in gpus if g.numa_node == 0}
    cpus, chosen = allocate_with_gpus(topo, topo.cpus, Request(8), gpus, held, 2)
    assert {g.numa_node for g in chosen.gpus} == {1} and cpus <= NODE1 and len(cpus) == 8
    assert not {g.pci_address for g in chosen.gpus} & held


def test_gpus_come_from_the_node_with_free_cpus(hgx: tuple[Topology, tuple[GPU, ...]]) -> None:
    topo, gpus = hgx
    free = topo.cpus - NODE0 | CPUSet([0, 1])  # node 0 has two CPUs left
    cpus, chosen = allocate_with_gpus(topo, free, Request(16, "single-numa-node"), gpus, (), 4)
    assert {g.numa_node for g in chosen.gpus} == {1} and cpus <= NODE1


def test_single_numa_node_requires_the_gpus_node(hgx: tuple[Topology, tuple[GPU, ...]]) -> None:
    topo, gpus = hgx
    held = {g.pci_address for g in gpus if g.numa_node == 0}
    free = topo.cpus - NODE1  # node 1 has the only free GPUs but no free CPUs
    with pytest.raises(AllocationError, match="single-numa-node"):
        allocate_with_gpus(topo, free, Request(4, "single-numa-node"), gpus, held, 1)
    # best-effort still runs it: GPU on node 1, CPUs wherever they are free
    cpus, chosen = allocate_with_gpus(topo, free, Request(4, "best-effort"), gpus, held, 1)
    assert chosen.gpus[0].numa_node == 1 and cpus <= NODE0


def test_more_gpus_than_one_node_spans_two(hgx: tuple[Topology, tuple[GPU, ...]]) -> None:
    topo, gpus = hgx
    cpus, chosen = allocate_with_gpus(topo, topo.cpus, Request(8), gpus, (), 6)
    assert len(chosen.gpus) == 6 and chosen.numa_nodes == frozenset({0, 1})
    with pytest.raises(AllocationError, match="no NUMA node holds 6"):
        allocate_with_gpus(topo, topo.cpus, Request(8, "single-numa-node"), gpus, (), 6)


# --- the engine on this machine's cgroups -------------------------------------------------------

def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "120"])


def test_engine_records_gpus_with_the_cpus_and_frees_them_with_the_owner(node: Node) -> None:
    inventory = stand_in_gpus(node.topology, 2)
    engine = PinningEngine(node.topology, node.layout, StateFile(node.state_dir), gpus=inventory)
    owner = _sleeper()
    try:
        alloc = engine.allocate("gpu-a", Request(1), Owner.of_process(owner.pid), gpus=1)
        assert alloc.gpus == (inventory[0].pci_address,)
        assert read_cpuset(node.layout, alloc.cgroup)[0] == alloc.cpus  # the CPUs are enforced
        assert _nodes(node.topology, alloc.cpus) == {inventory[0].numa_node}
        on_disk = node.state()  # a fresh read of the file: the record is durable
        assert on_disk.get("gpu-a") == alloc and on_disk.held_gpus() == {inventory[0].pci_address}
        # A restarted engine (new object, same file) sees the GPU as held.
        again = PinningEngine(node.topology, node.layout, StateFile(node.state_dir), gpus=inventory)
        with pytest.raises(AllocationRefused, match="1 of 2 free") as refused:
            again.allocate("gpu-b", Request(1), Owner.of_process(owner.pid), gpus=2)
        assert refused.value.reason == "capacity"
        assert node.state() == on_disk  # the refusal wrote nothing
    finally:
        owner.kill()
        owner.wait()
    engine.reconcile()  # the owner is gone: its CPUs and GPUs come back
    assert node.state().allocations == () and node.state().held_gpus() == frozenset()
    owner = _sleeper()
    try:
        both = engine.allocate("gpu-c", Request(1), Owner.of_process(owner.pid), gpus=2)
        assert both.gpus == tuple(g.pci_address for g in inventory)
        assert engine.release("gpu-c")
        assert node.state().held_gpus() == frozenset()
    finally:
        owner.kill()
        owner.wait()


def test_engine_without_gpus_refuses_a_gpu_request(node: Node) -> None:
    engine = PinningEngine(node.topology, node.layout, StateFile(node.state_dir))
    with pytest.raises(AllocationRefused, match="no GPUs") as refused:
        engine.allocate("gpu-x", Request(1), Owner.of_process(os.getpid()), gpus=1)
    assert refused.value.reason == "capacity"
    assert StateFile(node.state_dir).load(missing_ok=True).allocations == ()


# --- `topolet exec --gpus` as a real process ----------------------------------------------------

_DUMP = ("import json, os, sys; "
         "json.dump({'env': dict(os.environ), 'state': open(sys.argv[2]).read()}, open(sys.argv[1], 'w'))")


def _dump_command(node: Node) -> tuple[list[str], Path]:
    out = node.tmp / "command.json"
    return [sys.executable, "-c", _DUMP, str(out), str(Path(node.state_dir) / "state.json")], out


def test_exec_gpus_on_this_node(node: Node) -> None:
    """No GPUs here: one clear line, exit 2, nothing run.  With GPUs: the command sees them."""
    command, out = _dump_command(node)
    result = node.run(node.exec_argv(1, command, "--gpus", "1"))
    real = [g for g in discover_gpus(node.topology).gpus if not g.mig_mode_current]
    if not real:
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            "topolet exec: --gpus 1: this node has no NVIDIA GPUs to hand out whole"]
        assert not out.exists()
        assert drain_events(node.state_dir) == [Event("refused", reason="capacity")]  # for the agent
    else:
        assert result.returncode == 0, result.stderr
        env = json.loads(out.read_text())["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] != ""
        assert env["TOPOLET_GPUS"] in {g.pci_address for g in real}
    assert StateFile(node.state_dir).load(missing_ok=True).allocations == ()


@pytest.mark.parametrize(("args", "message"), [
    (("--cpus", "0", "--gpus", "1"), "--gpus needs exclusive CPUs"),
    (("--cpus", "1", "--gpus", "-1"), "--gpus must be 0 or more"),
])
def test_exec_gpu_usage_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run([sys.executable, "-m", "agent.cli", "exec", *args, "--state-dir",
                             str(tmp_path / "state"), "--", "touch", str(marker)],
                            capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO)},
                            timeout=120, check=False)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr
    assert not marker.exists()


# Runs `topolet exec` with the launcher's GPU discovery replaced by the stand-in inventory.
_STUB = ("import sys; import agent.standalone.launch as launch; "
         "from tests.standalone.test_gpu_exec import stand_in_gpus; "
         "uuids = sys.argv.pop(1) == 'uuids'; "
         "launch._gpu_inventory = lambda n, topo: stand_in_gpus(topo, 2, uuids=uuids); "
         "from agent.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.parametrize("names", ["uuids", "indices"])
def test_exec_command_sees_its_gpus(node: Node, names: str) -> None:
    """The launcher is real; only its GPU inventory is a stand-in (two GPUs on this machine's node)."""
    command, out = _dump_command(node)
    argv = [sys.executable, "-c", _STUB, names, "exec", "--cpus", "1", "--gpus", "1", "--state-dir",
            node.state_dir, "--cgroup-root", node.root, "--", *command]
    result = node.run(argv)
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    env = seen["env"]
    gpu0 = stand_in_gpus(node.topology, 2, uuids=names == "uuids")[0]
    want = gpu0.uuid if names == "uuids" else "0"
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == want
    assert ("CUDA_DEVICE_ORDER" in env) == (names == "indices")
    assert env["TOPOLET_GPUS"] == gpu0.pci_address
    # While the command ran, the state file recorded the GPU with its CPUs.
    running = json.loads(seen["state"])["body"]["allocations"]
    assert [(a["id"], a["gpus"], a["cpus"]) for a in running] == [
        (env["TOPOLET_ALLOCATION"], [gpu0.pci_address], env["TOPOLET_CPUS"])]
    assert node.state().allocations == ()  # released on exit


# --- the environment, as NVIDIA's tools read it -------------------------------------------------

def _gpu(index: int, bus: int, uuid: str = "") -> GPU:
    return GPU(index, uuid, "g", "g", 0, f"0000:{bus:02x}:00.0", 0x2330, 0, CPUSet(), index, None, False,
               None, None)


@pytest.mark.parametrize(("gpus", "want"), [
    ((), {}),
    ((_gpu(3, 0x5d, "GPU-b"), _gpu(1, 0x2a, "GPU-a")),
     {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}),
    ((_gpu(3, 0x5d), _gpu(1, 0x2a, "GPU-a")),  # one UUID unknown: indices in PCI bus order
     {"CUDA_VISIBLE_DEVICES": "1,3", "NVIDIA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
])
def test_visible_devices_env(gpus: tuple[GPU, ...], want: dict[str, str]) -> None:
    assert visible_devices_env(gpus) == want
