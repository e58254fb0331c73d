"""What this node's kubelet says through its pod-resources socket, asked on the enforcer thread.

`Kubelet(socket, gpus)`: `.check_cpu_manager()` sets `.static_cpus` (None: not static, or unknown);
`.refresh_cpus()` and `.refresh_devices()` say whether `.pinned_cpus`, `.assigned_gpus` or the
device plugin devices changed (the last answer stands while the kubelet gives none);
`.gpu_numa_source(topology)` is the pinner's `gpu_numa`; `static_message(cpus)` says why the agent
stands down.  Devices are read only where there are some; grpc loads on the first question
(README.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agent.api.podplan import ContainerPlan, PodPlan
from agent.topology.cpuset import CPUSet

if TYPE_CHECKING:
    from agent.gpu.model import GPU
    from agent.kube.kubelet.podresources.client import Device
    from agent.topology.model import Topology

log = logging.getLogger("topolet.kube")
CPU_MANAGER_RETRY_SECONDS = 60.0  # a kubelet socket that gave no answer on its CPU manager is asked again
DEVICE_PROBE_SECONDS = 300.0  # a kubelet that offered no device is asked again (plugins register late)


class Kubelet:
    """The kubelet's word on its CPU manager and on the GPUs it handed out; enforcer thread only."""

    def __init__(self, socket: str, gpus: Sequence[GPU]) -> None:
        self.socket = socket
        self.gpus = gpus
        self.static_cpus: CPUSet | None = None  # set when the kubelet turns out to pin CPUs itself
        self.pinned_cpus = CPUSet()  # CPUs its static CPU manager gave containers, as last read
        self._cpu_manager_asked: tuple[int, int] | None = None  # the socket last answered
        self._cpu_manager_retry_at = 0.0
        self._podres: list[Any] = []  # [] not opened yet; [None] off; [client]
        self.gpu_ids: tuple[str, ...] = ()  # GPU device ids the kubelet handed out
        # Whether those ids are the kubelet's word: None without its socket (NVML's processes are all
        # MIG can go by), False while it fails to answer (no MIG change is safe then), True.
        self.answered: bool | None = None
        self._quiet_until = 0.0
        self.assigned_gpus: frozenset[str] = frozenset()  # whole GPUs among them (PCI addresses)
        # Device plugin resources the kubelet offered at its last CPU-manager question (not GPUs).
        self.device_resources: frozenset[str] = frozenset()
        self._device_probe_at = 0.0
        self.offered_devices: tuple[Device, ...] = ()  # every device it can hand out, GPUs' aside
        self.held_devices: tuple[Device, ...] = ()  # those of them containers hold

    def gpu_numa_source(self, topology: Callable[[], Topology]
                        ) -> Callable[[PodPlan, ContainerPlan], frozenset[int] | None] | None:
        """Where containers' devices sit, from the kubelet's pod-resources socket (off when not given);
        `topology` gives the node's topology as it is now.

        grpc is loaded on the first container that asks for devices (GPUs or any other extended
        resource), not at start: it costs ~13 MiB of resident memory, which a node without device
        workloads should not pay.
        """
        if not self.socket:
            return None
        found: list[Any] = []

        def numa_nodes(plan: PodPlan, c: ContainerPlan) -> frozenset[int] | None:
            if not c.wants_devices:
                return None
            if not found:
                client = self._pod_resources()
                if client is None:
                    found.append(None)
                else:
                    from agent.kube.kubelet.podresources.locality import GPULocator

                    found.append(GPULocator(client, lambda: self.gpus))
            locator = found[0]
            if locator is None:
                return None
            from agent.kube.kubelet.podresources.locality import is_gpu_resource

            served = any(n in self.device_resources or (self.gpus and is_gpu_resource(n))
                         for n in c.device_names)
            near: frozenset[int] | None = locator.numa_nodes(plan.namespace, plan.name, c.name,
                                                             topology(), admitting=served)
            return near

        return numa_nodes

    def _pod_resources(self) -> Any:
        """The kubelet's pod-resources client, opened on first use (grpc loads then); None when off."""
        if not self._podres:
            client = None
            if self.socket:
                try:
                    from agent.kube.kubelet.podresources.client import PodResourcesClient
                except ImportError as exc:  # grpcio/protobuf missing: no device information
                    log.warning("pod-resources API unavailable (%s): CPUs are not aligned with GPUs and "
                                "the NRT counts only GPUs held in our state", exc)
                else:
                    client = PodResourcesClient(self.socket)
            self._podres.append(client)
        return self._podres[0]

    def check_cpu_manager(self) -> None:
        """Ask the kubelet whether its CPU manager hands out exclusive CPUs (`static`); if so, set
        `static_cpus` to the CPUs it offers.

        Asked again only when the kubelet's socket is a new one: the kubelet makes it afresh at every
        start, and its policy changes only with a restart."""
        socket = self.socket
        try:
            st = os.stat(socket) if socket else None
        except OSError:
            st = None
        if st is None:
            return
        identity = (st.st_ino, st.st_mtime_ns)
        now = time.monotonic()
        if now < self._cpu_manager_retry_at:
            return
        if identity == self._cpu_manager_asked:
            if self.device_resources or self.gpus or now < self._device_probe_at:
                return
        from agent.kube.kubelet.podresources.exclusive import kubelet_offer

        offer = kubelet_offer(socket)
        if offer is None:
            self._cpu_manager_retry_at = time.monotonic() + CPU_MANAGER_RETRY_SECONDS
            log.warning("the kubelet's pod-resources socket %s gave no answer on its CPU manager; "
                        "asking again in %.0f s", socket, CPU_MANAGER_RETRY_SECONDS)
            return
        cpus, names = offer
        self._device_probe_at = time.monotonic() + DEVICE_PROBE_SECONDS
        if names != self.device_resources and names:
            log.info("the kubelet offers devices of %s: the NRT publishes them per NUMA zone",
                     ", ".join(sorted(names)))
        self.device_resources = self.device_resources | names
        if identity == self._cpu_manager_asked:
            return  # a device probe: the CPU manager's policy changes only with a restart
        self._cpu_manager_asked = identity
        if cpus:
            self.static_cpus = cpus
        else:
            if self.static_cpus is not None:
                log.info("kubelet's CPU manager: policy none now (a restarted kubelet)")
            self.static_cpus = None
            self.pinned_cpus = CPUSet()
            log.info("kubelet's CPU manager: policy none (no exclusive CPUs offered)")

    def refresh_cpus(self) -> bool:
        """Under the kubelet's static CPU manager, read the CPUs it gave containers exclusively; True
        when they changed (the last answer stands while it gives none)."""
        if self.static_cpus is None:
            return False
        client = self._pod_resources()
        if client is None:
            return False
        found = client.exclusive_cpus()
        if found is None:
            return False
        cpus = CPUSet(found)
        if cpus == self.pinned_cpus:
            return False
        self.pinned_cpus = cpus
        return True

    def refresh_devices(self) -> bool:
        """Read which GPUs and other devices the kubelet handed to containers; True when the whole GPUs
        among them, or the devices it offers or containers hold, changed.

        Only on a node with GPUs or device plugin resources: elsewhere grpc is never loaded for this.
        """
        if not self.gpus and not self.device_resources:
            return False
        client = self._pod_resources()
        if client is None:
            return False
        from agent.kube.kubelet.podresources.locality import is_gpu_resource, kubelet_gpus

        failures = client.failures
        listed = client.list()  # {} when the kubelet gives no answer
        if not client.available:
            self.answered = None
        else:
            if client.failures != failures:  # the client leaves the socket alone for a while now
                self._quiet_until = time.monotonic() + client.backoff
            self.answered = time.monotonic() >= self._quiet_until
        if not self.answered:
            # No answer (a call that failed or timed out, as on a loaded node; the quiet time after
            # one; a restarting kubelet's missing socket): its last answer stands.  Read as "nothing
            # handed out", it would show the GPUs free in the NRT until the kubelet answers again,
            # with a write each way.
            return False
        devices = self._refresh_offered(client, listed)
        if not self.gpus:
            return devices
        ids = tuple(sorted({i for devices in listed.values() for d in devices
                            if is_gpu_resource(d.resource) for i in d.ids}))
        self.gpu_ids = ids
        assigned = kubelet_gpus(ids, self.gpus)
        if assigned == self.assigned_gpus:
            return devices
        self.assigned_gpus = assigned
        return True

    def _refresh_offered(self, client: Any, listed: dict[Any, list[Device]]) -> bool:
        """Read the devices the kubelet offers (GPUs aside where NVML counts them) and keep those of
        them containers hold (`listed`); True when either changed (no answer: the last one stands)."""
        from agent.api.objects import is_extended_resource
        from agent.kube.kubelet.podresources.locality import is_gpu_resource

        found = client.allocatable()
        if found is None:
            return False
        offered = tuple(sorted((d for d in found.devices if is_extended_resource(d.resource)
                                and not (self.gpus and is_gpu_resource(d.resource))),
                               key=lambda d: (d.resource, d.ids)))
        names = {d.resource for d in offered}
        held = tuple(sorted((d for devices in listed.values() for d in devices if d.resource in names),
                            key=lambda d: (d.resource, d.ids)))
        if (offered, held) == (self.offered_devices, self.held_devices):
            return False
        self.offered_devices, self.held_devices = offered, held
        return True


def static_message(cpus: CPUSet) -> str:
    """Why the agent stands down on a node whose kubelet runs the static CPU manager."""
    return (f"the kubelet runs cpuManagerPolicy: static (its pod-resources API offers CPUs {cpus.cpulist()} "
            "for exclusive use): it pins Guaranteed pods itself, so topolet stands down - labels and "
            "the NodeResourceTopology (counting the kubelet's exclusive CPUs), no cgroup written. "
            "For topolet to pin here, set cpuManagerPolicy: none in this node's kubelet configuration "
            "(drain the node and remove its cpu_manager_state file)")
