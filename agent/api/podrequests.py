"""What one pod asks of its node, read as the scheduler reads it: the one reading for the admission
controller's view of bound pods and its gangs' pod templates (both routes).

Pure: a pod spec (the API's JSON, as a dict) in, exact quantities out; no I/O, no clock.
`pod_requests(spec) -> dict[str, Fraction]` (k8s.io/component-helpers `resource.PodRequests`),
`container_requests(container, where)`; `RequestsError` names the field and value it cannot read.
The four rules (limits as requests, sidecars and init containers, pod-level resources, overhead):
agent/api/README.md, "What a pod requests".
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from agent.api.objects import as_dict, as_list
from agent.api.resources import parse_quantity, pod_level_resource
from agent.errors import TopoletError

_OVERCOMMITTED = ("cpu", "memory")  # the pod-level requests the containers' sum defaults (not hugepages)


class RequestsError(TopoletError, ValueError):
    """A pod's requests cannot be read; the message names the field and its value."""


def _quantities(amounts: Mapping[str, Any], where: str, only_pod_level: bool = False) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}
    for name, text in amounts.items():
        if only_pod_level and not pod_level_resource(name):
            continue
        value = parse_quantity(text)
        if value is None or value < 0:
            raise RequestsError(f"{where}: resource {str(name)[:300]} has an invalid quantity "
                                f"{str(text)[:64]!r}")
        out[str(name)] = value
    return out


def container_requests(container: object, where: str) -> dict[str, Fraction]:
    """One container's requests (rule 1); RequestsError, naming `where`, when malformed."""
    res = as_dict(as_dict(container).get("resources"))
    limits = as_dict(res.get("limits"))
    requests = as_dict(res.get("requests"))
    return _quantities({**limits, **requests} if limits else requests, where)


def _add(a: dict[str, Fraction], b: Mapping[str, Fraction]) -> dict[str, Fraction]:
    for k, v in b.items():
        a[k] = a[k] + v if k in a else v
    return a


def _max(a: dict[str, Fraction], b: Mapping[str, Fraction]) -> dict[str, Fraction]:
    for k, v in b.items():
        if k not in a or v > a[k]:
            a[k] = v
    return a


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """The pod's requests by resource name (README.md beside this module); RequestsError when malformed."""
    total: dict[str, Fraction] = {}
    for i, c in enumerate(as_list(spec.get("containers"))):
        _add(total, container_requests(c, f"containers[{i}]"))
    init = as_list(spec.get("initContainers"))
    if init:
        sidecars: dict[str, Fraction] = {}
        peak: dict[str, Fraction] = {}
        for i, c in enumerate(init):
            req = container_requests(c, f"initContainers[{i}]")
            if as_dict(c).get("restartPolicy") == "Always":  # a sidecar runs beside everything after it
                _add(sidecars, req)
                _add(total, req)
                _max(peak, sidecars)
            else:
                _max(peak, _add(dict(req), sidecars))
        _max(total, peak)
    pod_level = spec.get("resources")
    if pod_level:
        res = as_dict(pod_level)
        requests = _quantities(as_dict(res.get("requests")), "resources.requests", only_pod_level=True)
        for name, limit in _quantities(as_dict(res.get("limits")), "resources.limits",
                                       only_pod_level=True).items():
            if name not in requests and not (name in _OVERCOMMITTED and name in total):
                requests[name] = limit  # the API server's default of a pod-level request
        total.update(requests)
    overhead = spec.get("overhead")
    if overhead:
        _add(total, _quantities(as_dict(overhead), "overhead"))
    return total
