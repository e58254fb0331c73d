"""The node agent's composition root: its typed configuration, and the Kubernetes agent put together.

Public API: `agent_config(args) -> AgentConfig` and `standalone_config(args) -> StandaloneConfig`
(the parsed `topolet agent` command line, read once: `agent.config` holds the types, the parser every
default), and `kube_agent(config, metrics, *, nvml=None, gpus=None) -> KubeAgent`, which does the
agent's start-up reads (node name, kubeconfig, topology, GPUs, state folder, the kubelet's CPU
manager, the cpuset hierarchy, the namespace) in that order and hands their results to `KubeAgent`,
whose constructor reads nothing.  Imported only when `topolet agent` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent.config import AgentConfig, PublisherConfig, StandaloneConfig

if TYPE_CHECKING:
    import argparse

    from agent.gpu.model import GPU
    from agent.kube.daemon import KubeAgent
    from agent.metrics.registry import Metrics


def agent_config(args: argparse.Namespace) -> AgentConfig:
    """`topolet agent`'s options for the Kubernetes mode."""
    return AgentConfig(
        node_name=args.node_name, kubeconfig=args.kubeconfig, fsroot=args.fsroot, state_dir=args.state_dir,
        cgroup_root=args.cgroup_root, reserved_cpus=args.reserved_cpus, enforce=args.enforcement != "off",
        route=args.route, nri_socket=args.nri_socket, runtime_bundles=args.runtime_bundles,
        pod_resources_socket=args.pod_resources_socket, numa_scope=args.numa_scope,
        mig_config=args.mig_config, allow_mig_mode_change=args.allow_mig_mode_change,
        reconcile_seconds=args.reconcile_seconds, listen=args.listen, once=args.once,
        publisher=PublisherConfig(label_sink=args.label_sink, features_dir=args.features_dir,
                                  gfd_compat=args.gfd_compat, numa_scope=args.numa_scope,
                                  node_poll_seconds=args.reconcile_seconds))


def standalone_config(args: argparse.Namespace) -> StandaloneConfig:
    """`topolet agent`'s options for the standalone mode."""
    return StandaloneConfig(
        fsroot=args.fsroot, state_dir=args.state_dir, features_dir=args.features_dir,
        cgroup_root=args.cgroup_root, reserved_cpus=args.reserved_cpus, mig_config=args.mig_config,
        allow_mig_mode_change=args.allow_mig_mode_change, reconcile_seconds=args.reconcile_seconds,
        listen=args.listen, once=args.once)


def kube_agent(config: AgentConfig, metrics: Metrics, *, nvml: Any = None,
               gpus: Sequence[GPU] | None = None) -> KubeAgent:
    """The Kubernetes agent for `config`, every start-up read done here.  `nvml`: pynvml or a
    stand-in, initialised (else NVML loads when a MIG layout is asked); `gpus`: the node's GPU
    inventory (else discovered here, through `nvml` when given)."""
    from agent.enforce.state_file import StateFile
    from agent.kube.daemon import KubeAgent, choose_enforcement, node_gpus
    from agent.kube.kubelet.resources import Kubelet
    from agent.kubeapi.client import KubeClient, agent_namespace, load_api_client, node_name
    from agent.topology.cpuset import CPUSet
    from agent.topology.discover import discover

    node = node_name(config.node_name)
    # Every API request goes through this one raw-JSON client (see agent.kubeapi.client).
    api = KubeClient(load_api_client(config.kubeconfig))
    topology = discover(config.fsroot)
    inventory = tuple(gpus) if gpus is not None else node_gpus(topology, config.fsroot, nvml)
    reserved = CPUSet.parse(config.reserved_cpus) if config.reserved_cpus else CPUSet()
    state_file = StateFile(config.state_dir, on_write=metrics.state_writes.inc)
    state_file.check_folder()  # a --state-dir that cannot be one stops the agent at start
    kubelet = Kubelet(config.pod_resources_socket, inventory)
    # Before any cgroup is touched: never one cpuset written where the kubelet pins.
    kubelet.check_cpu_manager()
    enforcement = choose_enforcement(config, topology, state_file, kubelet, reserved)
    return KubeAgent(config, topology, metrics, api=api, node=node, namespace=agent_namespace(),
                     gpus=inventory, kubelet=kubelet, enforcement=enforcement, nvml=nvml)
