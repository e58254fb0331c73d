"""The label builder: normalization, drops, namespace gating, and validity for any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.validate import is_label_key, is_label_value
from agent.labels import RawFeature, make_labels
from agent.labels.registry import GFD_NAMESPACE, NFD_NAMESPACE, TOPOLET_NAMESPACE
from tests.conftest import examples

NFD, TOPO = NFD_NAMESPACE, TOPOLET_NAMESPACE


def test_values_are_formatted() -> None:
    out = make_labels([
        RawFeature(NFD, "memory-numa", True),
        RawFeature(NFD, "cpu-hardware_multithreading", False),
        RawFeature(TOPO, "numa.nodes", 2),
        RawFeature(NFD, "cpu-model.vendor_id", "Intel"),
    ])
    assert out.labels == {
        "feature.node.kubernetes.io/cpu-hardware_multithreading": "false",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/memory-numa": "true",
        "topolet.io/numa.nodes": "2",
    }
    assert list(out.labels) == sorted(out.labels)
    assert not out.dropped and not out.normalized


def test_text_is_normalized_and_reported() -> None:
    weird = RawFeature(TOPO, "cpu.kind-big core.count", "Some Vendor, Inc.")
    out = make_labels([weird])
    assert out.labels == {"topolet.io/cpu.kind-big_core.count": "Some_Vendor_Inc"}
    assert [n.feature for n in out.normalized] == [weird]


def test_what_cannot_be_a_label_is_dropped_and_reported() -> None:
    bad = [
        RawFeature(TOPO, "numa.nodes", -1),             # a number is never rewritten
        RawFeature(TOPO, "x" * 64, 1),                  # name too long
        RawFeature(TOPO, "long", "v" * 64),             # value too long
        RawFeature(TOPO, "emptied", "日本"),             # nothing left after normalization
        RawFeature(TOPO, "仮", 1),
        RawFeature("kubernetes.io", "arch", "amd64"),   # a namespace we do not publish
        RawFeature("example.com", "x", 1),
        RawFeature("not a domain", "x", 1),
        RawFeature(TOPO, "float", 1.5),                 # type: ignore[arg-type]
    ]
    out = make_labels(bad)
    assert out.labels == {}
    assert [d.feature for d in out.dropped] == bad


def test_first_feature_wins_a_key() -> None:
    out = make_labels([RawFeature(TOPO, "a", 1), RawFeature(TOPO, "a", 2), RawFeature(TOPO, "a ", 3)])
    assert out.labels == {"topolet.io/a": "1"}
    assert len(out.dropped) == 2


def test_gfd_namespace_needs_compat() -> None:
    feats = [RawFeature(GFD_NAMESPACE, "gpu.count", 8), RawFeature("mig.nvidia.com", "x", 1),
             RawFeature("NVIDIA.com", "gpu.product", "H200")]
    assert make_labels(feats).labels == {}
    assert [n.feature for n in make_labels(feats, gfd_compat=True).normalized] == [feats[2]]
    assert make_labels(feats, gfd_compat=True).labels == {
        "mig.nvidia.com/x": "1", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "H200",
    }


def test_topolet_subdomains_are_ours_lookalikes_are_not() -> None:
    out = make_labels([RawFeature("gpu.topolet.io", "a", 1), RawFeature("nottopolet.io", "a", 1),
                       RawFeature("topolet.io.evil.com", "a", 1)])
    assert out.labels == {"gpu.topolet.io/a": "1"}


_text = st.text(max_size=80)
_value = st.one_of(_text, st.integers(), st.booleans())
_namespace = st.one_of(_text, st.sampled_from([NFD, TOPO, GFD_NAMESPACE, "sub.nvidia.com", "Topolet.IO"]))
_feature = st.builds(RawFeature, _namespace, _text, _value)


@settings(max_examples=examples(300))
@given(st.lists(_feature, max_size=30), st.booleans())
def test_any_features_give_only_valid_labels(features: list[RawFeature], gfd: bool) -> None:
    out = make_labels(features, gfd_compat=gfd)
    for key, value in out.labels.items():
        assert is_label_key(key), key
        assert is_label_value(value), value
        if not gfd:
            ns = key.split("/")[0]
            assert ns != "nvidia.com" and not ns.endswith(".nvidia.com")
    # Every feature is accounted for: it became a label or was dropped.
    assert len(out.labels) + len(out.dropped) == len(features)
