"""The `topolet.io/` names a pod carries, and the Kubernetes ones read beside them.

Public API: `ANNOTATION_PREFIX`; the pod annotations `CPU_POLICY`, `NUMA_POLICY`, `SMT`,
`MEMORY_BINDING` (what a tenant asks), `NUMA_ZONE`, `PLACEMENTS` (what the admission controller
writes, `agent.api.placements` reads them); `COMPLETION_INDEX` (an Indexed Job's pod's index).
"""

from __future__ import annotations

ANNOTATION_PREFIX = "topolet.io/"
CPU_POLICY = "topolet.io/cpu-policy"
NUMA_POLICY = "topolet.io/numa-policy"
SMT = "topolet.io/smt"
MEMORY_BINDING = "topolet.io/memory-binding"
NUMA_ZONE = "topolet.io/numa-zone"
PLACEMENTS = "topolet.io/placements"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
