"""The house's floors: which room of `agent/` may import which, checked over the source with `ast`.

Data flows one way (topology → alloc → enforce → publish → admission).  Each room below lists the
rooms it may import besides itself; an import outside its row, a module in no room, or an import
circle between modules (function-level imports count: a lazy import that hides a circle is still a
circle) fails here, so the layers stay as designed.  A new room gets a row; a new dependency gets a
line in its row only when it points down.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO

AGENT = REPO / "agent"

# Every room of agent/ and the rooms it may import (its own modules always).  `agent` is the package's
# own __init__ (the version string); `agent.errors` holds the typed errors every floor raises.
BASE = {"agent", "agent.errors", "agent.api"}
API = {"agent.errors"}  # the contract both halves read: pure, below every floor
KUBEAPI = BASE | {"agent.kubeapi"}  # the Kubernetes API plumbing both halves use
TOPOLOGY = BASE | {"agent.topology", "agent._native"}
LABELS = TOPOLOGY | {"agent.labels"}
GPU = LABELS | {"agent.gpu"}
ALLOC = GPU | {"agent.alloc"}
ENFORCE = TOPOLOGY | {"agent.enforce"}
METRICS = BASE | {"agent.metrics"}
CONFIG = BASE | {"agent.config"}  # the node agent's typed configuration, built in agent.cli
PINNING = ALLOC | ENFORCE | {"agent.pinning"}  # the pinning engine both node agents share
STANDALONE = PINNING | METRICS | CONFIG | {"agent.standalone"}
NRI = BASE | {"agent.nri"}  # the runtime's Node Resource Interface: protocol only
KUBELET = GPU | {"agent.kube.kubelet"}  # the node's kubelet, through its pod-resources socket
MIG = GPU | ENFORCE | METRICS | KUBELET | {"agent.kube.mig"}
PUBLISH = MIG | KUBEAPI | CONFIG | {"agent.kube.publish"}  # labels and the NodeResourceTopology
PODS = PINNING | METRICS | NRI | KUBEAPI | {"agent.kube.pods"}  # the pod watch, the pinner, the two routes
CLEANUP = PUBLISH | ENFORCE | {"agent.kube.cleanup"}
KUBE = PODS | PUBLISH | {"agent.kube"}  # the node agent's composition (daemon) over its rooms
ENGINE: set[str] = {"agent.admission.engine", "agent.api"}
GANGS = ENGINE | {"agent.errors", "agent.api", "agent.admission.gangs"}
REPORT = GANGS | METRICS | KUBEAPI | {"agent.admission.report"}
CLUSTER = REPORT | {"agent.admission.cluster"}
JOB_ROUTE = CLUSTER | {"agent.admission.jobs"}
KUEUE_ROUTE = CLUSTER | {"agent.admission.kueue"}
CONTROLLER = JOB_ROUTE | KUEUE_ROUTE | {"agent.admission.controller"}

ROOMS: Mapping[str, set[str]] = {
    "agent": BASE,
    "agent.errors": set(),
    "agent.api": API,
    "agent.kubeapi": KUBEAPI,
    "agent._native_build": set(),
    "agent.config": CONFIG,
    "agent.topology": TOPOLOGY,
    "agent.labels": LABELS,
    "agent.gpu": GPU,
    "agent.alloc": ALLOC,
    "agent.enforce": ENFORCE,
    "agent.metrics": METRICS,
    "agent.pinning": PINNING,
    "agent.standalone": STANDALONE,
    "agent.render": STANDALONE | {"agent.render"},
    "agent.nri": NRI,
    "agent.kube": KUBE,
    "agent.kube.kubelet": KUBELET,
    "agent.kube.mig": MIG,
    "agent.kube.publish": PUBLISH,
    "agent.kube.pods": PODS,
    "agent.kube.cleanup": CLEANUP,
    "agent.admission": {"agent.admission"},  # the package's docstring only
    "agent.admission.engine": ENGINE,
    "agent.admission.gangs": GANGS,
    "agent.admission.report": REPORT,
    "agent.admission.cluster": CLUSTER,
    "agent.admission.jobs": JOB_ROUTE,
    "agent.admission.kueue": KUEUE_ROUTE,
    "agent.admission.controller": CONTROLLER,
}
# The command line sits on top of every floor.
ROOMS = {**ROOMS, "agent.cli": set(ROOMS)}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def agent_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(AGENT.rglob("*.py"))}


def room_of(module: str) -> str | None:
    """The longest room name that is `module` or a package above it."""
    best = None
    for room in ROOMS:
        if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best)):
            best = room
    return best


# Calls that import a module named by a string: `importlib.import_module(name)`, `__import__(name)`.
_IMPORT_CALLS = {"import_module", "__import__"}


def import_call(node: ast.AST) -> ast.Call | None:
    """`node` when it is a call that imports a module by name, else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return node if name in _IMPORT_CALLS else None


