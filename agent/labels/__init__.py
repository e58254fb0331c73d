"""Node labels from the topology model, NFD's way: sources yield raw features, one builder makes labels.

Public API:
- `build_labels(topology, *, gfd_compat=False) -> dict[str, str]` runs every registered feature
  source, then the builder; `build_label_set` also says what was dropped or normalized.
- `render_labels(labels) -> str`: sorted `key=value` lines (`topolet discover --format labels`).
- `agent.labels.features_file.write_features_file(folder, labels, name="topolet") -> bool`.
- `agent.labels.nodefeature`: NodeFeature object and Node patch bodies.

Adding a feature source is one decorated function (see `agent.labels.registry`):

    from agent.labels.registry import RawFeature, feature_source

    @feature_source("gpu")
    def gpu_features(topology: Topology) -> Iterator[RawFeature]:
        yield RawFeature("nvidia.com", "gpu.count", 8)   # published only with gfd_compat=True

A module outside `agent.labels` holding sources is imported by the program's composition root
(`agent.cli.commands` imports `agent.gpu.labels`); the registry imports no source.  Whatever
a source yields, the builder emits only valid label keys and values, only under
`feature.node.kubernetes.io`, `topolet.io` and (with `gfd_compat`) `nvidia.com`.
"""

from __future__ import annotations

from agent.labels.builder import LabelSet, build_label_set, build_labels, make_labels
from agent.labels.features_file import render_labels
from agent.labels.registry import RawFeature, feature_source, register_source

__all__ = [
    "LabelSet",
    "RawFeature",
    "build_label_set",
    "build_labels",
    "feature_source",
    "make_labels",
    "register_source",
    "render_labels",
]
