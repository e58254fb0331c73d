"""The shape of a Job a decision was made for, as a fingerprint the admission record keeps.

Pure: no I/O.  The Job route writes `job_shape(job)` into the record it admits the Job with
(`AdmissionRecord.shape`) and compares it on every read (`agent.admission.jobs.jobread`): a record
whose shape is not the Job's was not written for this Job as it is now (copied from another Job,
written by someone else, or the Job was scaled or re-templated since), so it is not trusted.

Public API: `job_shape(job) -> str`, `SHAPE_CHARS`.

The shape covers what the decision counted: the Job's uid (a record copied onto another Job does not
match), `parallelism`, `completions` and `completionMode` (how many pods, and whether slots are
completion indexes), and the pod template's resources (each container's and init container's
requests and limits, and pod-level resources).  Nothing the decision itself writes into the template
(the gate, the node selector, the affinity, the placements) is part of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from agent.api.objects import as_dict, as_list, metadata_of

SHAPE_CHARS = 32  # hex digits of a SHA-256: enough that no tenant finds another Job of the same shape


def job_shape(job: Mapping[str, Any]) -> str:
    """The fingerprint of the Job's uid, size and pod resources (see the module docstring)."""
    spec = as_dict(job.get("spec"))
    pod_spec = as_dict(as_dict(spec.get("template")).get("spec"))

    def resources(field: str) -> list[Any]:
        return [[as_dict(c).get("name"), as_dict(c).get("resources")] for c in as_list(pod_spec.get(field))]

    body = {"uid": metadata_of(job).get("uid"), "parallelism": spec.get("parallelism"),
            "completions": spec.get("completions"), "completionMode": spec.get("completionMode"),
            "containers": resources("containers"), "initContainers": resources("initContainers"),
            "resources": pod_spec.get("resources")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:SHAPE_CHARS]
