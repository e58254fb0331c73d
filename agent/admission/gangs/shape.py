"""The shape of a Job a decision was made for, as a fingerprint the admission record keeps.

Pure: no I/O.  `job_shape(job) -> str` (`SHAPE_CHARS` long) covers the Job's uid, pod counts,
completion mode and the template's resources, never what the decision writes into the template.
A record whose shape is not the Job's is not trusted (agent/admission/gangs/README.md, "Job shape").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from agent.api.objects import as_dict, as_list, metadata_of

SHAPE_CHARS = 32  # hex digits of a SHA-256: enough that no tenant finds another Job of the same shape


def job_shape(job: Mapping[str, Any]) -> str:
    """The fingerprint of the Job's uid, size and pod resources (see README.md beside this module)."""
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
