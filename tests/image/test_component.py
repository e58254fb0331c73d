"""daemonset/components/local-image: the base on the image `make image` builds (`kubectl kustomize`).

It points the agent and the controller at localhost/topolet:<version> (the tag image/build.sh gives the
archive that `ctr images import` loads) and never pulls it; the base keeps its placeholder and every
other field as it was.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.controlplane.kubectl import BASE, build_kubectl, kustomize_build

COMPONENT = BASE / "components" / "local-image"
WORKLOADS = [("DaemonSet", "topolet-agent"), ("Deployment", "topolet-controller")]
PLACEHOLDER = "topolet:0.1.0"
Rendered = dict[tuple[str, str], dict[str, Any]]  # (kind, name) -> object


def _render(path: Path) -> Rendered:
    docs = [d for d in yaml.safe_load_all(kustomize_build(build_kubectl(), path)) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def base() -> Rendered:
    return _render(BASE)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The base with the component, as an overlay outside daemonset/ includes it."""
    overlay = tmp_path_factory.mktemp("overlay")
    (overlay / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, overlay)}]\n"
        f"components: [{os.path.relpath(COMPONENT, overlay)}]\n")
    return _render(overlay)


def _version() -> str:
    match = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert match
    return match.group(1)


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("kind,name", WORKLOADS)
def test_base_keeps_the_placeholder(base: Rendered, kind: str, name: str) -> None:
    assert _container(base[(kind, name)])["image"] == PLACEHOLDER
    assert _container(base[(kind, name)])["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize("kind,name", WORKLOADS)
def test_component_runs_the_local_image(local: Rendered, kind: str, name: str) -> None:
    """The image the build tags, never pulled."""
    container = _container(local[(kind, name)])
    assert container["image"] == f"localhost/topolet:{_version()}"
    assert container["imagePullPolicy"] == "Never"


def test_component_changes_nothing_else(base: Rendered, local: Rendered) -> None:
    assert local.keys() == base.keys()
    for key, doc in base.items():
        if key in WORKLOADS:
            doc = yaml.safe_load(yaml.safe_dump(doc))
            container = _container(doc)
            container["image"] = f"localhost/topolet:{_version()}"
            container["imagePullPolicy"] = "Never"
        assert local[key] == doc, f"{key} differs beyond the image"

