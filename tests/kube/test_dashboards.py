"""The Grafana dashboards in daemonset/dashboards/: a lint, and what the queries show for a fleet in trouble.

The lint: every panel has a unit, thresholds, a datasource and a description; every query parses
(promtool's PromQL parser, through `promtool check rules`), selects by the dashboard's variables and
names only series the agent's or the controller's registry exports, `up`, or the kube-state-metrics
series in KUBE_STATE_METRICS; and every series the two registries export is on some panel or in
DELIBERATELY_NOT_SHOWN with its reason.  `promtool test rules` then evaluates panels' queries, with
their variables substituted as Grafana does, over synthetic series: a fleet with a dead agent, a
stuck one, one with enforcement off and one replaced in a rollout (each panel shows the trouble as a
value, not as 'No data'), and two controller replicas (the cluster figures are the leader's, once).
A live Prometheus scraping a real agent is tests/monitoring's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require

DASHBOARDS = Path(__file__).resolve().parents[2] / "daemonset" / "dashboards"
FLEET, NODE, CAPACITY = "topolet.json", "topolet-node.json", "topolet-admission.json"
NODE_LABEL = "nodename"  # topolet_info's node-name label (a scrape config may add its own `node`)
AGENT_JOB, CONTROLLER_JOB = "topolet-agent", "topolet-controller"

# Series from outside topolet the panels read, and why.
KUBE_STATE_METRICS = {
    "kube_daemonset_status_desired_number_scheduled": "Fleet: agents the DaemonSet should run",
}
PROMETHEUS_SERIES = {"up": "agents and controller replicas scraped or not"}
# Series the registries export that no panel shows, each with its reason.
DELIBERATELY_NOT_SHOWN = {
    "process_virtual_memory_bytes": "address space reserved, not used: the footprint is RSS",
}
# Grafana's own variables; the dashboards' are in each one's templating list.
GRAFANA_VARIABLES = {"__rate_interval", "__range", "__interval"}


def load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return loaded


def dashboard_files() -> list[str]:
    return sorted(p.name for p in DASHBOARDS.glob("*.json"))


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels that show data (rows only group them)."""
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    (found,) = [p for p in panels_of(dashboard) if p["title"] == title]
    return found


def exprs_of(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels_of(dashboard) for t in p["targets"]]


def all_exprs() -> Iterator[tuple[str, str, str]]:
    """(dashboard file, panel title, expression) for every query of every dashboard."""
    for name in dashboard_files():
        for p in panels_of(load(name)):
            for t in p["targets"]:
                yield name, p["title"], t["expr"]


# ---- reading PromQL without a Prometheus ---------------------------------------------------------

