"""Shared test fixtures.  Under CI=true a test whose requirement (root, cgroups, tools) is missing fails.

The test tiers (CONTRIBUTING.md, "Test tiers") are decided here: `pytest_collection_modifyitems` marks
`integration` every test that needs more than the venv, and a test of the unit tier that reaches for a
real part fails loudly instead of running.
"""

from __future__ import annotations

import bz2
import os
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from agent.cli.commands import register_label_sources
from tests.lanes import lane_of, ordered

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HWLOC_DATA = TESTS / "data" / "hwloc"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The CLI registers the label sources outside agent.labels (the GPU source) before it builds labels
# (agent/cli/commands.py); tests build agents in process without the CLI, so register them here once,
# and the labels a test sees never depend on which test module happened to import agent.gpu first.
register_label_sources()


# Hypothesis: `make unit` loads the "unit" profile (`--hypothesis-profile=unit`), a quarter of every
# property test's examples; `make test`, `make integration` and a plain pytest run keep them all.
settings.register_profile("unit", max_examples=25)


def examples(n: int) -> int:
    """A property test's own example count `n`, cut as the loaded profile cuts Hypothesis' default 100
    (to no fewer than 10): `@settings(max_examples=examples(300))`."""
    scale = settings.default.max_examples / 100
    return n if scale >= 1 else max(min(n, 10), round(n * scale))


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
SHM = Path("/dev/shm")
SHM_ROOM = 2 << 30  # all 32 dumps unpacked take about 250 MiB of memory there


def extract_dump(name: str, dest: Path) -> Path:
    """Unpack `tests/data/hwloc/dumps/<name>.tar.bz2` under dest and return its file-system root.

    bz2 in process, then `tar -x`: tarfile takes ten times as long over a dump's ten thousand files.
    Both refuse absolute and `..` member names; the dumps' only group- or other-writable modes are of
    symlinks (never used), so the tree is the one `extractall(filter="tar")` writes."""
    out = dest / name
    if not out.exists():
        data = bz2.decompress((HWLOC_DATA / "dumps" / f"{name}.tar.bz2").read_bytes())
        out.mkdir(parents=True)
        subprocess.run(["tar", "-x", "-f", "-", "-C", str(out)], input=data, check=True)
    (root,) = [p for p in out.iterdir() if p.is_dir()]
    return root


def unpacked_dump(name: str, dest: Path) -> Path:
    """`extract_dump` once per session: a later ask gets the first root, wherever that was unpacked."""
    if name not in _EXTRACTED:
        _EXTRACTED[name] = extract_dump(name, dest)
    return _EXTRACTED[name]


def _in_memory_dir() -> Path | None:
    """A fresh folder of /dev/shm when it has room (small files are written there several times faster
    than to a disk), after removing those of sessions that died before their teardown; else None."""
    if not (SHM.is_dir() and os.access(SHM, os.W_OK)):
        return None
    for old in SHM.glob("topolet-tests-*-*"):
        try:
            os.kill(int(old.name.split("-")[2]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # alive, another user's
    room = os.statvfs(SHM)
    if room.f_bavail * room.f_frsize < SHM_ROOM:
        return None
    return Path(tempfile.mkdtemp(prefix=f"topolet-tests-{os.getpid()}-", dir=SHM))


@pytest.fixture(scope="session")
def scratch_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's folder for thousands of small files (the dumps, made-up sysfs trees): in memory
    when it can be, removed at the end; else a temporary folder of pytest's."""
    shm = _in_memory_dir()
    if shm is None:
        yield tmp_path_factory.mktemp("scratch")
        return
    try:
        yield shm
    finally:
        shutil.rmtree(shm, ignore_errors=True)


@pytest.fixture(scope="session")
def dumps_dir(scratch_dir: Path) -> Path:
    """Where the session unpacks the hwloc dumps."""
    (scratch_dir / "hwloc-dumps").mkdir()
    return scratch_dir / "hwloc-dumps"


@pytest.fixture(scope="session")
def dump_root(dumps_dir: Path):  # type: ignore[no-untyped-def]
    """A function: dump name → its extracted root (cached for the session)."""
    return lambda name: unpacked_dump(name, dumps_dir)


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
    # The long lanes first (tests/lanes.py): xdist's workers hand the scheduler this order.
    items[:] = [items[i] for i in ordered([lane_of(item.nodeid) for item in items])]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`make test`'s scheduler: xdist's by-scope scheduling, a scope being the test's lane or file."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return LaneScheduling(config, log)  # type: ignore[arg-type]


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
