"""agent.enforce.bundles: which pod container a containerd container is, from its OCI bundle.

The bundles are written as containerd's CRI plugin writes them (the annotation keys and values were
read off containerd 1.6's and 2.4's bundles on tests/realnode's node); everything else is hostile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agent.enforce.bundles import (
    CONTAINER_NAME,
    CONTAINER_TYPE,
    SANDBOX_UID,
    BundleContainer,
    bundle_container,
    container_id_of_cgroup,
)

CID = "3c2486029a7137ad326148cbe6549fdfc2bc7ff99197c3dcf92f7f41030ab301"
UID = "ed7fcdf6-40aa-4021-af48-c33cd918d543"


def spec(**annotations: Any) -> dict[str, Any]:
    base = {CONTAINER_TYPE: "container", SANDBOX_UID: UID, CONTAINER_NAME: "main",
            "io.kubernetes.cri.sandbox-name": "p", "io.kubernetes.cri.sandbox-namespace": "default"}
    base.update(annotations)
    return {"ociVersion": "1.1.0", "annotations": {k: v for k, v in base.items() if v is not None},
            "linux": {"cgroupsPath": f"/kubepods/pod{UID}/{CID}"}}


def write(folder: Path, body: object, cid: str = CID) -> None:
    (folder / cid).mkdir(exist_ok=True)
    text = body if isinstance(body, (str, bytes)) else json.dumps(body)
    (folder / cid / "config.json").write_bytes(text.encode() if isinstance(text, str) else text)


def test_a_pod_container_is_named_by_its_bundle(tmp_path: Path) -> None:
    write(tmp_path, spec())
    assert bundle_container(str(tmp_path), CID) == BundleContainer(UID, "main")


@pytest.mark.parametrize("body", [
    spec(**{CONTAINER_TYPE: "sandbox"}),  # the pod's pause container
    spec(**{CONTAINER_TYPE: None}),
    spec(**{SANDBOX_UID: "²d7fcdf6-40aa-4021-af48-c33cd918d543"}),
    spec(**{SANDBOX_UID: UID.upper()}),
    spec(**{SANDBOX_UID: 7}),
    spec(**{CONTAINER_NAME: "Main"}),
    spec(**{CONTAINER_NAME: "a" * 64}),
    spec(**{CONTAINER_NAME: "main/../x"}),
    spec(**{CONTAINER_NAME: ["main"]}),
    {"annotations": ["not", "an", "object"]},
    ["not", "an", "object"],
    "not json {",
    "[" * 100_000,  # deeper than the parser's recursion
    b"\xff\xfe",
], ids=lambda b: repr(b)[:40])
def test_anything_else_is_no_pod_container(tmp_path: Path, body: object) -> None:
    write(tmp_path, body)
    assert bundle_container(str(tmp_path), CID) is None


def test_missing_oversized_linked_or_misnamed_bundles_are_none(tmp_path: Path) -> None:
    assert bundle_container(str(tmp_path), CID) is None  # no bundle (yet)
    assert bundle_container("", CID) is None  # the lookup is off
    write(tmp_path, spec())
    assert bundle_container(str(tmp_path), "../" + CID) is None
    assert bundle_container(str(tmp_path), CID[:12]) is None
    big = json.dumps(spec()) + " " * (4 << 20)
    write(tmp_path, big)
    assert bundle_container(str(tmp_path), CID) is None
    other = "b" * 64
    (tmp_path / other).mkdir()
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(spec()))
    os.symlink(target, tmp_path / other / "config.json")
    assert bundle_container(str(tmp_path), other) is None  # a link is not followed


@pytest.mark.parametrize(("name", "cid"), [
    (CID, CID),
    (f"cri-containerd-{CID}.scope", CID),
    (f"crio-{CID}", ""),
    ("cri-containerd-xyz.scope", ""),
    (f"pod{UID}", ""),
    ("", ""),
])
def test_container_id_of_cgroup(name: str, cid: str) -> None:
    assert container_id_of_cgroup(name) == cid
