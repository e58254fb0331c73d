"""Kubernetes label syntax: validity predicates and the one deterministic text normalizer.

Rules (Kubernetes "Labels and Selectors", apimachinery validation):
- key = [prefix "/"] name; prefix is a DNS subdomain (RFC 1123, lower case, at most 253 characters);
- name is 1..63 characters of `[-A-Za-z0-9_.]`, beginning and ending with `[A-Za-z0-9]`;
- value is empty, or 1..63 characters under the same rule as a name.
Only ASCII counts as alphanumeric here: `str.isalnum` accepts other scripts, the API server does not.
"""

from __future__ import annotations

import re

MAX_NAME = 63
MAX_VALUE = 63
MAX_PREFIX = 253
MAX_DNS_LABEL = 63

_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_INVALID_RUN_RE = re.compile(r"[^-A-Za-z0-9_.]+")
_EDGE_RE = re.compile(r"^[-_.]+|[-_.]+$")


def is_label_name(name: str) -> bool:
    """Whether `name` is a valid label name (the part after the prefix)."""
    return 0 < len(name) <= MAX_NAME and _NAME_RE.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """Whether `value` is a valid label value (empty is valid)."""
    return value == "" or (len(value) <= MAX_VALUE and _NAME_RE.fullmatch(value) is not None)


def is_dns_subdomain(text: str) -> bool:
    """Whether `text` is a lower-case RFC 1123 DNS subdomain of at most 253 characters."""
    if not 0 < len(text) <= MAX_PREFIX:
        return False
    return all(
        len(part) <= MAX_DNS_LABEL and _DNS_LABEL_RE.fullmatch(part) is not None
        for part in text.split(".")
    )


def is_dns_label(text: str) -> bool:
    """Whether `text` is a lower-case RFC 1123 DNS label (a namespace name): one part, at most 63."""
    return "." not in text and is_dns_subdomain(text)


def is_label_key(key: str) -> bool:
    """Whether `key` is a valid label key: an optional DNS-subdomain prefix, "/", and a name."""
    prefix, slash, name = key.rpartition("/")
    if not slash:
        return is_label_name(name)
    return is_dns_subdomain(prefix) and is_label_name(name)


def normalize_label_text(text: str) -> str:
    """Map free text onto the label-name alphabet: runs of other characters become one "_",
    and separators at either end are removed.  The result may still be too long or empty."""
    replaced = _INVALID_RUN_RE.sub("_", text.strip())
    return _EDGE_RE.sub("", replaced)
