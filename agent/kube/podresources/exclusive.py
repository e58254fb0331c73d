"""Which CPUs the kubelet's own CPU manager hands out exclusively: `cpuManagerPolicy: static` or not.

The kubelet's pod-resources `GetAllocatableResources` lists CPUs for exclusive use under the static
policy and none under `none` (kubelet `pkg/kubelet/cm/cpumanager`: the none policy's allocatable set
is empty).  `kubelet_exclusive_cpus(socket)` asks it.  grpc costs ~13 MiB of resident memory, which
an agent on a node without GPU workloads never loads, so unless grpc is loaded already the question
is asked from a child process (`python -m agent.kube.podresources.exclusive SOCKET`, which prints
the cpulist, or "none" when the kubelet gives no answer).
"""

from __future__ import annotations

import subprocess
import sys

from agent.topology.cpuset import CPUSet

PROBE_TIMEOUT_SECONDS = 30.0  # interpreter and grpc start-up included


def _ask(socket: str) -> CPUSet | None:
    from agent.kube.podresources.client import PodResourcesClient

    client = PodResourcesClient(socket)
    try:
        allocatable = client.allocatable()
    finally:
        client.close()
    return None if allocatable is None else CPUSet(allocatable.cpu_ids)


def kubelet_exclusive_cpus(socket: str, in_process: bool | None = None) -> CPUSet | None:
    """The CPUs the kubelet's CPU manager may give exclusively (empty: policy none); None = no answer.

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
    answer = done.stdout.strip()
    if done.returncode != 0 or answer == "none":
        return None
    try:
        return CPUSet.parse(answer) if answer else CPUSet()
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    """Print the kubelet's exclusive-capable CPUs as a cpulist ("" for none), or "none" without an answer."""
    if len(argv) != 1:
        print("usage: python -m agent.kube.podresources.exclusive SOCKET", file=sys.stderr)
        return 2
    cpus = _ask(argv[0])
    print("none" if cpus is None else cpus.cpulist())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
