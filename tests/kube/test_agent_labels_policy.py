"""The agent's policy lets it set exactly the Node labels it publishes (issue 34, finding 4), checked
without an API server: the patterns of `daemonset/admission-policy.yaml`'s `ownLabels` variable, read
from the file and matched with Python's `re` (the same anchored RE2-compatible expressions CEL's
`matches` evaluates), against every label the one label builder makes on the real-machine dumps, the
HGX GPU tree and hand-built machines, the GPU labels with every optional input, and the MIG state.
Keys the agent never publishes (the user's `topolet.io/mig.config`, the Kueue route's fail-safe
selector, old or new) match none. `tests/kube/test_security.py` sends such writes with an agent's
pod-bound token."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from agent.admission.kueue.workloads import FAILSAFE_LABEL, LEGACY_FAILSAFE_KEY
from agent.api.validate import is_label_key
from agent.gpu.applier import STATE_LABEL
from agent.gpu.discover import gpus_from_topology
from agent.gpu.labels import gpu_labels
from agent.gpu.reconcile import CONFIG_LABEL
from agent.labels import build_label_set
from tests.conftest import REPO
from tests.gpu.sysfs_fixture import build_hgx
from tests.labels.machines import cpu_info, machine, pci
from tests.labels.test_dumps import DUMPS, _discover

POLICY = REPO / "daemonset" / "admission-policy.yaml"


def variable(name: str) -> str:
    """The CEL expression of the policy's variable `name`."""
    docs = yaml.safe_load_all(POLICY.read_text())
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (expression,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(expression)


@functools.cache
def own_labels(gfd_compat: bool) -> tuple[re.Pattern[str], ...]:
    """`ownLabels` as the policy evaluates it: its two patterns, and GPU Feature Discovery's third where
    `gfdCompat` is true (the expression's shape is checked, so a rewrite fails here, not silently)."""
    expression = variable("ownLabels")
    patterns = re.findall(r"'(\^[^']*\$)'", expression)
    assert len(patterns) == 3 and "variables.gfdCompat" in expression.split(f"'{patterns[1]}'")[1], expression
    assert variable("gfdCompat").strip() == "false"  # the base's; an overlay sets "true"
    return tuple(re.compile(p) for p in (patterns if gfd_compat else patterns[:2]))


def allowed(key: str, gfd_compat: bool = False) -> bool:
    return any(p.search(key) for p in own_labels(gfd_compat))


@pytest.mark.parametrize("name", DUMPS)
def test_every_label_the_builder_makes_on_a_real_machine_is_allowed(
        name: str, dump_root: Callable[[str], Path]) -> None:
    topology = _discover()(str(dump_root(name)))
    for gfd_compat in (False, True):
        labels = build_label_set(topology, gfd_compat=gfd_compat).labels
        assert labels
        assert [k for k in labels if not allowed(k, gfd_compat)] == [], gfd_compat


@pytest.mark.parametrize("gfd_compat", [False, True], ids=["labels", "gfd-compat"])
def test_every_gpu_label_is_allowed(gfd_compat: bool, tmp_path: Path) -> None:
    """The HGX tree through the builder, and the GPU labels with every optional input given."""
    topology = _discover()(str(build_hgx(tmp_path)))
    built = build_label_set(topology, gfd_compat=gfd_compat).labels
    assert "topolet.io/gpu.count" in built
    full = gpu_labels(gpus_from_topology(topology).gpus, gfd_compat=gfd_compat, mig_layout="all-1g.10gb+me",
                      driver_version="550.54.15", cuda_version="12.4")
    assert "topolet.io/gpu.mig-layout" in full
    assert gfd_compat == ("nvidia.com/cuda.driver.rev" in full)
    assert [k for k in {**built, **full} if not allowed(k, gfd_compat)] == []
    # GPU Feature Discovery's names only where the overlay asks for them.
    assert not [k for k in full if k.startswith("nvidia.com/") and allowed(k, gfd_compat=False)]


def test_every_label_of_hybrid_tiered_machines_is_allowed() -> None:
    """Core kinds and memory tiers (names built from what sysfs says), CPUID flags, PCI classes."""
    topology = machine(sockets=2, kinds=[("Intel Core", 2), ("intel_atom", 2)],
                       memory_only_tiers=["DRAM", "CXL.mem", "NVM"],
                       info=cpu_info(["avx512f", "sse4_2", "amx_tile"]),
                       pci_devices=[pci(0x030200, 0x10DE), pci(0x120000, 0x1002), pci(0x0B4000, 0x8086)])
    labels = build_label_set(topology).labels
    assert any(k.startswith("topolet.io/cpu.kind-") for k in labels), labels
    assert any(k.startswith("topolet.io/memory.tier-") for k in labels), labels
    assert any(k.startswith("feature.node.kubernetes.io/pci-") for k in labels), labels
    assert any(k.startswith("feature.node.kubernetes.io/cpu-cpuid.") for k in labels), labels
    assert [k for k in labels if not allowed(k)] == []


def test_the_mig_state_is_allowed_and_nothing_the_agent_does_not_publish() -> None:
    assert allowed(STATE_LABEL)
    refused = [CONFIG_LABEL, FAILSAFE_LABEL[0], LEGACY_FAILSAFE_KEY, "topolet.io/managed-labels",
               "topolet.io/numa-zone", "topolet.io/pool", "topolet.io/cpu.sockets-x",
               "topolet.io/gpu.count.x", "x.topolet.io/cpu.sockets", "topolet.io.example.com/cpu.sockets",
               "feature.node.kubernetes.io/x", "feature.node.kubernetes.io/cpu-model.vendor_id2",
               "feature.node.kubernetes.io/pci-03_10de.present", "nvidia.com/gpu.count",
               "kubernetes.io/hostname", "node-role.kubernetes.io/control-plane"]
    assert [k for k in refused if allowed(k)] == []
    assert [k for k in refused[3:] if allowed(k, gfd_compat=True) and not k.startswith("nvidia.com/")] == []


def test_the_failsafe_label_is_a_label_key_kubelets_may_not_set() -> None:
    """Valid, and under the prefix the NodeRestriction admission plugin refuses kubelets."""
    key, value = FAILSAFE_LABEL
    assert is_label_key(key) and value == "true"
    assert key.startswith("node-restriction.kubernetes.io/")
