"""Debian's real Prometheus (1 s scrapes, daemonset/monitoring/topolet.rules.yaml loaded) scraping real
standalone agents while the test pins, is refused, rewrites cpusets behind the agent's back, kills the
agent and restarts it. Every alert expression must then behave as its promtool unit test says, every
rule evaluates without error, and every panel query of every dashboard in daemonset/dashboards/, with
its variables substituted as Grafana would, returns data.

Two targets in the job `topolet-agent`:
- `topolet agent` on this host as root, in the test's private cpuset cgroup (tests/standalone's `node`);
- an agent run in this process on the HGX sysfs fixture with the NVML stand-in (tests/gpu/fake_nvml.py),
  whose MIG layout cannot be applied (MIG mode is off and not ours to change): the MIG series, the
  failed state and enforcement off; the test also hangs its reconcile loop while /metrics answers. No
  GPU exists here; NVML is the one part played by a stand-in.

`test_prometheus_on_the_cluster` does the same for the admission controller: its two replicas on the
test cluster (real kube-apiserver, kube-controller-manager, kube-scheduler; tests/controlplane) with
simulated nodes served by real in-cluster agents, a gang admitted, one rejected, one waiting, the
leader killed, then the standby stopped. No kube-state-metrics runs in either: the queries that need it
are checked to evaluate without error only (`needs()` says what each query needs).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from agent.cli import build_parser
from agent.cli.compose import standalone_config
from agent.enforce.cgroup import read_cpus, write_cpuset
from agent.metrics.registry import Metrics
from agent.metrics.server import MetricsServer, staleness_health
from agent.standalone.daemon import StandaloneAgent
from tests.conftest import REPO, require
from tests.controlplane.fixtures import cluster as cluster  # noqa: F401 - fixture
from tests.controlplane.fixtures import cluster_session as cluster_session  # noqa: F401 - fixture
from tests.gpu.fake_nvml import h100_node
from tests.gpu.sysfs_fixture import build_hgx
from tests.standalone.conftest import Held, Node, wait_for
from tests.standalone.conftest import node as node  # noqa: F401 - fixture
from tests.standalone.conftest import topology as topology  # noqa: F401 - fixture

if TYPE_CHECKING:
    from tests.controlplane.cluster import Cluster

RULES = REPO / "daemonset" / "monitoring" / "topolet.rules.yaml"
DASHBOARDS = REPO / "daemonset" / "dashboards"
PROMETHEUS_WAIT = 90.0  # scrapes and rule evaluations are 1 s apart; a loaded machine needs slack
SCRAPE_SECONDS = 1
# Grafana's $__rate_interval with a 1 s scrape interval: max($__interval + scrape, 4 × scrape).
RATE_INTERVAL = f"{4 * SCRAPE_SECONDS}s"

NODENAME = "hgx-fixture"  # the in-process agent's node

Result = list[dict[str, Any]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """Debian's `prometheus` on a temp config and TSDB, scraping `jobs` (job name: its targets)."""

    def __init__(self, binary: str, tmp: Path, jobs: dict[str, list[str]]) -> None:
        tmp.mkdir()
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s",
                       "scrape_timeout": f"{SCRAPE_SECONDS}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in jobs.items()],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as f:
            self.process = subprocess.Popen(
                [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=f, stderr=subprocess.STDOUT)
        wait_for(self._ready, "Prometheus to be ready", PROMETHEUS_WAIT)

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"prometheus exited {self.process.returncode}: {self.log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str | float) -> Any:
        """One HTTP API call; the test fails on an error answer (a bad query, a failed evaluation)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            pytest.fail(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> Result:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float) -> Result:
        return list(self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_SECONDS)["result"])

    def label_values(self, selector: str, label: str, start: float, end: float) -> list[str]:
        """What Grafana's `label_values(selector, label)` lists (the series API over the time range)."""
        series = self.api("series", **{"match[]": selector}, start=start, end=end)
        return sorted({s[label] for s in series if label in s})

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class MigAgent:
    """A standalone agent in this process on the HGX fixture and the NVML stand-in, reconciling every
    second and serving /metrics like `topolet agent`, whose MIG layout fails (MIG off, not ours to turn
    on) and whose pinning is off (its cgroup root is no cgroup)."""

    def __init__(self, tmp: Path) -> None:
        tmp.mkdir()
        nvml = h100_node(2, mig=False)
        nvml.nvmlInit()
        (tmp / "features.d").mkdir()
        args = build_parser().parse_args([
            "agent", "--fsroot", str(build_hgx(tmp / "hgx")), "--state-dir", str(tmp / "state"),
            "--features-dir", str(tmp / "features.d"), "--cgroup-root", str(tmp / "not-a-cgroup"),
            "--mig-config", "all-balanced", "--reconcile-seconds", "1"])
        self.metrics = Metrics()
        self.agent = StandaloneAgent(standalone_config(args), self.metrics, nvml=nvml)
        # It stands for another node: the agents of a fleet have names of their own (the agent calls
        # itself after this host), and the dashboards tell nodes apart by name.
        self.metrics.set_node(NODENAME, False, mode="standalone")
        self.agent.reconcile()
        self.server = MetricsServer(self.metrics, "127.0.0.1:0", staleness_health(self.metrics, 15.0))
        self.server.start()
        self.stopped = threading.Event()
        self.running = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self._loop, name="mig-agent", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.wait(1.0):
            if self.running.is_set():
                self.agent.reconcile()

    def health(self) -> int:
        """The HTTP status of its /healthz."""
        try:
            with urllib.request.urlopen(f"http://{self.instance}/healthz", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        self.server.stop()


@pytest.fixture
def mig_agent(tmp_path: Path) -> Iterator[MigAgent]:
    agent = MigAgent(tmp_path / "mig")
    try:
        yield agent
    finally:
        agent.stop()


# ---- the alerts ------------------------------------------------------------------------------------

def alert_exprs() -> dict[str, str]:
    return {r["alert"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
            if "alert" in r}


def firing(prom: Prometheus, alert: str) -> set[str]:
    """The instances `alert`'s expression returns now ("" for a series with no instance label)."""
    return {s["metric"].get("instance", "") for s in prom.query(alert_exprs()[alert])}


def check_alerts(prom: Prometheus, expected: dict[str, set[str]], what: str) -> None:
    """Every alert's expression returns exactly the instances `expected` names (none where not named);
    waits for the rule evaluations to catch up with the scrapes, then fails with every difference."""
    exprs = alert_exprs()
    assert set(expected) <= set(exprs)

    def differences() -> dict[str, tuple[set[str], set[str]]]:
        diff = {}
        for alert in exprs:
            got, want = firing(prom, alert), expected.get(alert, set())
            if alert == "TopoletPinLatencyHigh":
                # Real pins on a loaded machine: the alert must agree with the recording rule it reads.
                p99 = prom.query("instance:topolet_pin_latency_seconds:p99_5m")
                want = {s["metric"]["instance"] for s in p99 if float(s["value"][1]) > 0.1}
            if got != want:
                diff[alert] = (got, want)
        return diff

    deadline = time.monotonic() + PROMETHEUS_WAIT
    while (diff := differences()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not diff, f"{what}: alert expressions (got, expected): {diff}"


def check_rules_healthy(prom: Prometheus, start: float, fed: str) -> None:
    """Every rule's last evaluation went without error (no many-to-many join, no bad types), and every
    recording rule of the group `fed` recorded data since `start`."""
    groups = prom.api("rules")["groups"]
    assert fed in {g["name"] for g in groups}
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
            if group["name"] == fed and rule["type"] == "recording":
                recorded = prom.query_range(rule["name"], start, time.time())
                assert has_data(recorded), f"{rule['name']} recorded nothing"


# ---- the dashboards --------------------------------------------------------------------------------

def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def needs(expr: str) -> str | None:
    """What a query needs that this test does not run, or None."""
    if "kube_" in expr:
        return "kube-state-metrics"
    if "topolet_admission_" in expr or '"topolet-controller"' in expr:
        return "the admission controller"
    return None


def substitute(expr: str, values: dict[str, str]) -> str:
    """`expr` with Grafana's $var, ${var}, ${var:format} and [[var]] replaced from `values`."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in values, f"no value for ${name} in {expr}"
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", one, expr)


def regex_value(values: list[str]) -> str:
    """A multi-value selection as Grafana writes it into a Prometheus query: escaped, (a|b)."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def variable_values(prom: Prometheus, dashboard: dict[str, Any], start: float, end: float,
                    pick: dict[str, list[str]]) -> dict[str, str]:
    """Each template variable's value, in order: the dashboard's saved selection (All gives its
    allValue), or the values in `pick` (which must be among those the variable's query lists now)."""
    values = {"__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE_SECONDS}s",
              "__range": f"{int(end - start)}s", "__range_s": str(int(end - start))}
    for var in dashboard.get("templating", {}).get("list", []):
        name = var["name"]
        if var["type"] == "datasource":
            values[name] = "prometheus"
            continue
        if var["type"] in ("custom", "interval", "textbox", "constant"):
            # Their values are written in the dashboard: the saved one, else the first listed.
            current = var.get("current", {}).get("value")
            listed = [v.strip() for v in str(var.get("query", "")).split(",") if v.strip()]
            chosen = [current] if isinstance(current, str) else list(current or listed[:1])
            values[name] = regex_value(listed) if chosen == ["$__all"] else regex_value(chosen)
            continue
        assert var["type"] == "query", f"variable {name}: type {var['type']} not handled here"
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", substitute(query, values).strip())
        assert m, f"variable {name}: {query}"
        listed = prom.label_values(m.group(1), m.group(2), start, end)
        current = var.get("current", {}).get("value")
        chosen = [current] if isinstance(current, str) else list(current or [])
        if name in pick:
            chosen = pick[name]
            assert set(chosen) <= set(listed), f"variable {name}: {chosen} not among {listed}"
        assert chosen, f"variable {name}: no saved selection"
        # A saved single value stays even when nothing lists it (the controller's job, here): its
        # queries then find nothing, rather than another job's series.
        if chosen == ["$__all"]:
            values[name] = var.get("allValue") or regex_value(listed)
        else:
            values[name] = regex_value(chosen)
    return values


def has_data(result: Result) -> bool:
    return any(not math.isnan(float(v)) for s in result for _, v in s["values"])


def check_dashboards(prom: Prometheus, start: float, end: float, pick: dict[str, list[str]],
                     running: tuple[str, ...] = ("the agents",)) -> list[str]:
    """Every panel query of every dashboard over [start, end] (each must evaluate without error); fails
    on any without data whose needs (`needs()`, "the agents" when nothing else) are in `running`, and
    returns the others."""
    empty, skipped = [], []
    files = sorted(DASHBOARDS.glob("*.json"))
    assert files
    for path in files:
        dashboard = json.loads(path.read_text())
        values = variable_values(prom, dashboard, start, end, pick)
        for panel in panels(dashboard.get("panels", [])):
            for target in panel.get("targets", []):
                if not target.get("expr") or target.get("hide"):
                    continue
                expr = substitute(target["expr"], values)
                result = prom.query_range(expr, start, end)
                where = f"{path.name}: {panel.get('title')!r} {target.get('refId', '')}"
                if has_data(result):
                    continue
                need = needs(expr) or "the agents"
                if need in running:
                    empty.append(f"{where}: {expr}")
                else:
                    skipped.append(f"{where} (needs {need})")
    assert not empty, "panel queries without data:\n" + "\n".join(empty)
    return skipped


# ---- the scenario ----------------------------------------------------------------------------------

def start_agent(node: Node, port: int) -> subprocess.Popen[bytes]:
    agent, err = node.start(node.topolet(
        "agent", "--state-dir", node.state_dir, "--features-dir", node.features_dir,
        "--cgroup-root", node.root, "--listen", f"127.0.0.1:{port}", "--reconcile-seconds", "1"))

    def serving() -> bool:
        if agent.poll() is not None:
            pytest.fail(f"agent exited {agent.returncode}: {err.read_text()}")
        return "serving /metrics" in err.read_text()

    wait_for(serving, "the agent to listen")
    return agent


def scraped(prom: Prometheus, expr: str, what: str) -> Result:
    """Wait until Prometheus answers `expr` with something."""
    result = wait_for(lambda: prom.query(expr), what, PROMETHEUS_WAIT)
    assert isinstance(result, list)
    return result


def rewrite_cpuset(node: Node, held: Held) -> None:
    """Another writer widens the held allocation's cpuset; the agent's loop puts it back."""
    rel = f"{node.layout.parent}/{held.allocation}"
    write_cpuset(node.layout, rel, node.allowed)
    wait_for(lambda: read_cpus(node.layout, rel) == held.cpus, "the agent to repair the cpuset")


def test_prometheus_alerts_and_dashboards_on_real_agents(node: Node, mig_agent: MigAgent,  # noqa: F811
                                                        tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    require(binary is not None, "needs prometheus (Debian's package: make deps)")
    assert binary is not None
    port = free_port()
    instance, mig = f"127.0.0.1:{port}", mig_agent.instance
    prom = Prometheus(binary, tmp_path / "prometheus", {"topolet-agent": [instance, mig]})
    try:
        start = time.time()
        agent = start_agent(node, port)
        scraped(prom, 'count(up{job="topolet-agent"} == 1) == 2', "both targets up")

        # Pin, get refused, and have one cpuset rewritten once: the agent repairs and counts it.
        held = node.hold(1)
        refused = node.run(node.exec_argv(len(node.allowed) + 1, ["true"]))
        assert refused.returncode == 2, refused.stderr
        rewrite_cpuset(node, held)
        scraped(prom, f'topolet_pin_latency_seconds_count{{instance="{instance}"}} >= 1', "the pin")
        scraped(prom, f'topolet_allocation_refusals_total{{instance="{instance}", reason="capacity"}} >= 1',
                "the refusal, counted by reason")
        scraped(prom, f'topolet_allocations_total{{instance="{instance}", result="refused"}} >= 1',
                "the refusal, counted as refused")
        scraped(prom, f'instance:topolet_cgroup_drift:increase10m{{instance="{instance}"}} >= 1',
                "the drift repair, in the recording rule")
        scraped(prom, f'topolet_mig_config_state{{instance="{mig}", state="failed"}} == 1', "MIG failed")
        (info,) = scraped(prom, f'topolet_info{{instance="{instance}"}}', "topolet_info")
        nodename = info["metric"]["nodename"]
        # As the unit tests say: a refusal is no allocation error, one repair is no fight, MIG failed
        # fires, and with no controller scraped at all TopoletControllerDown fires.
        healthy = {"TopoletMIGConfigFailed": {mig}, "TopoletControllerDown": {""}}
        check_alerts(prom, healthy, "after a pin, a refusal and one drift repair")

        # A reconcile loop that hangs while /metrics still answers: stale past the /healthz deadline,
        # and /healthz says so too by then (the alert reads the age at the last scrape, /healthz now).
        mig_agent.running.clear()
        check_alerts(prom, {**healthy, "TopoletReconcileStale": {mig}}, "with the MIG agent's loop hung")
        assert mig_agent.health() == 503
        mig_agent.running.set()
        check_alerts(prom, healthy, "with its loop back")
        assert mig_agent.health() == 200

        # Another writer that keeps rewriting: the drift alert's expression names this agent.
        for _ in range(3):
            rewrite_cpuset(node, held)
        check_alerts(prom, {**healthy, "TopoletCgroupDriftRepeated": {instance}}, "after repeated drift")
        (drifting,) = prom.query(alert_exprs()["TopoletCgroupDriftRepeated"])
        assert drifting["metric"]["nodename"] == nodename

        # The agent dies: it is down, named by its last topolet_info; its series go stale, so neither
        # the stale-reconcile nor the drift alert speaks for it meanwhile.
        agent.kill()
        agent.wait(20)
        scraped(prom, f'up{{instance="{instance}"}} == 0', "the failed scrape")
        check_alerts(prom, {**healthy, "TopoletAgentDown": {instance}}, "with the agent killed")
        (down,) = prom.query(alert_exprs()["TopoletAgentDown"])
        assert down["metric"]["nodename"] == nodename

        # Restarted, it picks up its allocation and the alert clears; the repairs before the restart
        # still count in the drift alert's window (increase() spans the counter's reset).
        agent = start_agent(node, port)
        scraped(prom, f'up{{instance="{instance}"}} == 1', "the restarted agent")
        scraped(prom, f'sum(topolet_cpus{{instance="{instance}", state="exclusive"}}) == {len(held.cpus)}',
                "the held allocation, recovered")
        check_alerts(prom, {**healthy, "TopoletCgroupDriftRepeated": {instance}}, "after the restart")

        check_rules_healthy(prom, start, "topolet-agent.records")

        end = time.time()
        skipped = check_dashboards(prom, start, end, {})
        # The same with both nodes picked by name, as a multi-value selection.
        assert check_dashboards(prom, start, end, {"node": sorted([nodename, NODENAME])}) == skipped
        # Only what needs kube-state-metrics or the controller (test_prometheus_on_the_cluster) goes
        # without data here.
        assert all("needs kube-state-metrics" in s or "needs the admission controller" in s for s in skipped)
        assert held.stop() == 0
    finally:
        prom.stop()


# ---- the admission controller ----------------------------------------------------------------------

DUMP = "64fake-4n2s2ca2c2t"  # 4 NUMA zones of 16 CPUs per node (tests/admission's nodes)


@pytest.fixture
def cluster_nodes(cluster: Cluster, dump_root: Callable[[str], Path]) -> tuple[str, dict[str, str]]:
    """Two simulated nodes, each served by a real in-cluster agent listening on a port of its own:
    (the label only this test's Jobs select, {instance: node name})."""
    label = f"test.topolet.io/{uuid.uuid4().hex[:8]}"
    agents = {}
    for i in range(2):
        port = free_port()
        node = cluster.add_node(f"prom-{label[-8:]}-{i}", dump_root(DUMP), labels={label: "true"},
                                agent_args=["--listen", f"127.0.0.1:{port}"])
        agents[f"127.0.0.1:{port}"] = node.name
    for name in agents.values():
        wait_for(lambda n=name: cluster.nrt(n), f"the NRT of {name}", PROMETHEUS_WAIT)
    return label, agents


def test_prometheus_on_the_cluster(cluster: Cluster, cluster_nodes: tuple[str, dict[str, str]],
                                   tmp_path: Path) -> None:
    """The admission controller's two replicas and the in-cluster agents under the real Prometheus: a
    gang admitted, one rejected, one waiting, then the leader killed and, last, the standby too."""
    from agent.kubeapi.client import KubeClient
    from tests.admission.test_controller import gang_job

    binary = shutil.which("prometheus")
    require(binary is not None, "needs prometheus (Debian's package: make deps)")
    assert binary is not None
    label, agents = cluster_nodes
    ports = [free_port(), free_port()]
    replicas = [f"127.0.0.1:{p}" for p in ports]
    prom = Prometheus(binary, tmp_path / "prometheus", {"topolet-agent": list(agents),
                                                        "topolet-controller": replicas})
    api = KubeClient(cluster.plane.client())
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    try:
        start = time.time()
        # A short Lease, so the standby takes over within seconds.
        election = ("--leader-elect", "--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "1")
        procs = [cluster.start_controller("--listen", f"127.0.0.1:{p}", "--resync-seconds", "2", *election)
                 for p in ports]
        scraped(prom, 'count(up{job="topolet-controller"} == 1) == 2', "both replicas up")
        scraped(prom, 'count(up{job="topolet-agent"} == 1) == 2', "both agents up")
        scraped(prom, 'sum(topolet_admission_leader{job="topolet-controller"}) == 1', "one leader")

        api.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        api.create(jobs, gang_job("a", 4, label))  # fits: admitted
        api.create(jobs, gang_job("huge", 1, label, cpu=20))  # 20 CPUs in a zone of 16: rejected
        api.create(jobs, gang_job("wide", 8, label))  # needs every zone while a holds 4: waiting
        for result in ("admitted", "rejected", "waiting"):
            scraped(prom, f'sum(topolet_admission_decisions_total{{result="{result}"}}) >= 1', result)
        scraped(prom, 'max(topolet_admission_queue_depth{queue="default"}) == 1', "wide queued")
        check_alerts(prom, {}, "with both replicas and both agents up")

        # The leader dies: the standby takes the Lease; one replica down is no alert.
        (leader,) = prom.query('topolet_admission_leader{job="topolet-controller"} == 1')
        killed = replicas.index(leader["metric"]["instance"])
        procs[killed].popen.kill()
        procs[killed].popen.wait(20)
        standby = replicas[1 - killed]
        scraped(prom, f'topolet_admission_leader{{instance="{standby}"}} == 1', "the standby leading")
        check_alerts(prom, {}, "after the leader was killed")
        check_rules_healthy(prom, start, "topolet-controller")
        end = time.time()
        skipped = check_dashboards(prom, start, end, {}, running=("the admission controller",))
        assert not any("needs the admission controller" in s for s in skipped)

        # The last replica stops: no controller is up.
        procs[1 - killed].stop()
        scraped(prom, f'up{{instance="{standby}"}} == 0', "the last replica gone")
        check_alerts(prom, {"TopoletControllerDown": {""}}, "with no replica up")
    finally:
        prom.stop()
        with contextlib.suppress(Exception):
            api.request("DELETE", f"/api/v1/namespaces/{namespace}")
        api.close()
