"""Shared test fixtures.  Under CI=true a test whose requirement (root, cgroups, tools) is missing fails.

The test tiers (CONTRIBUTING.md, "Test tiers") are decided here: `pytest_collection_modifyitems` marks
`integration` every test that needs more than the venv, and a test of the unit tier that reaches for a
real part fails loudly instead of running.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import types
from pathlib import Path

import pytest

from agent.cli.commands import register_label_sources

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HWLOC_DATA = TESTS / "data" / "hwloc"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The CLI registers the label sources outside agent.labels (the GPU source) before it builds labels
# (agent/cli/commands.py); tests build agents in process without the CLI, so register them here once,
# and the labels a test sees never depend on which test module happened to import agent.gpu first.
register_label_sources()


def require(condition: bool, reason: str) -> None:
    """Skip when `condition` is false, except under CI=true where a missing requirement is a failure;
    in a test of the unit tier a missing requirement always fails (the unit tier needs only the venv)."""
    if condition:
        return
    _in_unit_tier(reason)
    if IN_CI:
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


def writable_cpuset_hierarchy():  # type: ignore[no-untyped-def]
    """The machine's cpuset cgroup hierarchy, checked writable (a failure under CI, else a skip)."""
    from agent.enforce.cgroup import detect_layout
    from agent.errors import EnforcementError

    _in_unit_tier("writes the machine's cgroups")
    require(os.geteuid() == 0, "needs root to write cgroups")
    try:
        system = detect_layout()
    except EnforcementError as exc:
        require(False, f"needs a cpuset cgroup hierarchy: {exc}")
        raise
    require(os.access(system.root, os.W_OK), f"cpuset hierarchy {system.root} is not writable")
    return system


def topolet_bin() -> str:
    """The installed `topolet` console script (next to the running interpreter)."""
    exe = Path(sys.executable).parent / "topolet"
    return str(exe) if exe.exists() else shutil.which("topolet") or "topolet"


_EXTRACTED: dict[str, Path] = {}


def extract_dump(name: str, dest: Path) -> Path:
    """Unpack `tests/data/hwloc/dumps/<name>.tar.bz2` under dest and return its file-system root."""
    out = dest / name
    if not out.exists():
        with tarfile.open(HWLOC_DATA / "dumps" / f"{name}.tar.bz2") as tar:
            tar.extractall(out, filter="tar")
    (root,) = [p for p in out.iterdir() if p.is_dir()]
    return root


@pytest.fixture(scope="session")
def dumps_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hwloc-dumps")


@pytest.fixture(scope="session")
def dump_root(dumps_dir: Path):  # type: ignore[no-untyped-def]
    """A function: dump name → its extracted root (cached for the session)."""

    def get(name: str) -> Path:
        if name not in _EXTRACTED:
            _EXTRACTED[name] = extract_dump(name, dumps_dir)
        return _EXTRACTED[name]

    return get


# The test tiers.  A test is `integration` when its module says so (`pytestmark =
# pytest.mark.integration`) or when it, a fixture it uses (directly or through other fixtures), or a
# function or class of tests/ that one of them names, transitively, names one of these: root, the
# machine's cgroups, a build from the Go module proxy (the control plane, the cluster, Kueue, kubectl,
# helm, NRI's runtime side) or a tool of `make deps`.  The real node, the guest and the image reach
# them through the same names.  `make unit` runs the rest: `pytest -m "not integration"`.
SETUP_NAMES = frozenset({
    "geteuid", "writable_cpuset_hierarchy", "build_binaries", "build_components", "build_kubectl",
    "build_helm", "build_helm3", "build_runtime", "go_available", "start_cluster", "start_kueue",
})
SETUP_TOOLS = frozenset({"lstopo-no-graphics", "promtool", "prometheus", "qemu-system-x86_64", "debootstrap"})
UNIT_TIER_FAILURE = "integration test collected in the unit tier"

_setup_of: dict[types.CodeType, str | None] = {}


