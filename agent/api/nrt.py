"""The NodeResourceTopology contract: what the agent publishes and the admission controller reads.

Public API: `GROUP`, `VERSION`, `API_VERSION`, `KIND`, `PLURAL` (`topology.node.k8s.io/v1alpha2`
`noderesourcetopologies`); `ZONE_TYPE` ("Node"), `zone_name(numa_id)` ("node-<N>"), `MAX_ZONE_ID`;
the top-level attributes `ATTR_POLICY`, `ATTR_SCOPE`, `ATTR_FINGERPRINT`, `ATTR_FINGERPRINT_METHOD`,
`ATTR_PINNING_ROUTE` and `FINGERPRINT_METHODS`; the deprecated `topologyPolicies` enum:
`legacy_policy(policy, scope)`, `policy_of_legacy(value)`, `scope_of_legacy(value)`.
The builder and writer are `agent.kube.publish.nrt`'s.
"""

from __future__ import annotations

from agent.api.placements import MAX_NUMA_ZONE
from agent.api.policies import NumaPolicy, Scope

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
ZONE_TYPE = "Node"
MAX_ZONE_ID = MAX_NUMA_ZONE  # one bound for writer and readers: Linux numbers at most 1024 NUMA nodes

ATTR_POLICY = "topologyManagerPolicy"
ATTR_SCOPE = "topologyManagerScope"
ATTR_FINGERPRINT = "nodeTopologyPodsFingerprint"
ATTR_FINGERPRINT_METHOD = "nodeTopologyPodsFingerprintMethod"
ATTR_PINNING_ROUTE = "topolet.io/pinning-route"
FINGERPRINT_METHODS = ("all", "with-exclusive-resources", "exclude-terminal")

# The deprecated v1alpha2 `topologyPolicies` enum kubelet's topologyManagerPolicy and scope map to
# (noderesourcetopology-api v1alpha2 TopologyManagerPolicy).
_N, _B, _R, _S = (p.value for p in (NumaPolicy.NONE, NumaPolicy.BEST_EFFORT, NumaPolicy.RESTRICTED,
                                    NumaPolicy.SINGLE_NUMA_NODE))
_CONTAINER, _POD = Scope.CONTAINER.value, Scope.POD.value
_LEGACY_POLICY = {
    (_N, _CONTAINER): "None",
    (_N, _POD): "None",
    (_B, _CONTAINER): "BestEffortContainerLevel",
    (_B, _POD): "BestEffortPodLevel",
    (_R, _CONTAINER): "RestrictedContainerLevel",
    (_R, _POD): "RestrictedPodLevel",
    (_S, _CONTAINER): "SingleNUMANodeContainerLevel",
    (_S, _POD): "SingleNUMANodePodLevel",
}

# The deprecated enum read back as the kubelet's policy (NRTs of older publishers carry only it).
_POLICY_OF_LEGACY = {legacy: policy for (policy, _), legacy in _LEGACY_POLICY.items()}


def legacy_policy(policy: str, scope: str) -> str | None:
    """The deprecated `topologyPolicies` entry of a Topology Manager policy and scope, None if unknown."""
    return _LEGACY_POLICY.get((policy, scope))


def policy_of_legacy(value: object) -> str | None:
    """The Topology Manager policy a deprecated `topologyPolicies` entry names ("SingleNUMANodePodLevel"
    → "single-numa-node"), None for anything else."""
    return _POLICY_OF_LEGACY.get(value) if isinstance(value, str) else None


def scope_of_legacy(value: object) -> str | None:
    """The Topology Manager scope a deprecated `topologyPolicies` entry names ("SingleNUMANodePodLevel"
    → "pod", "RestrictedContainerLevel" → "container"), None for "None" and anything else."""
    if isinstance(value, str) and value != "None" and value in _POLICY_OF_LEGACY:
        return _POD if value.endswith("PodLevel") else _CONTAINER
    return None


def zone_name(numa_id: int) -> str:
    """The zone name consumers parse back to a NUMA id."""
    return f"node-{numa_id}"
