"""Tolerant readers of API objects as plain dicts: the one set the agent and the admission controller use.

An object from the API server or a watch may lack any field, or carry one of another JSON type than
its schema says; these readers give an empty value then, so callers read it without checks.

Public API:

- `as_dict(value) -> dict`, `as_list(value) -> list`: `value` when it is a JSON object (array), else an
  empty one; `as_mapping(value) -> Mapping`: the same for any mapping (read-only callers).
- `metadata_of(obj) -> dict`: the object's metadata (empty when missing or malformed).
- `object_key(obj)`: `namespace/name`, or `name` for a cluster-scoped object (a store's key);
  `namespaced_name(obj)`: always `namespace/name` (a Job's or Workload's name in gang keys and logs).
- `resource_version(obj) -> int`: the resourceVersion as a number, -1 when it is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_dict(value: object) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (API objects are read defensively)."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    """`value` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def as_mapping(value: object) -> Mapping[str, Any]:
    """`value` when it is a mapping of any kind, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def metadata_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object's metadata (empty when missing or malformed)."""
    return as_dict(obj.get("metadata"))


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or the name alone for a cluster-scoped object."""
    m = metadata_of(obj)
    ns = m.get("namespace")
    return f"{ns}/{m.get('name')}" if ns else str(m.get("name"))


def namespaced_name(obj: Mapping[str, Any]) -> str:
    """The object's `namespace/name` (either part empty when missing)."""
    meta = metadata_of(obj)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def resource_version(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (-1 when it has none or it is not a number)."""
    text = metadata_of(obj).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() else -1
