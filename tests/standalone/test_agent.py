"""`topolet agent`: drift repair, /healthz, /metrics fed by the exec journal, labels, SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import StandaloneConfig
from agent.enforce.cgroup import read_cpus, write_cpuset
from agent.metrics.registry import Metrics
from agent.standalone.daemon import StandaloneAgent
from agent.topology.cpuset import CPUSet
from tests.standalone.conftest import Node, kill_and_reap, proc_cpus, wait_for

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _drift_target(node: Node, which: str, exclusive: str) -> str:
    return exclusive if which == "allocation" else node.layout.shared_path


@pytest.mark.parametrize("which", ["allocation", "shared-pool"])
def test_reconcile_repairs_a_cpuset_rewritten_behind_its_back(node: Node, which: str) -> None:
    held = node.hold(1)
    shared = node.hold(0)
    rel = _drift_target(node, which, f"{node.layout.parent}/{held.allocation}")
    write_cpuset(node.layout, rel, node.allowed)  # every CPU: overlaps the other side
    assert read_cpus(node.layout, rel) == node.allowed
    result = node.engine().reconcile()
    assert result.drift_repaired >= 1
    assert result.released == () and result.collected == ()
    assert read_cpus(node.layout, f"{node.layout.parent}/{held.allocation}") == held.cpus
    assert node.pool() == node.allowed - held.cpus
    assert proc_cpus(held.pid) == held.cpus
    assert proc_cpus(shared.pid) == node.allowed - held.cpus
    assert node.engine().reconcile().drift_repaired == 0  # repaired for good
    assert held.stop() == 0
    assert shared.stop() == 0


@pytest.mark.parametrize("labels", ["writable", "folder-gone"])
def test_agent_counts_drift_in_process_even_when_labels_fail(node: Node, labels: str) -> None:
    held = node.hold(1)
    if labels == "writable":
        os.makedirs(node.features_dir)
    metrics = Metrics()
    agent = StandaloneAgent(_agent_args(node), metrics)
    write_cpuset(node.layout, f"{node.layout.parent}/{held.allocation}", node.allowed)
    agent.reconcile()
    assert metrics.drift._value.get() == 1  # noqa: SLF001 - no public getter
    assert read_cpus(node.layout, f"{node.layout.parent}/{held.allocation}") == held.cpus
    # A label failure is an error of its own, never a reason to stop enforcing.
    assert metrics.reconcile_errors._value.get() == (0 if labels == "writable" else 1)  # noqa: SLF001
    assert held.stop() == 0


def _agent_args(node: Node, *extra: str) -> StandaloneConfig:
    from agent.cli import build_parser
    from agent.cli.compose import standalone_config

    return standalone_config(build_parser().parse_args(["agent", "--state-dir", node.state_dir,
                                                        "--features-dir", node.features_dir,
                                                        "--cgroup-root", node.root, *extra]))


def _scrape(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    for have, value in samples.get(name, []):
        if all(have.get(k) == v for k, v in labels.items()):
            return value
    return None


def listening_port(agent: subprocess.Popen[bytes], err: Path) -> int:
    """The port an agent started with `--listen 127.0.0.1:0` serves on, from its log."""
    def port() -> int | None:
        m = re.search(r"serving /metrics and /healthz on [^ ]*:(\d+)", err.read_text())
        if agent.poll() is not None:
            pytest.fail(f"agent exited {agent.returncode}: {err.read_text()}")
        return int(m.group(1)) if m else None

    return int(str(wait_for(port, "the agent to listen")))

def test_agent_serves_metrics_health_and_labels_and_stops_on_sigterm(node: Node) -> None:
    # Work done before the agent runs reaches it through the event journal.
    node.run_reporter(1)
    refused = node.run(node.exec_argv(len(node.allowed) + 1, ["true"]))
    assert refused.returncode == 2
    held = node.hold(1)
    agent, err = node.start(node.topolet(
        "agent", "--state-dir", node.state_dir, "--features-dir", node.features_dir,
        "--cgroup-root", node.root, "--listen", "127.0.0.1:0", "--reconcile-seconds", "0.2"))
    p = listening_port(agent, err)
    status, body = _scrape(p, "/healthz")
    assert status == 200, body

    def counted() -> Samples | None:
        s = _samples(_scrape(p, "/metrics")[1])
        return s if _value(s, "topolet_pin_latency_seconds_count") == 2 else None

    s = wait_for(counted, "both pinned execs in topolet_pin_latency_seconds")
    assert isinstance(s, dict)
    assert _value(s, "topolet_allocations_total", result="allocated") == 2
    # More CPUs than the node has: a refusal for capacity, not an error.
    assert _value(s, "topolet_allocations_total", result="refused") == 1
    assert _value(s, "topolet_allocation_refusals_total", reason="capacity") == 1
    assert _value(s, "topolet_allocations_total", result="error") == 0
    assert _value(s, "topolet_allocations_total", result="released") == 1  # the reporter that ended
    assert _value(s, "topolet_pin_latency_seconds_bucket", le="+Inf") == 2
    assert (_value(s, "topolet_pin_latency_seconds_sum") or 0) > 0
    assert (_value(s, "topolet_state_writes_total") or 0) >= 2  # each allocation committed at least once
    info = s["topolet_info"][0][0]
    assert info["nodename"] == os.uname().nodename and "node" not in info
    assert info["enforcement"] == "on"
    reserved = CPUSet([0]) & node.allowed  # the standalone agent's default, as exec's
    for n in node.topology.numa_nodes:
        if n.memory_only:
            continue
        cpus = n.cpus & node.allowed
        got = {st: _value(s, "topolet_cpus", numa=str(n.id), state=st)
               for st in ("exclusive", "shared", "reserved")}
        assert got == {"exclusive": len(cpus & held.cpus), "shared": len(cpus - held.cpus - reserved),
                       "reserved": len(cpus & reserved)}
    assert _value(s, "topolet_cgroup_drift_total") == 0

    # Drift behind the agent's back is repaired by its loop and counted.
    rel = f"{node.layout.parent}/{held.allocation}"
    write_cpuset(node.layout, rel, node.allowed)

    def repaired() -> bool:
        d = _value(_samples(_scrape(p, "/metrics")[1]), "topolet_cgroup_drift_total")
        return d is not None and d >= 1 and read_cpus(node.layout, rel) == held.cpus

    wait_for(repaired, "the agent to repair and count the drift")
    assert proc_cpus(held.pid) == held.cpus

    files = os.listdir(node.features_dir)
    assert [f for f in files if not f.startswith(".")] == ["topolet"]
    text = Path(node.features_dir, "topolet").read_text()
    assert re.search(r"^topolet\.io/numa\.nodes=\d+$", text, re.M), text
    assert _scrape(p, "/nope")[0] == 404

    agent.send_signal(signal.SIGTERM)
    assert agent.wait(20) == 0
    with pytest.raises(OSError):
        _scrape(p, "/healthz")
    assert held.stop() == 0


def test_agent_once_exits_without_serving(node: Node) -> None:
    result = node.agent_once()
    assert "serving" not in result.stderr
    assert os.path.exists(os.path.join(node.features_dir, "topolet"))


def _exclusive_gauge(node: Node, metrics: Metrics) -> float:
    return float(sum(metrics.registry.get_sample_value("topolet_cpus", {"numa": str(n.id),
                                                                         "state": "exclusive"}) or 0
                     for n in node.topology.numa_nodes if not n.memory_only))


def test_agent_releases_what_died_and_updates_cpu_gauges(node: Node) -> None:
    os.makedirs(node.features_dir)
    held = node.hold(node.capacity)
    metrics = Metrics()
    agent = StandaloneAgent(_agent_args(node), metrics)
    agent.reconcile()
    assert _exclusive_gauge(node, metrics) == len(held.cpus)
    held.launcher.send_signal(signal.SIGKILL)
    held.launcher.wait(20)
    kill_and_reap(held.pid)
    agent.reconcile()
    assert _exclusive_gauge(node, metrics) == 0
    assert node.state().allocations == ()
    assert node.workload_cgroups() == []
    # Reaped by the agent (its owner died without releasing it): counted once, by the agent.
    assert metrics.registry.get_sample_value("topolet_allocations_total", {"result": "released"}) == 1
    agent.reconcile()
    assert metrics.registry.get_sample_value("topolet_allocations_total", {"result": "released"}) == 1


def test_cpu_gauge_is_current_at_scrape_time_between_reconciles(node: Node) -> None:
    agent, err = node.start(node.topolet(
        "agent", "--state-dir", node.state_dir, "--features-dir", node.features_dir,
        "--cgroup-root", node.root, "--listen", "127.0.0.1:0", "--reconcile-seconds", "3600"))
    p = listening_port(agent, err)

    def now() -> tuple[float, float]:
        s = _samples(_scrape(p, "/metrics")[1])
        usable = [n for n in node.topology.numa_nodes if not n.memory_only]
        exclusive = sum(_value(s, "topolet_cpus", numa=str(n.id), state="exclusive") or 0 for n in usable)
        return exclusive, _value(s, "topolet_reconcile_duration_seconds_count") or 0

    exclusive, passes = now()
    assert exclusive == 0 and passes == 1  # the first pass, at start; the next is an hour away
    want = min(2, node.capacity)
    held = node.hold(want)
    assert now() == (want, passes)  # pinned since the last reconcile, and shown
    assert held.stop() == 0
    assert now() == (0, passes)
    s = _samples(_scrape(p, "/metrics")[1])
    assert not [name for name in s if name.endswith("_created")]
    assert (_value(s, "process_resident_memory_bytes") or 0) > 0


def test_state_writes_metric_counts_every_commit_made_by_execs_and_the_agent(node: Node) -> None:
    os.makedirs(node.features_dir)
    node.run_reporter(1)
    assert node.run(node.exec_argv(len(node.allowed) + 1, ["true"])).returncode == 2
    node.run_reporter(node.capacity, "--memory-binding")
    metrics = Metrics()
    StandaloneAgent(_agent_args(node), metrics).reconcile()
    # Each commit bumps the generation by one, whoever made it: the metric must have seen them all.
    assert metrics.state_writes._value.get() == node.state().generation  # noqa: SLF001


def test_enforcement_off_is_refused_in_standalone_mode(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from agent.cli import main

    state = tmp_path / "state"
    rc = main(["agent", "--mode", "standalone", "--enforcement", "off", "--state-dir", str(state),
               "--features-dir", str(tmp_path / "features.d"), "--once"])
    assert rc == 2
    assert "--enforcement off is for the Kubernetes mode only" in capsys.readouterr().err
    assert not state.exists()
