"""Which CPUs the kubelet's CPU manager hands out exclusively, and which device resources it offers.

`kubelet_offer(socket)` asks `GetAllocatableResources` (`kubelet_exclusive_cpus`: the CPUs alone),
from a child process unless grpc is loaded already (`python -m agent.kube.kubelet.podresources.exclusive
SOCKET` prints the cpulist, then the device resource names, or "none"), so a node without devices
never pays grpc's ~13 MiB (README.md).
"""

from __future__ import annotations

import subprocess
import sys

from agent.api.objects import is_extended_resource
from agent.topology.cpuset import CPUSet

PROBE_TIMEOUT_SECONDS = 30.0  # interpreter and grpc start-up included

Offer = tuple[CPUSet, frozenset[str]]  # exclusive-capable CPUs, device plugin resource names


def _ask(socket: str) -> Offer | None:
    from agent.kube.kubelet.podresources.client import PodResourcesClient

    client = PodResourcesClient(socket)
    try:
        allocatable = client.allocatable()
    finally:
        client.close()
    if allocatable is None:
        return None
    return CPUSet(allocatable.cpu_ids), frozenset(d.resource for d in allocatable.devices
                                                  if is_extended_resource(d.resource))


def kubelet_offer(socket: str, in_process: bool | None = None) -> Offer | None:
    """(the CPUs the kubelet's CPU manager may give exclusively (empty: policy none), the extended
    resource names of the devices it can hand out); None = no answer.

    `in_process`: ask from this process (True) or a child (False); None: here only if grpc is loaded.
    """
    if in_process is None:
        in_process = "grpc" in sys.modules
    if in_process:
        return _ask(socket)
    try:
        done = subprocess.run([sys.executable, "-m", __name__, socket], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_SECONDS, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines or lines[0].strip() == "none":
        return None
    try:
        cpus = CPUSet.parse(lines[0].strip()) if lines[0].strip() else CPUSet()
    except ValueError:
        return None
    names = lines[1].split() if len(lines) > 1 else []
    return cpus, frozenset(n for n in names if is_extended_resource(n))  # a child's word, checked again


def kubelet_exclusive_cpus(socket: str, in_process: bool | None = None) -> CPUSet | None:
    """The CPUs the kubelet's CPU manager may give exclusively (empty: policy none); None = no answer."""
    offer = kubelet_offer(socket, in_process)
    return None if offer is None else offer[0]


def main(argv: list[str]) -> int:
    """Print the kubelet's exclusive-capable CPUs as a cpulist ("" for none) and, on the next line, its
    device resource names; "none" without an answer."""
    if len(argv) != 1:
        print("usage: python -m agent.kube.kubelet.podresources.exclusive SOCKET", file=sys.stderr)
        return 2
    offer = _ask(argv[0])
    if offer is None:
        print("none")
    else:
        print(offer[0].cpulist())
        print(" ".join(sorted(offer[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
