"""Tolerant readers of API objects as plain dicts: the one set the agent and the admission controller use.

Tolerant: `as_dict`, `as_list`, `as_mapping`, `metadata_of`, `object_key`, `namespaced_name`,
`resource_version` give an empty value (or -1) for a missing or mistyped field, never raise.
Strict, for values a tenant writes: `decimal`, `json_int`, `json_object` (bounded before parsing)
return None unless the value is exactly right, so the caller raises its own error type;
`is_extended_resource`.  Why `str.isdigit` is not enough, and the bounds: agent/api/README.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agent.api.validate import is_dns_subdomain

_DECIMAL = re.compile(r"0|[1-9][0-9]*")  # [0-9], not \d: only ASCII digits
# A JSON string, or an unterminated one to the end: one linear pass, whatever the input.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# A qualified name's part after the prefix: 1..63 of [-A-Za-z0-9_.], alphanumeric at both ends.
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


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


def decimal(text: object, maximum: int) -> int | None:
    """`text` as a number when it is an ASCII decimal without a leading zero, at most `maximum`."""
    if (not isinstance(text, str) or not 0 < len(text) <= len(str(maximum))
            or _DECIMAL.fullmatch(text) is None):
        return None
    value = int(text)
    return value if value <= maximum else None


def json_int(value: object, maximum: int) -> int | None:
    """`value` when it is a JSON integer (not a bool) in 0..maximum, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        return None
    return value


def json_object(text: object, max_chars: int, max_depth: int) -> dict[str, Any] | None:
    """The JSON object `text` holds; None when it is not one, is longer than `max_chars` or nests
    deeper than `max_depth` (measured before parsing, so no input reaches the parser's recursion)."""
    if not isinstance(text, str) or len(text) > max_chars:
        return None
    depth = deepest = 0
    for char in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if char in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > max_depth:
            return None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def is_extended_resource(name: object) -> bool:
    """Whether `name` is an extended resource name (apimachinery's rule): `<domain>/<name>`, a DNS
    subdomain then a qualified name, the domain not `kubernetes.io` nor under it, and not a quota's
    `requests.` name."""
    if not isinstance(name, str) or name.startswith("requests."):
        return False
    prefix, slash, rest = name.partition("/")
    if not slash or _QUALIFIED_NAME.fullmatch(rest) is None or not is_dns_subdomain(prefix):
        return False
    return prefix != "kubernetes.io" and not prefix.endswith(".kubernetes.io")
