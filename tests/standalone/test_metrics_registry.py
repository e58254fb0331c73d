"""The agent's and the controller's registries: what a scrape shows before anything happened.

Every counter has its series from the start (so `increase()` sees the first event), no `*_created`
series, the process metrics are there, and `topolet_info` names the node `nodename`.  Each
registry is built in a fresh interpreter, as each process builds its own, since the client
library's switch for `*_created` is per process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.gpu import applier
from agent.metrics import registry as agent_metrics
from agent.metrics.registry import (
    ALLOCATION_RESULTS,
    API_WRITE_KINDS,
    MIG_APPLY_TOTALS,
    MIG_OPERATION_RESULTS,
    MIG_OPERATIONS,
    REFUSAL_REASONS,
    Metrics,
)
from agent.pinning import refusal
from tests.conftest import REPO

Families = dict[str, tuple[str, list[tuple[str, dict[str, str], float]]]]

BUILD = {
    "agent": "from agent.metrics.registry import Metrics as M",
    "controller": "from agent.admission.report.metrics import AdmissionMetrics as M",
}


def scrape_fresh(which: str) -> Families:
    """The text a first scrape of `which`'s registry gives, built in a new interpreter."""
    code = f"{BUILD[which]}\nfrom prometheus_client import generate_latest\n" \
           "import sys\nsys.stdout.write(generate_latest(M().registry).decode())\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=60, check=True).stdout
    return {f.name: (f.type, [(s.name, dict(s.labels), s.value) for s in f.samples])
            for f in text_string_to_metric_families(out)}


@pytest.mark.parametrize("which", sorted(BUILD))
def test_no_created_series_and_process_metrics_present(which: str) -> None:
    families = scrape_fresh(which)
    names = [s[0] for _, samples in families.values() for s in samples]
    assert not [n for n in names if n.endswith("_created")]
    values = {name: value for name, _, value in (s for _, samples in families.values() for s in samples)}
    assert values["process_resident_memory_bytes"] > 0
    assert values["process_open_fds"] > 0
    assert "process_cpu_seconds_total" in values and "process_start_time_seconds" in values


@pytest.mark.parametrize("which", sorted(BUILD))
def test_every_counter_has_a_series_before_its_first_increment(which: str) -> None:
    families = scrape_fresh(which)
    counters = {name: samples for name, (kind, samples) in families.items() if kind == "counter"}
    assert counters
    for name, samples in counters.items():
        assert [s for s in samples if s[0] == f"{name}_total"], f"{name} has no series"


def _labels(families: Families, name: str, key: str) -> set[str]:
    return {labels[key] for _, labels, _ in families[name][1]}


def test_agent_labelled_counters_start_at_zero_for_every_known_value() -> None:
    families = scrape_fresh("agent")
    assert _labels(families, "topolet_allocations", "result") == set(ALLOCATION_RESULTS) \
        == {"allocated", "refused", "released", "error"}
    assert _labels(families, "topolet_allocation_refusals", "reason") == set(REFUSAL_REASONS) \
        == {"capacity", "alignment", "invalid"}
    assert _labels(families, "topolet_api_writes", "kind") == set(API_WRITE_KINDS) \
        == {"nrt", "labels", "event"}
    assert _labels(families, "topolet_api_write_errors", "kind") == set(API_WRITE_KINDS)
    ops = {(labels["op"], labels["result"]) for _, labels, _ in families["topolet_mig_operations"][1]}
    assert ops == {(op, r) for op in MIG_OPERATIONS for r in MIG_OPERATION_RESULTS}
    for name in MIG_APPLY_TOTALS:
        (sample,) = families[name.removesuffix("_total")][1]
        assert sample[0] == name and sample[2] == 0
    every = [v for name, (kind, samples) in families.items()
             if kind == "counter" and name.startswith("topolet_") for _, _, v in samples]
    assert every and set(every) == {0.0}


def test_names_shared_with_other_modules_agree() -> None:
    assert MIG_OPERATIONS == applier.OPERATIONS
    assert set(applier.ApplyCounters().as_metrics()) == set(MIG_APPLY_TOTALS)
    assert {refusal.CAPACITY, refusal.ALIGNMENT, refusal.INVALID} == set(REFUSAL_REASONS)
    assert agent_metrics.REFUSED in ALLOCATION_RESULTS


def test_mig_totals_are_read_from_the_applier_when_scraped() -> None:
    m = Metrics()
    counters = applier.ApplyCounters()
    m.watch_mig(counters.as_metrics)
    counters.created += 3
    counters.errors += 1
    assert m.registry.get_sample_value("topolet_mig_instances_created_total") == 3
    assert m.registry.get_sample_value("topolet_mig_apply_errors_total") == 1
    assert m.registry.get_sample_value("topolet_mig_mode_changes_total") == 0


def test_info_names_the_node_nodename_and_a_refusal_reason_is_checked() -> None:
    m = Metrics()
    m.set_node("n1", False, mode="standalone")
    want = {"version": agent_metrics.__version__, "nodename": "n1", "enforcement": "off",
            "mode": "standalone"}
    info = m.registry.get_sample_value("topolet_info", want)
    assert info == 1
    with pytest.raises(ValueError, match="unknown refusal reason"):
        m.refused("busy")
    m.refused("capacity")
    assert m.registry.get_sample_value("topolet_allocations_total", {"result": "refused"}) == 1


def test_info_names_the_pinning_route_once_chosen() -> None:
    m = Metrics()
    m.set_node("n1", True, mode="kubernetes", route="nri")
    want = {"version": agent_metrics.__version__, "nodename": "n1", "enforcement": "on",
            "mode": "kubernetes", "route": "nri"}
    assert m.registry.get_sample_value("topolet_info", want) == 1
    m.set_node("n1", True, mode="kubernetes", route="pod-cgroup")  # one series: the route it has now
    assert m.registry.get_sample_value("topolet_info", want) is None
    assert m.registry.get_sample_value("topolet_info", want | {"route": "pod-cgroup"}) == 1


def test_cpu_gauge_has_no_series_without_a_source_and_survives_a_failing_one() -> None:
    m = Metrics()
    assert m.registry.get_sample_value("topolet_cpus", {"numa": "0", "state": "shared"}) is None
    m.watch_cpus(lambda: [(0, "shared", 4), (0, "exclusive", 2)])
    assert m.registry.get_sample_value("topolet_cpus", {"numa": "0", "state": "exclusive"}) == 2

    def broken() -> list[tuple[int, str, int]]:
        raise OSError("state file unreadable")

    m.watch_cpus(broken)
    # The scrape is still answered; only the CPU series are missing while the state cannot be read.
    assert m.registry.get_sample_value("topolet_cpus", {"numa": "0", "state": "exclusive"}) is None
    assert m.registry.get_sample_value("topolet_state_writes_total") == 0
