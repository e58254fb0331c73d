"""Node labels from the topology model, NFD's way: sources yield raw features, one builder makes labels.

- `build_labels(topology, *, gfd_compat=False) -> dict[str, str]` runs every registered feature
  source, then the builder; `build_label_set` also says what was dropped or normalized.
- `render_labels(labels) -> str`: sorted `key=value` lines (`topolet discover --format labels`).
- Sinks: `features_file.write_features_file`, `nodefeature` (NodeFeature object, Node patch).
A source outside this package is imported by the composition root, never by the registry.
Adding a source, and every label topolet owns: agent/labels/README.md.
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
