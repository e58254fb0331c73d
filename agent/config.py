"""The node agent's typed configuration: frozen values the command line is turned into once.

Public API: `AgentConfig` (`topolet agent` in Kubernetes mode) with its `PublisherConfig`, and
`StandaloneConfig` (`topolet agent` without a cluster).  `agent.cli.compose` builds them from the
parsed command line, where every default lives; the agents read fields, never the command line.
Values stay as the options spell them (a cpulist is text): turning them into the model is the
agents' job, in the order their start-up reads things.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PublisherConfig:
    """What the Kubernetes agent's publisher writes where, and how often it reads the Node."""

    label_sink: str  # --label-sink: auto, nodefeature, node, file or none
    features_dir: str  # --features-dir: the file sink's NFD features.d folder
    gfd_compat: bool  # --gfd-compat: GFD's nvidia.com/* labels too
    numa_scope: str  # --numa-scope, published as the NRT's topologyManagerScope
    node_poll_seconds: float  # --reconcile-seconds: the Node re-read this often while MIG is managed


@dataclass(frozen=True)
class AgentConfig:
    """`topolet agent` in Kubernetes mode."""

    node_name: str  # --node-name ("": $NODE_NAME, read at start)
    kubeconfig: str | None  # --kubeconfig (None: $KUBECONFIG, in-cluster, ~/.kube/config)
    fsroot: str  # --fsroot: where the hardware is discovered from
    state_dir: str  # --state-dir
    cgroup_root: str | None  # --cgroup-root (None: auto-detected)
    reserved_cpus: str | None  # --reserved-cpus, a cpulist (None or "": none)
    enforce: bool  # --enforcement on
    route: str  # --route: auto, nri or pod-cgroup
    nri_socket: str  # --nri-socket ("": NRI's default socket)
    runtime_bundles: str  # --runtime-bundles ("": off)
    pod_resources_socket: str  # --pod-resources-socket ("": off)
    numa_scope: str  # --numa-scope: container or pod, what the pinner aligns by
    mig_config: str  # --mig-config: the MIG layout while the Node's label names none ("": none)
    allow_mig_mode_change: bool  # --allow-mig-mode-change
    reconcile_seconds: float  # --reconcile-seconds
    listen: str  # --listen: host:port of /metrics and /healthz
    once: bool  # --once
    publisher: PublisherConfig


@dataclass(frozen=True)
class StandaloneConfig:
    """`topolet agent` without a cluster."""

    fsroot: str  # --fsroot
    state_dir: str  # --state-dir
    features_dir: str  # --features-dir: where the label file is written
    cgroup_root: str | None  # --cgroup-root (None: auto-detected)
    reserved_cpus: str | None  # --reserved-cpus, a cpulist (None: the standalone default, CPU 0)
    mig_config: str  # --mig-config ("": MIG left alone)
    allow_mig_mode_change: bool  # --allow-mig-mode-change
    reconcile_seconds: float  # --reconcile-seconds
    listen: str  # --listen
    once: bool  # --once
