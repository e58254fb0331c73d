"""API requests as the API server counts them (`apiserver_request_total` on its own /metrics), by verb
and resource: what a bench run cost the API server, whoever asked.

- `request_counts(plane) -> Counter[(verb, resource)]`: the counts so far (`resource` is
  `group/resource/subresource`, core resources without a group; non-resource paths, as /metrics itself,
  are left out);
- `watches_held(plane) -> Counter[resource]`: the watches open now (`apiserver_longrunning_requests`,
  verb WATCH), by resource as above;
- `delta(before, after)`: the requests between two counts; `requests_line(name, made, per)`: one line of
  them, each verb and resource per `per` (e.g. per gang pod), most first; `per_minute_line(name, before,
  after, seconds, per)` the same per minute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Counts = Counter[tuple[str, str]]
SHOWN = 12  # verb/resource pairs a line names; the rest are summed as "other"


def _samples(plane: Any, family_name: str, sample_name: str) -> Iterator[tuple[str, str, float]]:
    """(verb, resource, value) of each sample `sample_name` of the API server's metric family
    `family_name` that names a resource."""
    status, body = plane.raw_get("/metrics", token=plane.admin_token, timeout_s=30.0)
    if status != 200:
        raise RuntimeError(f"the API server's /metrics answered {status}: {body[:200]}")
    for family in text_string_to_metric_families(body):
        if family.name != family_name:
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name != sample_name or not labels.get("resource"):
                continue
            resource = "/".join(p for p in (labels.get("group", ""), labels["resource"],
                                            labels.get("subresource", "")) if p)
            yield labels["verb"], resource, sample.value


def request_counts(plane: Any) -> Counts:
    """`apiserver_request_total` summed over codes and scopes, by (verb, resource)."""
    out: Counts = Counter()
    for verb, resource, value in _samples(plane, "apiserver_request", "apiserver_request_total"):
        out[(verb, resource)] += int(value)
    return out


def watches_held(plane: Any) -> Counter[str]:
    """The watches open now (the `apiserver_longrunning_requests` gauge, verb WATCH), by resource."""
    out: Counter[str] = Counter()
    for verb, resource, value in _samples(plane, "apiserver_longrunning_requests",
                                          "apiserver_longrunning_requests"):
        if verb == "WATCH" and value > 0:
            out[resource] += int(value)
    return out


def delta(before: Counts, after: Counts) -> Counts:
    """The requests made between two counts."""
    return Counter({k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)})


def _line(made: Counts, per: float, digits: int) -> str:
    total = sum(made.values())
    ranked = made.most_common()
    parts = [f"{verb} {resource} {n / per:.{digits}f}" for (verb, resource), n in ranked[:SHOWN]]
    rest = sum(n for _, n in ranked[SHOWN:])
    if rest:
        parts.append(f"other {rest / per:.{digits}f}")
    return f"{total / per:.{digits}f} ({', '.join(parts) or 'none'})"


def requests_line(name: str, made: Counts, per: int, what: str = "gang pod") -> str:
    """`# name: API requests per <what>: T (verb resource n, ...)` of the requests `made` (a `delta`)."""
    return f"# {name}: API requests per {what}: {_line(made, max(per, 1), 2)}"


def per_minute_line(name: str, before: Counts, after: Counts, seconds: float, per: int,
                    what: str = "node") -> str:
    """`# name: API requests per minute per <what>: T (verb resource n, ...)`."""
    scale = max(seconds, 1e-9) / 60.0 * max(per, 1)
    return f"# {name}: API requests per minute per {what}: {_line(delta(before, after), scale, 3)}"
