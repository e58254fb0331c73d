"""`topolet agent`'s command line, read once into its typed configs (`agent.cli.compose`).

A table: each option of `topolet agent`, a value for it, and the config field it must land in (in
the Kubernetes agent's `AgentConfig` and its `PublisherConfig`, and in the standalone agent's
`StandaloneConfig`).  An option missing from the table, a field no option sets, or a value that
lands elsewhere fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from agent.cli import build_parser
from agent.cli.compose import agent_config, standalone_config
from agent.config import AgentConfig, PublisherConfig, StandaloneConfig

# The options `agent.cli` reads itself, before any config is built (which mode, how much to log).
READ_BY_THE_CLI = {"--mode", "--log-level", "--help"}

# option → (its words after `agent`, {config: (field path, expected value)}); "kube" is AgentConfig,
# "standalone" StandaloneConfig; a field path "publisher.x" is AgentConfig.publisher's x.
TABLE: dict[str, tuple[list[str], dict[str, tuple[str, Any]]]] = {
    "--fsroot": (["--fsroot", "/dump"], {"kube": ("fsroot", "/dump"), "standalone": ("fsroot", "/dump")}),
    "--state-dir": (["--state-dir", "/s"], {"kube": ("state_dir", "/s"), "standalone": ("state_dir", "/s")}),
    "--features-dir": (["--features-dir", "/f"], {"kube": ("publisher.features_dir", "/f"),
                                                  "standalone": ("features_dir", "/f")}),
    "--listen": (["--listen", "0.0.0.0:9999"], {"kube": ("listen", "0.0.0.0:9999"),
                                                "standalone": ("listen", "0.0.0.0:9999")}),
    "--reserved-cpus": (["--reserved-cpus", "0-1"], {"kube": ("reserved_cpus", "0-1"),
                                                     "standalone": ("reserved_cpus", "0-1")}),
    "--reconcile-seconds": (["--reconcile-seconds", "2.5"], {"kube": ("reconcile_seconds", 2.5),
                                                             "standalone": ("reconcile_seconds", 2.5)}),
    "--cgroup-root": (["--cgroup-root", "/cg"], {"kube": ("cgroup_root", "/cg"),
                                                 "standalone": ("cgroup_root", "/cg")}),
    "--once": (["--once"], {"kube": ("once", True), "standalone": ("once", True)}),
    "--kubeconfig": (["--kubeconfig", "/k"], {"kube": ("kubeconfig", "/k")}),
    "--node-name": (["--node-name", "worker-7"], {"kube": ("node_name", "worker-7")}),
    "--label-sink": (["--label-sink", "file"], {"kube": ("publisher.label_sink", "file")}),
    "--pod-resources-socket": (["--pod-resources-socket", "/p.sock"], {"kube": ("pod_resources_socket",
                                                                                "/p.sock")}),
    "--gfd-compat": (["--gfd-compat"], {"kube": ("publisher.gfd_compat", True)}),
    "--mig-config": (["--mig-config", "all-1g.10gb"], {"kube": ("mig_config", "all-1g.10gb"),
                                                       "standalone": ("mig_config", "all-1g.10gb")}),
    "--allow-mig-mode-change": (["--allow-mig-mode-change"], {"kube": ("allow_mig_mode_change", True),
                                                              "standalone": ("allow_mig_mode_change", True)}),
    "--route": (["--route", "nri"], {"kube": ("route", "nri")}),
    "--nri-socket": (["--nri-socket", "/n.sock"], {"kube": ("nri_socket", "/n.sock")}),
    "--runtime-bundles": (["--runtime-bundles", ""], {"kube": ("runtime_bundles", "")}),
    "--numa-scope": (["--numa-scope", "pod"], {"kube": ("numa_scope", "pod")}),
    "--enforcement": (["--enforcement", "off"], {"kube": ("enforce", False)}),
}
# Fields one option fills in two places, or that another option also sets: (config, field) → option.
ALSO = {("kube", "publisher.numa_scope"): "--numa-scope",
        ("kube", "publisher.node_poll_seconds"): "--reconcile-seconds"}

BUILD = {"kube": agent_config, "standalone": standalone_config}


def agent_parser() -> argparse.ArgumentParser:
    for action in build_parser()._actions:  # argparse keeps its tree here; there is no public walk
        if isinstance(action, argparse._SubParsersAction):
            parser = action.choices["agent"]
            assert isinstance(parser, argparse.ArgumentParser)
            return parser
    raise AssertionError("no agent subcommand")


def field(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def fields(cls: type, prefix: str = "") -> set[str]:
    """Every leaf field of a config dataclass, nested ones as "outer.inner"."""
    found = set()
    for f in dataclasses.fields(cls):
        inner = {AgentConfig: {"publisher": PublisherConfig}}.get(cls, {}).get(f.name)
        found |= fields(inner, f"{prefix}{f.name}.") if inner else {prefix + f.name}
    return found


def test_every_agent_option_is_in_the_table() -> None:
    options = {a.option_strings[-1] for a in agent_parser()._actions if a.option_strings}
    assert options - READ_BY_THE_CLI == set(TABLE)


@pytest.mark.parametrize(("kind", "cls"), [("kube", AgentConfig), ("standalone", StandaloneConfig)])
def test_every_config_field_is_some_options(kind: str, cls: type) -> None:
    set_by = {rows[kind][0] for _, rows in TABLE.values() if kind in rows}
    set_by |= {path for (k, path) in ALSO if k == kind}
    assert fields(cls) == set_by


@pytest.mark.parametrize("option", sorted(TABLE))
def test_each_option_lands_in_its_field(option: str) -> None:
    words, rows = TABLE[option]
    given = build_parser().parse_args(["agent", *words])
    default = build_parser().parse_args(["agent"])
    for kind, (path, expected) in rows.items():
        config = BUILD[kind](given)
        assert field(config, path) == expected, (kind, path)
        # The value came from the option, not from a default that happens to agree.
        assert field(BUILD[kind](default), path) != expected, (kind, path)
        # Nothing else moved, but the fields the same option also fills.
        also = {p for (k, p), o in ALSO.items() if k == kind and o == option}
        moved = {p for p in fields(type(config)) if field(config, p) != field(BUILD[kind](default), p)}
        assert moved == {path} | also, (kind, moved)


def test_the_defaults_are_the_parsers() -> None:
    """Every value of a bare `topolet agent` is the parser's default, as the option spells it."""
    default = build_parser().parse_args(["agent"])
    kube, standalone = agent_config(default), standalone_config(default)
    assert (kube.fsroot, kube.state_dir, kube.listen, kube.reconcile_seconds, kube.route, kube.numa_scope,
            kube.enforce, kube.reserved_cpus, kube.cgroup_root) == (
        "/", "/var/lib/topolet", "127.0.0.1:9470", 5.0, "auto", "container", True, None, None)
    assert kube.publisher == PublisherConfig(label_sink="auto",
                                             features_dir="/etc/kubernetes/node-feature-discovery/features.d",
                                             gfd_compat=False, numa_scope="container", node_poll_seconds=5.0)
    assert standalone.reserved_cpus is None  # the standalone agent's own default (CPU 0) then applies
    assert standalone.features_dir == kube.publisher.features_dir


def test_configs_are_frozen() -> None:
    config = agent_config(build_parser().parse_args(["agent"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.fsroot = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.publisher.label_sink = "none"  # type: ignore[misc]
