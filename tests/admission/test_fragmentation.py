"""Shared-GPU fragmentation and `gpu_choice`, one row each, on tiny nodes whose figures are worked by hand.

MIX is the target workload of most rows: half the pods ask for half a GPU (500), half for one whole
GPU, each with one CPU.  Its FGD fragment of a node is 0.5 * (free on GPUs with < 500 free, or all free
if no GPU has 500) + 0.5 * (free on partly used GPUs, or all free if no GPU is whole).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.admission.engine.fragmentation import (
    GpuMix,
    cluster_cpu_per_milli,
    fits,
    fragmentation,
    gpu_choice,
    gpu_supply,
)
from agent.admission.engine.model import ClusterView, Gang, Node, Placement, PodSet, Resources
from agent.admission.engine.place import place

GIB = 1 << 30
HALF = Resources(cpu_milli=1000, memory=GIB, gpu_milli=500)
ONE = Resources(cpu_milli=1000, memory=GIB, gpus=1)
CPU_ONLY = Resources(cpu_milli=1000, memory=GIB)
MIX = ((HALF, 0.5), (ONE, 0.5))
FGD = GpuMix(MIX, stranding=0.0)  # the paper's measure, no stranded-GPU term


@dataclass(frozen=True)
class FragRow:
    name: str
    cpu_milli: int
    gpus: tuple[int, ...]
    mix: tuple[tuple[Resources, float], ...]
    want: float
    memory: int = 8 * GIB


FRAG_ROWS = [
    # half: usable 1000+600, fragment 300; whole: usable 1000, fragment 900 -> 0.5*300 + 0.5*900
    FragRow("mixed GPUs", 4000, (1000, 300, 600), MIX, 600.0),
    # no type fits the CPU left: every free thousandth is a fragment for both
    FragRow("CPU exhausted", 500, (1000, 300, 600), MIX, 1900.0),
    FragRow("memory exhausted", 4000, (1000, 300, 600), MIX, 1900.0, memory=GIB // 2),
    FragRow("empty node", 4000, (1000, 1000), MIX, 0.0),
    # half fits no GPU (400 < 500), whole fits none: 0.5*800 + 0.5*800
    FragRow("only slivers", 4000, (400, 400), MIX, 800.0),
    FragRow("nothing free", 4000, (0, 0), MIX, 0.0),
    # a pod that asks for no GPU can use none of it: 0.5*1000 + 0.5*0
    FragRow("CPU-only type", 4000, (1000,), ((CPU_ONLY, 0.5), (HALF, 0.5)), 500.0),
    # the GPU order does not matter
    FragRow("order", 4000, (600, 1000, 300), MIX, 600.0),
]


@pytest.mark.parametrize("row", FRAG_ROWS, ids=lambda r: r.name)
def test_fragmentation(row: FragRow) -> None:
    assert fragmentation(row.cpu_milli, row.memory, row.gpus, GpuMix(row.mix, stranding=0.0)) == row.want


def test_stranding_counts_gpus_the_free_cpu_cannot_feed() -> None:
    # one type, a whole GPU with 4 CPUs: 4 CPU-millicores per GPU thousandth
    mix = ((Resources(cpu_milli=4000, gpus=1), 1.0),)
    # the type still fits (FGD fragment 0) but 4 CPUs feed one of the two free GPUs
    assert GpuMix(mix, stranding=0.0).fragmentation(4000, 0, (1000, 1000)) == 0.0
    assert GpuMix(mix, stranding=1.0).fragmentation(4000, 0, (1000, 1000)) == 1000.0
    assert GpuMix(mix, stranding=1.0).fragmentation(8000, 0, (1000, 1000)) == 0.0


def test_cpu_only_pod_is_held_to_the_whole_workloads_cpu_per_gpu() -> None:
    # GPU pods ask 4 CPUs per GPU, CPU-only pods as many again: the whole workload asks 8 per GPU
    mix = GpuMix(((Resources(cpu_milli=4000, gpus=1), 0.5), (Resources(cpu_milli=4000), 0.5)))
    pod = Resources(cpu_milli=4000)
    # 12 -> 8 CPUs by the GPU pods' 4 per GPU: both GPUs fed before and after, no rise; by the whole
    # workload's 8: 1.5 GPUs fed -> 1, so 500 more stranded
    assert gpu_choice(node((1000, 1000), cpu_milli=12000), pod, mix) == (500.0, None)
    # 20 -> 16 CPUs feed both GPUs either way
    assert gpu_choice(node((1000, 1000), cpu_milli=20000), pod, mix) == (0.0, None)
    # a GPU pod is held to the GPU pods' ratio: 12 -> 8 CPUs, 2 -> 1 free GPUs, all fed; only the
    # CPU-only type's fragment falls, 0.5 * 2000 -> 0.5 * 1000
    assert gpu_choice(node((1000, 1000), cpu_milli=12000), Resources(cpu_milli=4000, gpus=1), mix) \
        == (-500.0, None)


def node(gpus: tuple[int, ...], cpu_milli: int = 4000, memory: int = 8 * GIB, whole: int = 0) -> Node:
    return Node("n", free=Resources(cpu_milli=cpu_milli, memory=memory, gpus=whole), gpu_free_milli=gpus)


@dataclass(frozen=True)
class ChoiceRow:
    name: str
    node: Node
    request: Resources
    want: tuple[float, int | None] | None
    mix: tuple[tuple[Resources, float], ...] | GpuMix = FGD


CHOICE_ROWS = [
    # 200 on GPU 0 -> fragment 1000, on GPU 1 -> 400, on GPU 2 -> 700; before 600
    ChoiceRow("share takes the GPU that fragments least", node((1000, 300, 600)),
              Resources(gpu_milli=200), (-200.0, 1)),
    # whole GPU: (0, 300, 600) has fragment 0.5*300 + 0.5*900 = 600, as before
    ChoiceRow("whole GPU", node((1000, 300, 600)), Resources(gpus=1), (0.0, None)),
    # two whole free GPUs -> fragment 0; after one goes: half 0, whole 0 -> 0
    ChoiceRow("whole GPU on an empty node", node((1000, 1000)), Resources(gpus=1), (0.0, None)),
    # before: 0.5*0 + 0.5*1000; after (300, 500): 0.5*300 + 0.5*800
    ChoiceRow("equal GPUs: the first", node((500, 500)), Resources(gpu_milli=200), (50.0, 0)),
    ChoiceRow("share too large", node((600, 300)), Resources(gpu_milli=700), None),
    ChoiceRow("too few whole GPUs", node((1000, 300)), Resources(gpus=2), None),
    ChoiceRow("too much CPU", node((1000,)), Resources(cpu_milli=5000, gpus=1), None),
    ChoiceRow("too much memory", node((1000,)), Resources(memory=9 * GIB, gpu_milli=100), None),
    # no sharing state reported: the node's free devices are whole
    ChoiceRow("whole devices without sharing state", node((), whole=2), Resources(gpus=2), (0.0, None)),
    # empty mix: best fit, the tightest GPU that holds the share; score = free GPU left
    ChoiceRow("best fit without a mix", node((1000, 300, 600)), Resources(gpu_milli=200),
              (1700.0, 1), mix=()),
    ChoiceRow("raw mix is compiled", node((1000, 300, 600)), Resources(gpu_milli=200), (-200.0, 1),
              mix=MIX),
]


@pytest.mark.parametrize("row", CHOICE_ROWS, ids=lambda r: r.name)
def test_gpu_choice(row: ChoiceRow) -> None:
    assert gpu_choice(row.node, row.request, row.mix) == row.want
    assert fits(row.node, row.request) == (row.want is not None)


def test_cpu_only_pod_avoids_stranding_gpus() -> None:
    # whole-GPU pods need 1 CPU per GPU: on the small node 3 CPUs would leave 1 CPU for 2 free GPUs
    mix = ((Resources(cpu_milli=1000, gpus=1), 1.0),)
    small, big = node((1000, 1000), cpu_milli=4000), node((1000, 1000), cpu_milli=64000)
    pod = Resources(cpu_milli=3000)
    fgd = GpuMix(mix, stranding=0.0)
    assert gpu_choice(small, pod, fgd) == gpu_choice(big, pod, fgd) == (0.0, None)
    topolet = GpuMix(mix, stranding=1.0)
    assert gpu_choice(small, pod, topolet) == (1000.0, None)
    assert gpu_choice(big, pod, topolet) == (0.0, None)


def test_share_prefers_a_used_gpu_over_a_whole_one() -> None:
    # a share on a whole GPU would cost the whole-GPU type its only GPU
    choice = gpu_choice(node((1000, 600)), Resources(gpu_milli=500), FGD)
    assert choice is not None and choice[1] == 1


# MIX with its whole-GPU type limited to V100 nodes: on any other model only the half type fits
V100_ONLY = (None, frozenset({"V100M16", "V100M32"}))


@pytest.mark.parametrize(("model", "want"), [
    # V100: as MIX, 0.5*300 + 0.5*900
    ("V100M32", 600.0),
    # T4: the whole-GPU type fits nowhere, all 1900 free is its fragment: 0.5*300 + 0.5*1900
    ("T4", 1100.0),
    # a node that names no model hosts no constrained type
    ("", 1100.0),
])
def test_fragmentation_of_model_constrained_types(model: str, want: float) -> None:
    mix = GpuMix(MIX, stranding=0.0, models=V100_ONLY)
    assert mix.fragmentation(4000, 8 * GIB, (1000, 300, 600), model) == want
    assert fragmentation(4000, 8 * GIB, (1000, 300, 600), mix, model) == want


def test_unconstrained_models_change_nothing() -> None:
    mix = GpuMix(MIX, stranding=0.0, models=(None, None))
    assert not mix.constrained
    assert mix.fragmentation(4000, 8 * GIB, (1000, 300, 600), "T4") == 600.0


def test_models_must_match_the_mix() -> None:
    with pytest.raises(ValueError, match="1 GPU model sets for 2 pod types"):
        GpuMix(MIX, models=(None,))


def test_whole_gpu_keeps_off_the_nodes_a_constrained_type_needs() -> None:
    # without models both nodes score alike; with the whole-GPU type V100-only, taking a V100's whole
    # GPU costs that type, taking a T4's costs nothing (nobody else can use a T4 whole GPU)
    def on(model: str) -> Node:
        return Node("n", free=Resources(cpu_milli=4000, memory=8 * GIB, gpus=2),
                    gpu_free_milli=(1000, 1000), gpu_model=model)

    one = Resources(cpu_milli=1000, memory=GIB, gpus=1)
    assert gpu_choice(on("T4"), one, MIX) == gpu_choice(on("V100M16"), one, MIX)
    # V100 (1000, 1000) -> (0, 1000): fragment 0 -> 0; T4: 0.5*2000 -> 0.5*1000, a fall of 500
    assert gpu_choice(on("V100M16"), one, MIX, V100_ONLY) == (0.0, None)
    assert gpu_choice(on("T4"), one, MIX, V100_ONLY) == (-500.0, None)


def gpu_node(name: str, model: str, gpus: tuple[int, ...] = (1000, 1000)) -> Node:
    free = Resources(cpu_milli=4000, memory=8 * GIB, gpus=gpus.count(1000))
    return Node(name, free=free, capacity=Resources(cpu_milli=4000, memory=8 * GIB, gpus=len(gpus)),
                gpu_free_milli=gpus, gpu_model=model)


def test_gpu_supply_counts_each_models_gpus_when_empty() -> None:
    nodes = [gpu_node("a", "V100M16", (0, 300)), gpu_node("b", "T4"), gpu_node("c", "T4", (1000,)),
             Node("cpu", free=Resources(cpu_milli=4000))]
    assert gpu_supply(nodes) == {"V100M16": 2, "T4": 3}


# half the pods take a whole GPU anywhere, half one V100: the cluster has 2 V100 and 2 T4 GPUs, so
# the V100-only half (500 of the 1000 GPU thousandths asked per pod) falls on half the GPUs:
# pressure(V100) = (500 / 1000) / (2 / 4) = 1, pressure(T4) = 0
ANY_OR_V100 = ((ONE, 0.5), (ONE, 0.5))
V100_HALF = (None, frozenset({"V100M16"}))
SUPPLY = {"V100M16": 2, "T4": 2}


def test_gpu_taken_from_a_model_constrained_pods_need_is_priced() -> None:
    mix = GpuMix(ANY_OR_V100, stranding=0.0, models=V100_HALF, supply=SUPPLY)
    assert mix.pressure == {"V100M16": 1.0, "T4": 0.0}
    # V100 (1000, 1000) -> (0, 1000): no fragment before or after, but 1000 thousandths at pressure 1;
    # T4: the V100 type's fragment 0.5 * 2000 -> 0.5 * 1000
    assert gpu_choice(gpu_node("v", "V100M16"), ONE, mix) == (1000.0, None)
    assert gpu_choice(gpu_node("t", "T4"), ONE, mix) == (-500.0, None)
    # without the supply nothing is priced
    plain = GpuMix(ANY_OR_V100, stranding=0.0, models=V100_HALF)
    assert gpu_choice(gpu_node("v", "V100M16"), ONE, plain) == (0.0, None)


def test_engine_keeps_the_gpus_a_constrained_type_needs() -> None:
    # the V100 node comes first in name order: without models the tie goes to it
    nodes = (gpu_node("a-v100", "V100M16"), gpu_node("b-t4", "T4"))
    gang = Gang("g", (PodSet("p", 1, ONE),))
    plain = place(ClusterView(nodes=nodes, gpu_mix=ANY_OR_V100), gang)
    assert isinstance(plain, Placement) and plain.pods[0].node == "a-v100"
    aware = place(ClusterView(nodes=nodes, gpu_mix=ANY_OR_V100, gpu_mix_models=V100_HALF), gang)
    assert isinstance(aware, Placement) and aware.pods[0].node == "b-t4"


def test_cluster_cpu_per_milli_is_the_empty_clusters_cpu_per_gpu() -> None:
    nodes = [gpu_node("a", "V100M16", (0, 300)), gpu_node("b", "T4"),
             Node("cpu", free=Resources(cpu_milli=4000), capacity=Resources(cpu_milli=8000))]
    # 4 + 4 + 8 CPUs for 4 GPUs, used or not: 16000 millicores per 4000 GPU thousandths
    assert cluster_cpu_per_milli(nodes) == 4.0
    assert cluster_cpu_per_milli([Node("cpu", capacity=Resources(cpu_milli=8000))]) == 0.0


# GPU pods ask 4 CPUs per GPU, CPU-only pods as many again: the whole workload asks 8 per GPU
GPU_AND_CPU = ((Resources(cpu_milli=4000, gpus=1), 0.5), (Resources(cpu_milli=4000), 0.5))


@pytest.mark.parametrize(("cluster_cpu", "short", "want"), [
    # unknown cluster: held to the GPU pods' 4 per GPU; 12 -> 8 CPUs feed every free GPU, only the
    # CPU-only type's fragment falls, 0.5 * 2000 -> 0.5 * 1000
    (0.0, False, -500.0),
    # the cluster has 10 CPUs per GPU, more than the 8 asked: the same
    (10.0, False, -500.0),
    # it has 6, less than the 8 asked: held to 8 per GPU, 12 CPUs feed 1.5 of 2 free GPUs (500
    # stranded) before, 8 feed the 1 left after (none): the pod also takes 500 stranded, -1000
    (6.0, True, -1000.0),
])
def test_a_workload_asking_more_cpu_than_the_cluster_has_holds_gpus_to_its_whole_ratio(
        cluster_cpu: float, short: bool, want: float) -> None:
    mix = GpuMix(GPU_AND_CPU, cluster_cpu_per_milli=cluster_cpu)
    assert mix.cpu_short == short
    pod = Resources(cpu_milli=4000, gpus=1)
    assert gpu_choice(node((1000, 1000), cpu_milli=12000), pod, mix) == (want, None)
    assert gpu_choice(node((1000, 1000), cpu_milli=12000), pod, GPU_AND_CPU, cluster_cpu=cluster_cpu) \
        == (want, None)
    # a CPU-only pod is held to the whole ratio either way: 12 -> 8 CPUs strand 500 more
    assert gpu_choice(node((1000, 1000), cpu_milli=12000), Resources(cpu_milli=4000), mix) == (500.0, None)


def test_engine_fills_cpu_poor_nodes_when_the_workload_asks_more_cpu_than_the_cluster_has() -> None:
    # GPU pods ask 4 CPUs per GPU, CPU-only pods 8 CPUs: the workload asks 12 per GPU
    mix = ((Resources(cpu_milli=4000, memory=GIB, gpus=1), 0.5), (Resources(cpu_milli=8000, memory=GIB), 0.5))

    def host(name: str, cpu: int, gpus: int = 2) -> Node:
        cap = Resources(cpu_milli=cpu, memory=64 * GIB, gpus=gpus)
        return Node(name, free=cap, capacity=cap, gpu_free_milli=(1000,) * gpus)

    gpu_nodes = (host("a-poor", 8000), host("b-rich", 24000))
    gang = Gang("g", (PodSet("p", 1, Resources(cpu_milli=6000, memory=GIB, gpus=1)),))
    # with a 512-CPU node the cluster has CPU to spare: held to the GPU pods' 4 per GPU, the poor node
    # would keep 2 CPUs for its last GPU, so the pod goes to the rich one
    spare = place(ClusterView(nodes=(*gpu_nodes, host("c-cpu", 512000, 0)), gpu_mix=mix), gang)
    assert isinstance(spare, Placement) and spare.pods[0].node == "b-rich"
    # without it the cluster has 8 CPUs per GPU, less than the 12 asked: the poor node's 8 CPUs
    # cannot feed its GPUs at 12 each anyway, so the pod (6 CPUs for a GPU) takes one there and the
    # rich node keeps its CPUs for the CPU-only pods
    short = place(ClusterView(nodes=gpu_nodes, gpu_mix=mix), gang)
    assert isinstance(short, Placement) and short.pods[0].node == "a-poor"