def imports_of(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """Every `agent…` module `path` imports, anywhere in the file, as (line, dotted name): import
    statements at any depth, and functional imports of a module named by a string literal."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        call = import_call(node)
        if call is not None:
            arg = call.args[0] if call.args else None
            names = [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            # `from agent.x import y` may name a module y; count it as such when it is one.
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            if name == "agent" or name.startswith("agent."):
                yield node.lineno, name


def resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The agent module `name` refers to (itself, or the module holding the attribute it names)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def module_graph() -> dict[str, set[str]]:
    modules = agent_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(name, modules) for _, name in imports_of(module, path)}
        graph[module] = {t for t in targets if t and t != module and not t.startswith("agent._native")}
    return graph


def test_every_module_has_a_room() -> None:
    homeless = [m for m in agent_modules() if room_of(m) is None]
    assert not homeless, f"add these to ROOMS in {__file__}: {homeless}"


def test_imports_point_down() -> None:
    modules = agent_modules()
    wrong = []
    for module, path in modules.items():
        room = room_of(module)
        assert room is not None
        allowed = ROOMS[room] | {room}
        for line, name in imports_of(module, path):
            target = resolve(name, modules) or name
            target_room = room_of(target)
            if target_room not in allowed:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {room} imports {target} ({target_room})")
    assert not wrong, "imports that break the layers:\n" + "\n".join(sorted(set(wrong)))


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of size > 1 (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# What the admission controller must never reach: the node's modules and its compiled helper.
NODE_ONLY = ("agent.kube", "agent.enforce", "agent.topology", "agent._native")


def reached_from(prefix: str) -> dict[str, str]:
    """Every agent module that importing a module under `prefix` loads (packages above each target
    included, functional imports counted), mapped to a module that imports it."""
    modules = agent_modules()
    graph = {m: {t for _, name in imports_of(m, p) if (t := resolve(name, modules) or name)}
             for m, p in modules.items()}
    by: dict[str, str] = {}
    work = [m for m in modules if m == prefix or m.startswith(prefix + ".")]
    while work:
        module = work.pop()
        for target in graph.get(module, ()):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                above = ".".join(parts[:i])
                if above not in by and (above in modules or above == target):
                    by[above] = module
                    work.append(above)
    return by


def test_controller_reaches_no_node_module() -> None:
    """The central Deployment runs without the node's code: nothing under agent.admission reaches
    agent.kube, agent.enforce, agent.topology or the C helper, directly or through another module."""
    by = reached_from("agent.admission")
    node = sorted(m for m in by if any(m == r or m.startswith(r + ".") for r in NODE_ONLY))
    assert not node, "\n".join(f"{m} <- {by[m]}" for m in node)


# Run in a process where the C helper cannot load (`import agent._native` raises ImportError).
_WITHOUT_NATIVE = "import sys; sys.modules['agent._native'] = None\n"


def test_controller_starts_without_the_c_helper() -> None:
    """The controller's command imports, and `topolet controller` parses and prints its help, in a
    process where agent._native cannot load; none of the node's modules is loaded on the way."""
    code = _WITHOUT_NATIVE + (
        "import agent.admission.controller.command\n"
        "from agent.cli.parser import build_parser\n"
        "args = build_parser().parse_args(['controller'])\n"
        "assert args.handler.__name__ == 'controller', args\n"
        "print(sorted(m for m in sys.modules if m.startswith(('agent.kube.', 'agent.enforce', "
        "'agent.topology')) or m == 'agent.kube'))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    code = _WITHOUT_NATIVE + ("from agent.cli.parser import build_parser\n"
                              "build_parser().parse_args(['controller', '--help'])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--leader-elect" in done.stdout, done.stdout


def test_no_import_circle() -> None:
    assert cycles(module_graph()) == []


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"a"}}, []),
])
def test_cycle_finder(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_every_functional_import_names_its_module() -> None:
    """An import by a computed name (`importlib.import_module(variable)`) hides an arrow from the table
    above: every such call in agent/ names its module as a string literal, which the checks read."""
    hidden = []
    for module, path in agent_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            call = import_call(node)
            if call is None:
                continue
            arg = call.args[0] if call.args else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                hidden.append(f"{path.relative_to(REPO)}:{call.lineno}: {module} imports by a computed name")
    assert not hidden, "\n".join(hidden)


def test_checker_sees_a_functional_import(tmp_path: Path) -> None:
    """An import through importlib or __import__, at any depth, counts like an import statement."""
    source = tmp_path / "probe.py"
    source.write_text("import importlib\n"
                      "def f():\n    return importlib.import_module('agent.gpu.labels')\n"
                      "def g():\n    return __import__('agent.kube.publish.nrt')\n")
    found = [name for _, name in imports_of("agent.labels.probe", source)]
    assert found == ["agent.gpu.labels", "agent.kube.publish.nrt"]


def test_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    """The checker is not vacuous: an upward import written into a scratch file is reported."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from agent.admission.controller import command\n")
    found = [name for _, name in imports_of("agent.topology.probe", source)]
    assert "agent.admission.controller.command" in found
    assert "agent.admission.controller" not in ROOMS["agent.topology"]
