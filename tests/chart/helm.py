"""Helm (built by tests/controlplane/build.sh from the Go module proxy) and the chart's renders.

`build_helm()` finds or builds the binary (a failure under CI=true, else a skip); `Helm` runs it with
its own config, cache and data folders (nothing of the user's ~/.config/helm is read or written);
`render(helm, values)` is `helm template` of charts/topolet as a list of objects; `without_deliberate`
takes from a chart object what the chart adds on purpose to the kustomize base's (charts/topolet/
README.md, "Differences from the kustomize base"), checking each addition's value on the way.
"""

from __future__ import annotations

import copy
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require
from tests.controlplane.harness import BUILD_TIMEOUT_S, ControlPlaneError, build_components

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "topolet"
RELEASE = "topolet"
NAMESPACE = "topolet-system"
COMMAND_TIMEOUT_S = 180
# What an API server that serves MutatingAdmissionPolicy v1 lists in discovery (Helm's
# .Capabilities.APIVersions): `helm template` alone knows group versions only, never kinds.
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"

# build.sh's component -> its binary, or why it could not be built (each tried once per session).
_built: dict[str, Path | str] = {}


def _build_once(component: str) -> Path:
    """`component`'s binary from build.sh (built once, then cached); a failure under CI=true, else a skip."""
    if component not in _built:
        try:
            _built[component] = build_components(component, timeout_s=BUILD_TIMEOUT_S)[component]
        except ControlPlaneError as exc:
            _built[component] = str(exc)
    found = _built[component]
    require(isinstance(found, Path), f"no {component}: {found}")
    assert isinstance(found, Path)
    return found


def build_helm() -> Path:
    """Helm 4, the version every chart test runs."""
    return _build_once("helm")


def build_helm3() -> Path:
    """The last Helm 3, for the coexistence tests under both Helm majors."""
    return _build_once("helm3")


@dataclass(frozen=True)
class Helm:
    """helm with folders of its own under `home`, and optionally a kubeconfig."""

    binary: Path
    home: Path
    kubeconfig: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`helm ARGS`; with check, a non-zero exit fails the test with helm's output."""
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home),
               "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data"), **self.env}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        done = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env,
                              timeout=COMMAND_TIMEOUT_S, check=False)
        if check and done.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done


# The image every test install names (the chart refuses to install without one): the kustomize
# base's placeholder, so that defaults still render the base's objects.
IMAGE = {"image.repository": "topolet"}


# The values under which the chart's defaults are the kustomize base's objects: the base has the
# NetworkPolicies on, for a Prometheus in namespace monitoring; the chart leaves them off by default.
AS_BASE: dict[str, Any] = {"networkPolicy.enabled": True, "networkPolicy.from": [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]}


def set_args(values: dict[str, Any]) -> list[str]:
    """`--set-json key=<json>` for each dotted key: exact types, whatever the value."""
    import json

    return [a for key, value in values.items() for a in ("--set-json", f"{key}={json.dumps(value)}")]


