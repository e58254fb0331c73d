"""A namespace's LimitRange container defaults, applied to a pod template as the API server applies
them to each pod it creates from it, so a gang is sized (and its pods compared) as they will be.

Pure: no I/O.  `read_limit_range` (strict: `LimitRangeError` names the field), `namespace_defaults`
(several LimitRanges, by name), `with_limit_range_defaults(pod_spec, defaults)`; `ContainerDefaults`,
`NO_DEFAULTS`.  The LimitRanger's rules (kubernetes v1.37) and how both routes use them:
agent/admission/gangs/README.md, "LimitRange defaults".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.api.objects import as_dict, as_list
from agent.api.resources import parse_quantity
from agent.errors import TopoletError

_CONTAINER = "Container"
_NAME_MAX = 300


class LimitRangeError(TopoletError):
    """A LimitRange cannot be read; the message names the field and its value."""


@dataclass(frozen=True, slots=True)
class ContainerDefaults:
    """limits / requests: (resource name, quantity as written) a container gets when it has none."""

    limits: tuple[tuple[str, str], ...] = ()
    requests: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.limits or self.requests)


NO_DEFAULTS = ContainerDefaults()


def _amounts(raw: object, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise LimitRangeError(f"{where} is not a map")
    out: dict[str, str] = {}
    for name, text in raw.items():
        value = parse_quantity(text) if isinstance(text, str) else None
        if not isinstance(name, str) or not name or value is None or value < 0:
            raise LimitRangeError(f"{where}: resource {str(name)[:_NAME_MAX]} has an invalid quantity "
                                  f"{str(text)[:64]!r}")
        out[name] = text
    return out


def read_limit_range(limit_range: Mapping[str, Any]) -> ContainerDefaults:
    """One LimitRange's container defaults (rule 1); LimitRangeError when it cannot be read."""
    items = as_dict(limit_range.get("spec")).get("limits")
    if items is not None and not isinstance(items, list):
        raise LimitRangeError("spec.limits is not a list")
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for i, item in enumerate(as_list(items)):
        if not isinstance(item, dict):
            raise LimitRangeError(f"spec.limits[{i}] is not a map")
        if item.get("type") != _CONTAINER:
            continue
        where = f"spec.limits[{i}]"
        default = _amounts(item.get("default"), f"{where}.default")
        request = _amounts(item.get("defaultRequest"), f"{where}.defaultRequest")
        for name, text in _amounts(item.get("max"), f"{where}.max").items():
            default.setdefault(name, text)
        for source in (default, _amounts(item.get("min"), f"{where}.min")):
            for name, text in source.items():
                request.setdefault(name, text)
        limits.update(default)
        requests.update(request)
    return ContainerDefaults(tuple(sorted(limits.items())), tuple(sorted(requests.items())))


def namespace_defaults(defaults: Iterable[ContainerDefaults]) -> ContainerDefaults:
    """The defaults of a namespace's LimitRanges applied in the order given (rule 3: the first to
    name a resource wins)."""
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for d in defaults:
        for name, text in d.limits:
            limits.setdefault(name, text)
        for name, text in d.requests:
            requests.setdefault(name, text)
    return ContainerDefaults(tuple(sorted(limits.items())), tuple(sorted(requests.items())))


def _defaulted(container: object, defaults: ContainerDefaults) -> object:
    """One container with the defaults filled in (rules 2 and 3); the container itself when none is
    missing (or it is no container: the readers downstream say so)."""
    if not isinstance(container, dict):
        return container
    res = as_dict(container.get("resources"))
    limits, requests = as_dict(res.get("limits")), as_dict(res.get("requests"))
    missing_limits = [(k, v) for k, v in defaults.limits if k not in limits]
    missing_requests = [(k, v) for k, v in defaults.requests if k not in requests and k not in limits]
    if not missing_limits and not missing_requests:
        return container
    new_limits = {**limits, **dict(missing_limits)}
    new_requests = {**limits, **requests, **dict(missing_requests)}  # rule 2, then rule 3
    resources = {**res, "limits": new_limits, "requests": new_requests}
    if not new_limits:
        del resources["limits"]
    return {**container, "resources": resources}


def with_limit_range_defaults(pod_spec: Mapping[str, Any], defaults: ContainerDefaults) -> Mapping[str, Any]:
    """`pod_spec` as the API server creates a pod of it in a namespace with `defaults` (see the module
    docstring); `pod_spec` itself when nothing is filled in."""
    if not defaults:
        return pod_spec
    out = dict(pod_spec)
    changed = False
    for field in ("containers", "initContainers"):
        containers = pod_spec.get(field)
        if not isinstance(containers, list):
            continue
        filled = [_defaulted(c, defaults) for c in containers]
        if any(a is not b for a, b in zip(filled, containers, strict=True)):
            out[field], changed = filled, True
    return out if changed else pod_spec