def _code_setup(code: types.CodeType, scope: dict[str, object], path: set[types.CodeType]) -> str | None:
    """The set-up `code` reaches (a name of SETUP_NAMES or SETUP_TOOLS), or None; `scope` resolves the
    names it uses, followed into the functions and classes of tests/."""
    if code in _setup_of:
        return _setup_of[code]
    if code in path:
        return None  # a cycle: whatever it reaches is found by the call that entered it first
    path.add(code)
    found: str | None = None
    for const in code.co_consts:
        if isinstance(const, str) and const in SETUP_TOOLS:
            found = const
        elif isinstance(const, types.CodeType):
            found = _code_setup(const, scope, path)
        if found:
            break
    for name in () if found else code.co_names:
        found = name if name in SETUP_NAMES else setup_reached(scope.get(name), path)
        if found:
            break
    path.discard(code)
    if found or not path:  # a miss inside a cycle may be a hit from its entry: cache misses at the top
        _setup_of[code] = found
    return found


def setup_reached(obj: object, path: set[types.CodeType] | None = None) -> str | None:
    """What set-up `obj` (a function or class of tests/, a fixture's function) reaches, or None."""
    obj = getattr(obj, "__func__", obj)
    while hasattr(obj, "__wrapped__"):  # a @contextmanager, a fixture's definition
        obj = obj.__wrapped__
    if not str(getattr(obj, "__module__", "")).startswith("tests."):
        return None
    path = set() if path is None else path
    if isinstance(obj, type):
        for member in vars(obj).values():
            found = setup_reached(member, path)
            if found:
                return found
        return None
    code = getattr(obj, "__code__", None)
    return _code_setup(code, obj.__globals__, path) if isinstance(code, types.CodeType) else None


def _fixture_setup(fixturedef: pytest.FixtureDef[object]) -> str | None:
    # An autouse fixture of the control plane's (`_apiserver_up_between_tests`) only restarts an API
    # server a test stopped: it brings nothing up for a test that never started one.
    if getattr(fixturedef, "_autouse", False):
        return None
    return setup_reached(fixturedef.func)


def needs_setup(item: pytest.Item) -> str | None:
    """Why `item` belongs to the integration tier (the test or fixture and what it reaches), or None."""
    found = setup_reached(getattr(item, "obj", None))
    if found:
        return f"the test reaches {found}"
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
        for fixturedef in defs:
            found = _fixture_setup(fixturedef)
            if found:
                return f"fixture {name} reaches {found}"
    return None


# A test parametrized over every real-machine dump unpacks and reads them all: `slow`, out of `make unit`
# (which keeps the tests over one or two of them).
REAL_MACHINES = frozenset(p.name.removesuffix(".tar.bz2") for p in (HWLOC_DATA / "dumps").glob("*.tar.bz2"))


def _sweeps_every_real_machine(items: list[pytest.Item]) -> set[str]:
    """The test functions (`module::function` ids) whose parameters cover every real-machine dump."""
    covered: dict[str, set[str]] = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        names = {v for v in params.values() if isinstance(v, str) and v in REAL_MACHINES}
        if names:
            covered.setdefault(item.nodeid.partition("[")[0], set()).update(names)
    return {test for test, names in covered.items() if names == REAL_MACHINES}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    sweeps = _sweeps_every_real_machine(items)
    for item in items:
        if item.get_closest_marker("integration") is None and needs_setup(item):
            item.add_marker(pytest.mark.integration)
        if item.nodeid.partition("[")[0] in sweeps:
            item.add_marker(pytest.mark.slow)


_running: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> object:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def _in_unit_tier(what: str) -> None:
    """Fail the running test, loudly, when it is of the unit tier and needs `what` beyond the venv."""
    if _running and _running[-1].get_closest_marker("integration") is None:
        pytest.fail(f"{UNIT_TIER_FAILURE}: {_running[-1].nodeid} needs more than the venv ({what}); "
                    "mark it `integration` (CONTRIBUTING.md, Test tiers)", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> None:
    # Before the fixture runs (and before pytest caches its outcome for its scope): a fixture that brings
    # up a real part, asked for by a test of the unit tier (`request.getfixturevalue`), fails that test.
    found = _fixture_setup(fixturedef)
    if found:
        _in_unit_tier(f"fixture {fixturedef.argname} reaches {found}")