def render(helm: Helm, values: dict[str, Any] | None = None, *extra: str,
           api_versions: tuple[str, ...] = (MAP_API,)) -> list[dict[str, Any]]:
    """`helm template` of the chart (release topolet in topolet-system) with IMAGE and `values`: its
    objects."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *set_args({**IMAGE, **(values or {})}),
            *extra]
    for api in api_versions:
        args += ["--api-versions", api]
    return [d for d in yaml.safe_load_all(helm.run(*args).stdout) if d]


def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    """Objects by (kind, name, namespace); a duplicate key fails the test."""
    keyed: dict[tuple[str, str, str | None], dict[str, Any]] = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
        assert key not in keyed, f"{key} rendered twice"
        keyed[key] = d
    return keyed


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of `kind` named `name`."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


# The labels the chart puts on every object (Kubernetes' recommended labels and Helm's chart label).
STANDARD_LABELS = {
    "app.kubernetes.io/name": "topolet",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/version": "0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/part-of": "topolet",
    "helm.sh/chart": "topolet-0.1.0",
}


def _drop_added(mapping: dict[str, Any], base: dict[str, Any], added: dict[str, Any], where: str) -> None:
    """Remove from `mapping` the keys of `added` that `base` lacks, asserting their values."""
    for key, value in added.items():
        if key not in base:
            assert mapping.get(key) == value, f"{where}: {key}={mapping.get(key)!r}, want {value!r}"
            del mapping[key]


def without_deliberate(chart_obj: dict[str, Any], base_obj: dict[str, Any]) -> dict[str, Any]:
    """`chart_obj` less the chart's deliberate additions to `base_obj` (each checked), for comparing."""
    obj = copy.deepcopy(chart_obj)
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    meta = obj["metadata"]
    base_meta = base_obj["metadata"]
    _drop_added(meta.setdefault("labels", {}), base_meta.get("labels", {}), STANDARD_LABELS, where)
    if obj["kind"] == "DaemonSet":
        _drop_added(meta["labels"], base_meta["labels"], {"topolet.io/node-pool": "default"}, where)
    if not meta["labels"]:
        del meta["labels"]
    if obj["kind"] == "CustomResourceDefinition":
        _drop_added(meta["annotations"], base_meta.get("annotations", {}),
                    {"helm.sh/resource-policy": "keep"}, where)
        if not meta["annotations"]:
            del meta["annotations"]
    if obj["kind"] in ("DaemonSet", "Deployment"):
        template = obj["spec"]["template"]
        base_template = base_obj["spec"]["template"]
        added = {"app.kubernetes.io/instance": RELEASE}
        if obj["kind"] == "DaemonSet":
            added["topolet.io/node-pool"] = "default"
        _drop_added(template["metadata"]["labels"], base_template["metadata"]["labels"], added, where)
    return obj


def base_key(obj: dict[str, Any]) -> tuple[str, str, str | None]:
    """A kustomize object's key: (kind, name, namespace), no namespace on a cluster-scoped one (the
    base uses no `namespace:` transform: test_render.py, test_kustomize_gives_only_namespaced_...)."""
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")


def compare_with_base(chart_docs: list[dict[str, Any]], base_docs: list[dict[str, Any]]) -> list[str]:
    """Every difference between the chart's objects and the base's, less the deliberate ones."""
    base = {}
    for d in base_docs:
        if d["kind"] == "Namespace":
            continue  # The chart installs into the release's namespace; Helm does not own it.
        d = copy.deepcopy(d)
        key = base_key(d)
        if key[2] is None:
            d["metadata"].pop("namespace", None)
        base[key] = d
    # The uninstall's cleanup hook (templates/cleanup-hook.yaml) has no counterpart in the base, whose
    # uninstall is `topolet cleanup` run by hand (daemonset/README.md, "Uninstall").
    # Nor has the release's record of the CRDs it installed (templates/crds.yaml says why).
    chart = by_key([d for d in chart_docs if "helm.sh/hook" not in d["metadata"].get("annotations", {})
                    and (d["kind"], d["metadata"]["name"]) != ("ConfigMap", f"{RELEASE}-crds")])
    problems = [f"only in the base: {k}" for k in sorted(set(base) - set(chart), key=str)]
    problems += [f"only in the chart: {k}" for k in sorted(set(chart) - set(base), key=str)]
    for key in sorted(set(base) & set(chart), key=str):
        ours = _folded(without_deliberate(chart[key], base[key]))
        theirs = _folded(base[key])
        if ours != theirs:
            problems.append(f"{key} differs:\n{_diff(theirs, ours)}")
    return problems


# Pod spec lists merged by name (their strategic-merge key), whose order means nothing: a kustomize
# patch of one volume moves it to the front.
_NAMED_LISTS = frozenset({"volumes", "volumeMounts", "env", "ports", "containers", "initContainers"})


def _named_list(key: str, value: Any) -> bool:
    return key in _NAMED_LISTS and isinstance(value, list) and all(
        isinstance(item, dict) and "name" in item for item in value)


def _folded(value: Any) -> Any:
    """`value` as compared: every run of blank lines in its strings made one line break, and the lists
    merged by name sorted by it. kustomize (kyaml) re-emits a folded scalar (`>-`) whose lines are more
    indented with an empty line before each such line, which reads back as an extra line break (the CEL
    and PromQL in them are the same); helm keeps the file's text."""
    if isinstance(value, dict):
        return {k: sorted(_folded(v), key=lambda item: item["name"]) if _named_list(k, v) else _folded(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_folded(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"\n\n+", "\n", value)
    return value


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    import difflib

    left = yaml.safe_dump(a, sort_keys=True).splitlines()
    right = yaml.safe_dump(b, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(left, right, "base", "chart", lineterm="", n=2))