_TOKEN = re.compile(r'\s+|"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[A-Za-z_:][A-Za-z0-9_:]*|\$\w+|'
                    r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|=~|!~|==|!=|>=|<=|[-+*/%^<>=(){},]")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def tokens(expr: str) -> list[str]:
    """`expr` cut into PromQL tokens (strings and [ranges] whole); a character no token covers fails."""
    out: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(expr):
        assert match.start() == pos, f"cannot read {expr[pos:]!r} in {expr}"
        pos = match.end()
        if not match.group().isspace():
            out.append(match.group())
    assert pos == len(expr), f"cannot read {expr[pos:]!r} in {expr}"
    return out


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """Every series selector in `expr`: (name, {label: operator and value}), as ('up', {'job': '=~a'})."""
    toks = tokens(expr)
    found: list[tuple[str, dict[str, str]]] = []
    i = 0
    while i < len(toks):
        tok, nxt = toks[i], toks[i + 1] if i + 1 < len(toks) else ""
        if tok in _LABEL_LISTS and nxt == "(":
            i = toks.index(")", i) + 1  # label lists hold no selectors
        elif tok in _KEYWORDS or nxt in ("(", "by", "without"):  # functions and aggregations
            i += 1
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", tok) or tok == "{":
            name = "" if tok == "{" else tok
            i += 1 if tok == "{" else 2 if nxt == "{" else 1
            matchers: dict[str, str] = {}
            if tok == "{" or nxt == "{":
                while toks[i] != "}":
                    label, op, value = toks[i], toks[i + 1], toks[i + 2]
                    assert value.startswith('"'), expr
                    matchers[label] = op + value[1:-1]
                    i += 3 if toks[i + 3] == "}" else 4
                i += 1
            found.append((name, matchers))
        else:
            i += 1
    return found


def substitute(expr: str, job: str = AGENT_JOB) -> str:
    """`expr` with its variables as Grafana fills them with every picker on All (and this job)."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h").replace("$__interval", "15s")
    expr = expr.replace('"$job"', f'"{job}"').replace('"$agent_job"', f'"{AGENT_JOB}"')
    return re.sub(r"\$\w+", ".*", expr)


# ---- what the registries export ------------------------------------------------------------------

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",),
             "gauge": ("",), "summary": ("", "_sum", "_count"), "unknown": ("",)}


def families(registry: Any) -> dict[str, set[str]]:
    """{family name: the series names it exports} for every family `registry` collects."""
    return {f.name: {f.name + s for s in _SUFFIXES[f.type]} for f in registry.collect()}


def agent_families() -> dict[str, set[str]]:
    from agent.metrics.registry import Metrics

    return families(Metrics().registry)


def controller_families() -> dict[str, set[str]]:
    from agent.admission.report.metrics import AdmissionMetrics

    return families(AdmissionMetrics().registry)


def label_values(registry: Any, family: str, label: str) -> set[str]:
    """The values of `label` among the series `family` has before anything is counted."""
    return {s.labels[label] for f in registry.collect() if f.name == family for s in f.samples}


def used_names() -> set[str]:
    return {name for _, _, expr in all_exprs() for name, _ in selectors(expr)}


# ---- the lint ------------------------------------------------------------------------------------


def test_the_selector_reader_reads_what_it_must() -> None:
    """The reader the lint relies on: names, matchers, and no label list or function taken for a metric."""
    expr = ('sum by (nodename) (rate(topolet_allocations_total{job=~"$job", result="error"}[5m]) * on (job, '
            'instance) group_left (nodename) topk by (job) (1, topolet_info{nodename=~"a,b}"})) or vector(0)')
    assert selectors(expr) == [("topolet_allocations_total", {"job": '=~$job', "result": "=error"}),
                               ("topolet_info", {"nodename": '=~a,b}'})]
    assert selectors("up == 0") == [("up", {})]
    with pytest.raises(AssertionError):
        tokens("up # a comment")


def test_every_dashboard_ships_with_a_distinct_uid() -> None:
    names = dashboard_files()
    assert set(names) >= {FLEET, NODE, CAPACITY}
    uids = [load(name)["uid"] for name in names]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("name", dashboard_files())
def test_every_panel_has_a_unit_thresholds_a_datasource_and_a_description(name: str) -> None:
    dashboard = load(name)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels_of(dashboard):
        assert p["description"].strip(), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        defaults = p["fieldConfig"]["defaults"]
        assert defaults.get("unit"), p["title"]
        steps = defaults["thresholds"]["steps"]
        assert steps and steps[0]["value"] is None, p["title"]  # a base colour, then rising steps
        values = [s["value"] for s in steps[1:]]
        assert values == sorted(values), p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]


@pytest.mark.parametrize("name", dashboard_files())
def test_panels_do_not_overlap(name: str) -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in load(name)["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("name", dashboard_files())
def test_variables_pick_datasource_cluster_job_and_node_by_name(name: str) -> None:
    variables = {v["name"]: v for v in load(name)["templating"]["list"]}
    assert {"datasource", "cluster", "job", "node"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource"
    node = variables["node"]["query"]["query"]
    assert re.fullmatch(rf'label_values\(topolet_info\{{cluster=~"\$cluster", job=~"\$\w+"}}, {NODE_LABEL}\)',
                        node), node
    assert variables["node"]["includeAll"] and variables["node"]["multi"]
    # The job picker lists every job Prometheus scrapes (from `up`, so a job whose agents all died
    # stays pickable) and starts on the job the PodMonitor and the plain scrape config set.
    jobs = {v["current"]["value"] for v in variables.values() if v["label"].endswith("job")}
    assert jobs <= {AGENT_JOB, CONTROLLER_JOB} and jobs
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    used = {v for expr in exprs_of(load(name)) for v in re.findall(r"\$(\w+)", expr)}
    assert used <= set(variables) | GRAFANA_VARIABLES, used - set(variables) - GRAFANA_VARIABLES


@pytest.mark.parametrize("name", dashboard_files())
def test_every_query_selects_by_the_dashboards_cluster_and_job(name: str) -> None:
    """Two clusters, or a second Prometheus job scraping the same port, never mix into a panel."""
    for expr in exprs_of(load(name)):
        for metric, matchers in selectors(expr):
            assert metric, f"a selector without a metric name in {expr}"
            assert matchers.get("cluster") == "=~$cluster", (metric, expr)
            if metric not in KUBE_STATE_METRICS:
                assert matchers.get("job") in ("=~$job", "=~$agent_job"), (metric, expr)


@pytest.mark.parametrize("name", [FLEET, NODE, CAPACITY])
def test_agent_series_are_narrowed_by_the_node_picker_and_named_by_node(name: str) -> None:
    """An agent's series carry no node name: the panels join it from topolet_info, by instance."""
    agent_job = "=~$agent_job" if name == CAPACITY else "=~$job"
    for expr in exprs_of(load(name)):
        found = selectors(expr)
        agent = [m for m, labels in found if labels.get("job") == agent_job and m != "up"]
        if not agent:
            continue  # `up` alone: counts that must see agents that never reported a name
        infos = [labels for m, labels in found if m == "topolet_info"]
        assert any(labels.get(NODE_LABEL) == "=~$node" for labels in infos), expr
        if set(agent) != {"topolet_info"}:
            assert f"on (cluster, job, instance) group_left ({NODE_LABEL}) " in expr, expr
        assert "group_left (node)" not in expr, expr  # a scrape config's target label, not ours


def test_every_query_parses() -> None:
    """promtool parses each query (as a recording rule) with its variables filled as Grafana does."""
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool is not installed (make deps installs Debian's prometheus)")
    assert promtool is not None
    rules = [{"record": f"dashboard:query{i}", "expr": substitute(expr)}
             for i, (_, _, expr) in enumerate(all_exprs())]
    done = _promtool([promtool, "check", "rules"], {"groups": [{"name": "dashboards", "rules": rules}]})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def test_every_metric_named_is_exported() -> None:
    exported = {s for series in (*agent_families().values(), *controller_families().values()) for s in series}
    known = exported | set(KUBE_STATE_METRICS) | set(PROMETHEUS_SERIES)
    assert used_names() <= known, used_names() - known


@pytest.mark.parametrize("registry", ["agent", "controller"])
def test_every_exported_metric_is_shown_or_listed_as_not_shown(registry: str) -> None:
    exported = agent_families() if registry == "agent" else controller_families()
    used = used_names()
    hidden = {family for family, series in exported.items() if not series & used}
    listed = {family for family, series in exported.items() if series & set(DELIBERATELY_NOT_SHOWN)}
    assert hidden <= listed, f"on no panel and not in DELIBERATELY_NOT_SHOWN: {sorted(hidden - listed)}"
    assert not listed - hidden, f"in DELIBERATELY_NOT_SHOWN but on a panel: {sorted(listed - hidden)}"


def test_everything_listed_as_not_shown_is_exported() -> None:
    exported = {s for series in (*agent_families().values(), *controller_families().values()) for s in series}
    assert set(DELIBERATELY_NOT_SHOWN) <= exported, set(DELIBERATELY_NOT_SHOWN) - exported
    assert all(reason.strip() for reason in DELIBERATELY_NOT_SHOWN.values())


@pytest.mark.parametrize("name", dashboard_files())
def test_no_stat_reads_no_data(name: str) -> None:
    """A single-value panel says 0 (`or vector(0)`) or why it is empty (noValue), never 'No data'."""
    for p in panels_of(load(name)):
        if p["type"] in ("stat", "gauge", "bargauge", "table"):
            no_value = p["fieldConfig"]["defaults"].get("noValue", "")
            zero = all(t["expr"].endswith(" or vector(0)") for t in p["targets"])
            assert no_value.strip() or zero, p["title"]


@pytest.mark.parametrize("name", dashboard_files())
def test_rates_use_grafanas_intervals(name: str) -> None:
    for expr in exprs_of(load(name)):
        for window in re.findall(r"\b(?:rate|increase|changes)\([^\[]*\[([^\]]+)\]", expr):
            assert window in ("$__rate_interval", "$__range"), expr


@pytest.mark.parametrize("name", dashboard_files())
def test_tables_are_instant_tables(name: str) -> None:
    for p in panels_of(load(name)):
        if p["type"] in ("table", "bargauge"):
            for t in p["targets"]:
                assert t.get("instant") is True and t.get("range") is False, p["title"]
                if p["type"] == "table":
                    assert t["format"] == "table", p["title"]


# ---- Fleet ---------------------------------------------------------------------------------------


def health_deadline_seconds() -> float:
    """The agent's /healthz deadline with the default --reconcile-seconds (agent/kube/daemon.py)."""
    from agent.cli import build_parser

    args = build_parser().parse_args(["agent"])
    return max(3 * float(args.reconcile_seconds), 15.0)


def red_from(p: dict[str, Any]) -> float:
    (red,) = [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["color"] == "red"]
    assert isinstance(red, (int, float))
    return float(red)


def test_fleet_compares_agents_expected_up_and_reporting() -> None:
    fleet = load(FLEET)
    expected = selectors(panel(fleet, "Agents expected")["targets"][0]["expr"])
    assert [m for m, _ in expected] == ["kube_daemonset_status_desired_number_scheduled"]
    assert expected[0][1]["daemonset"] == "=topolet-agent"
    missing = panel(fleet, "Agents missing")["targets"][0]["expr"]
    assert {m for m, _ in selectors(missing)} == {"kube_daemonset_status_desired_number_scheduled", "up"}
    assert "up{" in panel(fleet, "Agents down")["targets"][0]["expr"] and "== 0" in missing + \
        panel(fleet, "Agents down")["targets"][0]["expr"]
    for title in ("Agents missing", "Agents down", "Agents stale"):
        assert red_from(panel(fleet, title)) == 1, title


def test_stale_means_older_than_the_healthz_deadline() -> None:
    deadline = health_deadline_seconds()
    fleet = load(FLEET)
    (stale,) = panel(fleet, "Agents stale")["targets"]
    assert f") > {deadline:g}) or vector(0)" in stale["expr"]
    title = "Seconds since last reconcile"
    for dashboard in (fleet, load(NODE)):
        p = panel(dashboard, title)
        # The age when last scraped, as the stale alert measures it: `time() - x` grows between
        # scrapes and would show a healthy agent red at any scrape interval above the deadline.
        assert "(timestamp(topolet_last_reconcile_timestamp_seconds{" in p["targets"][0]["expr"]
        assert p["fieldConfig"]["defaults"]["unit"] == "s"
        assert red_from(p) == deadline, title


def test_fleet_shows_enforcement_mig_state_and_versions() -> None:
    fleet = load(FLEET)
    (off,) = panel(fleet, "Enforcement off")["targets"]
    assert ('enforcement="off"' in off["expr"]) and off["expr"].startswith("count(")
    # Every mode by node count, the kubelet's static CPU manager's stand-down among them.
    by_mode = panel(fleet, "Enforcement")
    assert by_mode["targets"][0]["expr"].startswith("count by (enforcement) (topolet_info{")
    (column,) = [o for o in by_mode["fieldConfig"]["overrides"] if o["matcher"]["options"] == "enforcement"]
    (modes,) = [prop["value"] for prop in column["properties"] if prop["id"] == "mappings"]
    from agent.kube.daemon import KUBELET_STATIC

    assert set(modes[0]["options"]) == {"on", "off", KUBELET_STATIC}
    versions = panel(fleet, "Versions")
    assert versions["type"] == "table"
    assert versions["targets"][0]["expr"].startswith("count by (version) (topolet_info{")
    mig = panel(fleet, "MIG config state")
    assert "topolet_mig_config_state{" in mig["targets"][0]["expr"]
    from agent.metrics.registry import MIG_CONFIG_STATES

    (state,) = [o for o in mig["fieldConfig"]["overrides"] if o["matcher"]["options"] == "state"]
    (mappings,) = [prop["value"] for prop in state["properties"] if prop["id"] == "mappings"]
    assert set(mappings[0]["options"]) == set(MIG_CONFIG_STATES)


# ---- Node ----------------------------------------------------------------------------------------


def test_node_pin_latency_shows_the_100ms_target() -> None:
    p = panel(load(NODE), "Pin latency")
    quantiles = {float(q) for t in p["targets"]
                 for q in re.findall(r"histogram_quantile\(([0-9.]+),", t["expr"])}
    assert 0.99 in quantiles
    assert all("topolet_pin_latency_seconds_bucket{" in t["expr"] for t in p["targets"])
    assert red_from(p) == 0.1
    assert p["fieldConfig"]["defaults"]["unit"] == "s"
    assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"
    slow = panel(load(NODE), "Pins slower than 100 ms")
    assert 'le="0.1"' in slow["targets"][0]["expr"] and red_from(slow) == 0.01  # p99 under 100 ms


def test_node_cpu_panels_split_by_state_and_numa_node() -> None:
    from agent.metrics.registry import CPU_STATES

    node = load(NODE)
    by_state = panel(node, "CPUs by state")
    assert "sum by (state) (" in by_state["targets"][0]["expr"]
    assert {o["matcher"]["options"] for o in by_state["fieldConfig"]["overrides"]} == set(CPU_STATES)
    by_numa = panel(node, "CPUs by NUMA node and state")["targets"][0]["expr"]
    assert f"sum by ({NODE_LABEL}, numa, state) (" in by_numa
    headroom = panel(node, "Shared pool headroom")
    assert headroom["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert 'state="shared"' in headroom["targets"][0]["expr"]


def test_node_allocation_results_and_refusal_reasons_are_the_agents() -> None:
    from agent.metrics.registry import Metrics

    registry = Metrics().registry
    node = load(NODE)
    results = panel(node, "Allocations by result")
    assert "sum by (result) (" in results["targets"][0]["expr"]
    coloured = {o["matcher"]["options"] for o in results["fieldConfig"]["overrides"]}
    assert coloured == label_values(registry, "topolet_allocations", "result")
    assert coloured >= {"allocated", "refused", "released", "error"}
    refusals = panel(node, "Refusals by reason")
    assert "sum by (reason) (" in refusals["targets"][0]["expr"]
    assert label_values(registry, "topolet_allocation_refusals", "reason")
    errors = panel(node, "Allocation errors")
    assert 'result="error"' in errors["targets"][0]["expr"]


def test_node_footprint_shows_the_targets() -> None:
    node = load(NODE)
    rss = panel(node, "Memory (RSS)")
    assert rss["fieldConfig"]["defaults"]["unit"] == "bytes" and red_from(rss) == 60 * 1024 * 1024
    cpu = panel(node, "CPU")
    (cpu_expr,) = [t["expr"] for t in cpu["targets"]]
    assert "rate(process_cpu_seconds_total{" in cpu_expr and "* 1000" in cpu_expr
    assert red_from(cpu) == 5  # millicores idle
    assert "process_open_fds{" in panel(node, "Open file descriptors")["targets"][0]["expr"]


# ---- Cluster capacity (the admission controller) -------------------------------------------------


def find_panel(dashboard: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    return [p for p in panels_of(dashboard) if any(metric in t["expr"] for t in p["targets"])]


def test_capacity_queries_every_controller_series() -> None:
    prefix = "topolet_admission_"
    used = {m for e in exprs_of(load(CAPACITY)) for m, _ in selectors(e) if m.startswith(prefix)}
    exported = {s for family, series in controller_families().items() if family.startswith(prefix)
                for s in series if not s.endswith(("_sum", "_count"))}
    assert used == exported, {"extra": used - exported, "missing": exported - used}


def test_capacity_label_values_are_the_controllers() -> None:
    """The label values the panels select or colour by are the ones the controller sets."""
    from agent.admission.report.metrics import DECISION_RESULTS, FREE_RESOURCES, NODE_STATES

    dashboard = load(CAPACITY)
    free = re.compile(r'topolet_admission_cluster_free\{[^}]*resource="([^"]+)"')
    assert {r for e in exprs_of(dashboard) for r in free.findall(e)} == set(FREE_RESOURCES)
    (decisions,) = find_panel(dashboard, "topolet_admission_decisions_total")
    assert {o["matcher"]["options"] for o in decisions["fieldConfig"]["overrides"]} == set(DECISION_RESULTS)
    (nodes,) = find_panel(dashboard, "topolet_admission_nodes")
    assert {o["matcher"]["options"] for o in nodes["fieldConfig"]["overrides"]} == set(NODE_STATES)


def test_capacity_panels_say_what_the_issue_asks() -> None:
    dashboard = load(CAPACITY)
    (decisions,) = find_panel(dashboard, "topolet_admission_decisions_total")
    expr, reused = [t["expr"] for t in decisions["targets"]]
    assert "sum by (result) (rate(" in expr
    assert "sum(rate(topolet_admission_refusals_reused_total{" in reused  # beside them, the same unit
    assert decisions["fieldConfig"]["defaults"]["unit"] == "ops"

    (latency,) = find_panel(dashboard, "topolet_admission_decision_duration_seconds_bucket")
    quantiles = {float(q) for t in latency["targets"] if "decision_duration" in t["expr"]
                 for q in re.findall(r"histogram_quantile\(([0-9.]+),", t["expr"])}
    assert quantiles == {0.5, 0.99}
    (passes,) = [t for t in latency["targets"] if "admission_pass_duration_seconds_bucket" in t["expr"]]
    assert passes["expr"].startswith("histogram_quantile(0.99,") and passes["legendFormat"] == "pass p99"
    defaults = latency["fieldConfig"]["defaults"]
    assert defaults["unit"] == "s"
    assert red_from(latency) > 0
    assert defaults["custom"]["thresholdsStyle"]["mode"] != "off"

    (fragmentation,) = find_panel(dashboard, "topolet_admission_fragmentation_ratio")
    assert fragmentation["type"] == "gauge"
    defaults = fragmentation["fieldConfig"]["defaults"]
    assert (defaults["unit"], defaults["min"], defaults["max"]) == ("percentunit", 0, 1)

    free = find_panel(dashboard, "topolet_admission_cluster_free")
    shown = {r for p in free for t in p["targets"] if "topolet_admission_cluster_free" in t["expr"]
             for r in re.findall(r'resource="([^"]+)"', t["expr"])}
    assert shown == {"cpu", "memory", "nvidia.com/gpu"}
    (memory,) = [p for p in free if any('resource="memory"' in t["expr"] for t in p["targets"])]
    assert memory["fieldConfig"]["defaults"]["unit"] == "bytes"

    assert any("by (queue)" in t["expr"] for p in find_panel(dashboard, "topolet_admission_queue_depth")
               for t in p["targets"])
    assert any("by (state)" in t["expr"] for p in find_panel(dashboard, "topolet_admission_nodes")
               for t in p["targets"])
    assert find_panel(dashboard, "topolet_admission_ledger_entries")
    assert find_panel(dashboard, "topolet_admission_largest_free_zone")
    # Which replica leads: by instance, among the replicas the dashboard's variable selects.
    assert any("{{instance}}" == t["legendFormat"] for p in find_panel(dashboard, "topolet_admission_leader")
               for t in p["targets"])
    # Free CPUs per NUMA zone, from the agents' shared pools.
    zones = panel(dashboard, "Free CPUs by NUMA zone")["targets"][0]["expr"]
    assert f"sum by ({NODE_LABEL}, numa) (topolet_cpus{{" in zones and 'state="shared"' in zones
    # Free GPUs per NUMA zone and free MIG devices by profile and zone, from the agents.
    from agent.metrics.registry import GPU_STATES

    gpu_panels = (("Free GPUs by NUMA zone", "topolet_gpus", "numa"),
                  ("Free MIG devices by profile and zone", "topolet_mig_devices", "numa, profile"))
    for title, family, by in gpu_panels:
        found = panel(dashboard, title)
        (expr,) = [t["expr"] for t in found["targets"]]
        assert f"sum by ({NODE_LABEL}, {by}) ({family}{{" in expr and 'state="free"' in expr, expr
        assert "free" in GPU_STATES and expr.endswith(" or on () vector(0)"), expr
        defaults = found["fieldConfig"]["defaults"]
        assert (defaults["unit"], defaults["min"], defaults["decimals"]) == ("none", 0, 0), title


def test_capacity_gauges_count_the_leader_only() -> None:
    """Both replicas may export the cluster gauges; summing them would count the cluster twice."""
    leader_only = ("topolet_admission_queue_depth", "topolet_admission_cluster_free",
                   "topolet_admission_largest_free_zone", "topolet_admission_fragmentation_ratio",
                   "topolet_admission_nodes", "topolet_admission_ledger_entries",
                   "topolet_admission_last_pass_timestamp_seconds")
    for expr in exprs_of(load(CAPACITY)):
        if any(metric in expr for metric in leader_only):
            assert "and on (cluster, job, instance) (topolet_admission_leader{" in expr, expr
            assert "== 1)" in expr, expr


def test_capacity_replica_selectors_follow_the_replica_picker() -> None:
    for expr in exprs_of(load(CAPACITY)):
        for metric, matchers in selectors(expr):
            if matchers.get("job") == "=~$job":
                assert matchers.get("instance") == "=~$instance", (metric, expr)


# ---- the queries over a fleet in trouble (promtool test rules) -----------------------------------

# Agents scraped every 15 s for 10 minutes: a is healthy; b's process died at 5 min (up 0, its
# series stale); c's loop stuck at 2 min with pinning off and a failed MIG config; d never reported
# anything; e was replaced on its node at 2.5 min (a rollout: a new pod, a new instance).
# Two kube-state-metrics replicas say the DaemonSet wants 5. Evaluated at 9 min 50 s.
_FLEET = [
    ('up{job="topolet-agent", instance="a:9470"}', "1x40"),
    ('up{job="topolet-agent", instance="b:9470"}', "1x20 0x19"),
    ('up{job="topolet-agent", instance="c:9470"}', "1x40"),
    ('up{job="topolet-agent", instance="e-old:9470"}', "1x10 stale"),
    ('up{job="topolet-agent", instance="e-new:9470"}', "_x10 1x29"),
    ('up{job="some-other-job", instance="x:9100"}', "0x40"),
    ('kube_daemonset_status_desired_number_scheduled{job="kube-state-metrics", namespace="topolet-system", '
     'daemonset="topolet-agent"}', "5x40"),
    ('kube_daemonset_status_desired_number_scheduled{job="kube-state-metrics", namespace="topolet-system", '
     'daemonset="topolet-agent", instance="ksm-replica-2"}', "5x40"),
    ('topolet_info{job="topolet-agent", instance="a:9470", nodename="n1", enforcement="on", version="1"}',
     "1x40"),
    ('topolet_info{job="topolet-agent", instance="b:9470", nodename="n2", enforcement="on", version="1"}',
     "1x20 stale"),
    ('topolet_info{job="topolet-agent", instance="c:9470", nodename="n3", enforcement="off", version="0"}',
     "1x40"),
    ('topolet_info{job="topolet-agent", instance="e-old:9470", nodename="n5", enforcement="on", version="1"}',
     "1x10 stale"),
    ('topolet_info{job="topolet-agent", instance="e-new:9470", nodename="n5", enforcement="on", version="1"}',
     "_x10 1x29"),
    ('topolet_last_reconcile_timestamp_seconds{job="topolet-agent", instance="a:9470"}', "0+15x40"),
    ('topolet_last_reconcile_timestamp_seconds{job="topolet-agent", instance="e-old:9470"}', "0+15x10 stale"),
    ('topolet_last_reconcile_timestamp_seconds{job="topolet-agent", instance="e-new:9470"}',
     "_x10 150+15x29"),
    ('topolet_last_reconcile_timestamp_seconds{job="topolet-agent", instance="b:9470"}', "0+15x20 stale"),
    ('topolet_last_reconcile_timestamp_seconds{job="topolet-agent", instance="c:9470"}', "0+15x8 120x31"),
    *((f'topolet_allocations_total{{job="topolet-agent", instance="{i}:9470", result="{r}"}}', "0x40")
      for i in "ac" for r in ("allocated", "refused", "released", "error")),
    *((f'topolet_mig_config_state{{job="topolet-agent", instance="c:9470", state="{s}"}}', v)
      for s, v in (("pending", "0x40"), ("success", "0x40"), ("failed", "1x40"))),
]
# The labels of a, b and c's series named by node.
A_, B_, C_, _, E_ = (f'{{instance="{i}:9470", job="topolet-agent", nodename="n{n}"}}'
                     for n, i in enumerate(("a", "b", "c", "d", "e-new"), 1))
# (dashboard, panel title, [(labels, value)] the panel's first query returns at 9 min 50 s)
_SHOWS: list[tuple[str, str, list[tuple[str, float]]]] = [
    (FLEET, "Agents expected", [("{}", 5)]),
    (FLEET, "Agents up", [("{}", 3)]),
    (FLEET, "Agents missing", [("{}", 2)]),  # b is down and d never started
    (FLEET, "Agents down", [("{}", 1)]),
    (FLEET, "Agents gone quiet", [("{}", 1)]),  # b; e's node has its new agent
    (FLEET, "Agents stale", [("{}", 1)]),  # c: alive, its last reconcile 465 s old at its last scrape
    (FLEET, "Enforcement off", [("{}", 1)]),
    (FLEET, "Allocation errors", [("{}", 0)]),  # 0, not 'No data'
    (FLEET, "API write errors", [("{}", 0)]),  # no series at all yet: still 0
    (FLEET, "Seconds since last reconcile", [(A_, 0), (C_, 465), (E_, 0)]),  # as of each last scrape
    (FLEET, "Agent up by node", [(A_, 1), (B_, 0), (C_, 1), (E_, 1)]),
    (FLEET, "Agents gone quiet by node", [('{nodename="n2"}', 290)]),  # b's last reconcile: 5 min
    (FLEET, "Enforcement", [('{enforcement="off"}', 1), ('{enforcement="on"}', 2)]),
    (FLEET, "Versions", [('{version="0"}', 1), ('{version="1"}', 2)]),
    (FLEET, "MIG config state", [(C_.replace("}", ', state="failed"}'), 1)]),
    (NODE, "Agent up", [(A_, 1), (B_, 0), (C_, 1), (E_, 1)]),
    (NODE, "Enforcement", [('{instance="a:9470", job="topolet-agent", nodename="n1", enforcement="on", '
                            'version="1"}', 1),
                           ('{instance="c:9470", job="topolet-agent", nodename="n3", enforcement="off", '
                            'version="0"}', 0),
                           ('{instance="e-new:9470", job="topolet-agent", nodename="n5", enforcement="on", '
                            'version="1"}', 1)]),
    (NODE, "Allocation errors", [("{}", 0)]),
    (NODE, "MIG config state", [(C_, 3)]),
]


def _promtool(command: list[str], document: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="topolet-dash-") as tmp:
        path = Path(tmp) / "input.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=120, check=False)


def evaluate(series: list[tuple[str, str]], shows: list[tuple[str, str, list[tuple[str, float]]]],
             job: str) -> None:
    """`promtool test rules`: each panel's first query returns what `shows` says over `series`."""
    promtool = shutil.which("promtool")
    require(promtool is not None, "promtool is not installed (make deps installs Debian's prometheus)")
    assert promtool is not None
    cases = [{"expr": substitute(panel(load(name), title)["targets"][0]["expr"], job), "eval_time": "590s",
              "exp_samples": [{"labels": labels, "value": value} for labels, value in samples]}
             for name, title, samples in shows]
    document = {"rule_files": [], "evaluation_interval": "15s",
                "tests": [{"interval": "15s", "input_series": [{"series": s, "values": v} for s, v in series],
                           "promql_expr_test": cases}]}
    done = _promtool([promtool, "test", "rules"], document)
    assert done.returncode == 0, done.stdout + done.stderr


def test_panels_show_dead_stuck_and_unpinned_agents() -> None:
    """What the Fleet and Node panels return for the fleet above: trouble as values, not as blanks."""
    evaluate(_FLEET, _SHOWS, AGENT_JOB)


# Two controller replicas, r1 leading; both export the cluster gauges, with different figures. One
# agent reports its shared CPUs on two NUMA nodes.
_CONTROLLERS = [
    ('up{job="topolet-controller", instance="r1:9471"}', "1x40"),
    ('up{job="topolet-controller", instance="r2:9471"}', "1x40"),
    ('topolet_admission_leader{job="topolet-controller", instance="r1:9471"}', "1x40"),
    ('topolet_admission_leader{job="topolet-controller", instance="r2:9471"}', "0x40"),
    ('topolet_admission_last_pass_timestamp_seconds{job="topolet-controller", instance="r1:9471"}',
     "0+15x40"),
    ('topolet_admission_last_pass_timestamp_seconds{job="topolet-controller", instance="r2:9471"}', "0x40"),
    ('topolet_admission_cluster_free{job="topolet-controller", instance="r1:9471", resource="cpu"}', "10x40"),
    ('topolet_admission_cluster_free{job="topolet-controller", instance="r2:9471", resource="cpu"}', "12x40"),
    ('topolet_admission_fragmentation_ratio{job="topolet-controller", instance="r1:9471"}', "0.25x40"),
    ('topolet_admission_fragmentation_ratio{job="topolet-controller", instance="r2:9471"}', "0.5x40"),
    ('topolet_info{job="topolet-agent", instance="a:9470", nodename="n1", enforcement="on", version="1"}',
     "1x40"),
    ('topolet_cpus{job="topolet-agent", instance="a:9470", numa="0", state="shared"}', "3x40"),
    ('topolet_cpus{job="topolet-agent", instance="a:9470", numa="1", state="shared"}', "5x40"),
    ('topolet_cpus{job="topolet-agent", instance="a:9470", numa="1", state="exclusive"}', "4x40"),
    ('topolet_gpus{job="topolet-agent", instance="a:9470", numa="0", state="free"}', "3x40"),
    ('topolet_gpus{job="topolet-agent", instance="a:9470", numa="0", state="allocated"}', "1x40"),
    ('topolet_gpus{job="topolet-agent", instance="a:9470", numa="1", state="free"}', "4x40"),
    ('topolet_gpus{job="topolet-agent", instance="a:9470", numa="1", state="allocated"}', "0x40"),
    ('topolet_mig_devices{job="topolet-agent", instance="a:9470", numa="0", profile="1g.10gb", state="free"}',
     "6x40"),
    ('topolet_mig_devices{job="topolet-agent", instance="a:9470", numa="0", profile="1g.10gb", '
     'state="allocated"}', "1x40"),
    ('topolet_mig_devices{job="topolet-agent", instance="a:9470", numa="1", profile="3g.40gb", state="free"}',
     "2x40"),
]
_CAPACITY_SHOWS: list[tuple[str, str, list[tuple[str, float]]]] = [
    (CAPACITY, "Replicas leading", [("{}", 1)]),
    (CAPACITY, "Controllers up", [("{}", 2)]),
    (CAPACITY, "Seconds since last decision pass", [("{}", 5)]),  # the leader's, not the standby's
    (CAPACITY, "Free CPUs", [("{}", 10)]),  # the leader's figure, not the sum of both
    (CAPACITY, "Fragmentation", [("{}", 0.25)]),
    (CAPACITY, "Pods patched", [("{}", 0)]),
    (CAPACITY, "Free CPUs by NUMA zone", [('{nodename="n1", numa="0"}', 3),
                                          ('{nodename="n1", numa="1"}', 5)]),
    (CAPACITY, "Free GPUs by NUMA zone", [('{nodename="n1", numa="0"}', 3),
                                          ('{nodename="n1", numa="1"}', 4)]),  # no 0 beside them
    (CAPACITY, "Free MIG devices by profile and zone", [('{nodename="n1", numa="0", profile="1g.10gb"}', 6),
                                                        ('{nodename="n1", numa="1", profile="3g.40gb"}', 2)]),
]
# An agent on a node without GPUs: it exports neither GPU family.
_NO_GPUS = [s for s in _CONTROLLERS if not s[0].startswith(("topolet_gpus", "topolet_mig_devices"))]
_NO_GPUS_SHOWS: list[tuple[str, str, list[tuple[str, float]]]] = [
    (CAPACITY, "Free GPUs by NUMA zone", [("{}", 0)]),  # 0, not 'No data'
    (CAPACITY, "Free MIG devices by profile and zone", [("{}", 0)]),
]


def test_capacity_panels_count_the_leader_once() -> None:
    evaluate(_CONTROLLERS, _CAPACITY_SHOWS, CONTROLLER_JOB)


def test_gpu_panels_read_0_without_gpus() -> None:
    evaluate(_NO_GPUS, _NO_GPUS_SHOWS, CONTROLLER_JOB)
