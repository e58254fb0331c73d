"""Label syntax predicates against Kubernetes' rules, row by row."""

from __future__ import annotations

import pytest

from agent.api.validate import (
    is_dns_subdomain,
    is_label_key,
    is_label_name,
    is_label_value,
    normalize_label_text,
)


@pytest.mark.parametrize(("key", "ok"), [
    ("feature.node.kubernetes.io/cpu-cpuid.AVX512F", True),
    ("topolet.io/cpu.threads-per-core", True),
    ("app", True),                                   # no prefix
    ("a" * 63, True),
    ("a" * 64, False),                               # name too long
    ("example.com/" + "a" * 63, True),
    ("example.com/", False),                         # empty name
    ("/name", False),                                # empty prefix
    ("Example.com/name", False),                     # prefix must be lower case
    ("exa_mple.com/name", False),                    # "_" not allowed in DNS labels
    ("-example.com/name", False),
    ("example..com/name", False),
    ("a/b/c", False),                                # "b/c" is not a name, "a/b" not a prefix
    (("a" * 63 + ".") * 3 + "a" * 61 + "/n", True),  # 253-character prefix
    (("a" * 63 + ".") * 3 + "a" * 62 + "/n", False),  # 254-character prefix
    ("example.com/-name", False),
    ("example.com/name-", False),
    ("example.com/na me", False),
    ("example.com/naïve", False),                     # only ASCII letters count
    ("example.com/name\n", False),
    ("", False),
])
def test_label_keys(key: str, ok: bool) -> None:
    assert is_label_key(key) is ok


@pytest.mark.parametrize(("value", "ok"), [
    ("", True),
    ("true", True),
    ("Intel", True),
    ("0302", True),
    ("a.b-c_d", True),
    ("a" * 63, True),
    ("a" * 64, False),
    ("-1", False),
    ("x.", False),
    ("two words", False),
    ("ünïcode", False),
    ("١٢٣", False),                                   # non-ASCII digits
    ("a\n", False),
])
def test_label_values(value: str, ok: bool) -> None:
    assert is_label_value(value) is ok


@pytest.mark.parametrize(("text", "ok"), [
    ("topolet.io", True), ("a", True), ("a-b.c", True), ("A.io", False), ("a_b.io", False),
    ("a." * 2, False), ("", False), ("a" * 64 + ".io", False),
])
def test_dns_subdomain(text: str, ok: bool) -> None:
    assert is_dns_subdomain(text) is ok


@pytest.mark.parametrize(("text", "expected"), [
    ("Genuine Intel", "Genuine_Intel"),
    ("  padded  ", "padded"),
    ("a  //  b", "a_b"),
    ("_edge.", "edge"),
    ("naïve", "na_ve"),
    ("日本", ""),
    ("ok-name", "ok-name"),
])
def test_normalize(text: str, expected: str) -> None:
    assert normalize_label_text(text) == expected


def test_names_follow_value_rule_but_cannot_be_empty() -> None:
    assert is_label_value("") and not is_label_name("")
