"""`discover --format json` text: the same bytes as `json.dumps(..., indent=1)`, without importing json."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import TopoletError
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from agent.topology.model import CPUInfo, Package
from agent.topology.report import to_data, to_json
from tests.conftest import HWLOC_DATA, topolet_bin

DUMPS = sorted(p.name[: -len(".tar.bz2")] for p in (HWLOC_DATA / "dumps").glob("*.tar.bz2"))

SCALAR = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
KEY = st.text() | st.integers() | st.floats() | st.booleans() | st.none()
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(KEY, inner, max_size=4),
    max_leaves=20,
)


@given(VALUE)
def test_any_plain_value_is_written_as_json_dumps_writes_it(value: object) -> None:
    assert to_json(value) == json.dumps(value, indent=1)


@pytest.mark.parametrize("value", [
    math.nan, math.inf, -math.inf, -0.0, 1e300, 2**70, "é\u2028\x00\"\\/", {1.5: [], True: {}, None: ()},
    [[[]], {}], {"a": [1, {"b": None}]},
])
def test_edge_values_match_json_dumps(value: object) -> None:
    assert to_json(value) == json.dumps(value, indent=1)


def test_model_values_are_written_as_their_to_data() -> None:
    info = CPUInfo("v", 6, 85, "name", frozenset({"b", "a", "é"}), False, "x86")
    shared = CPUSet([0, 1, 4])
    value = [Package(0, shared), Package(1, shared), info, (CPUSet(), CPUSet([7])), frozenset({CPUSet([2])})]
    assert to_json(value) == json.dumps(to_data(value), indent=1)


@pytest.mark.parametrize("value", [{(1, 2): 1}, {1, 2}, b"x", [object()]])
def test_what_json_refuses_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        json.dumps(value, indent=1)
    with pytest.raises(TypeError):
        to_json(value)


@pytest.mark.parametrize("name", DUMPS)
def test_discover_json_is_byte_identical_to_json_dumps_on_every_dump(dump_root, name: str) -> None:  # type: ignore[no-untyped-def]
    root = str(dump_root(name))
    p = subprocess.run([topolet_bin(), "discover", "--fsroot", root, "--format", "json"],
                       capture_output=True, timeout=60)
    try:
        topo = discover(root)
    except TopoletError:
        assert p.returncode == 2 and p.stdout == b""
        return
    assert p.returncode == 0, p.stderr
    assert p.stdout == (json.dumps(to_data(topo), indent=1) + "\n").encode()


def test_discover_json_does_not_import_json_or_re(dump_root) -> None:  # type: ignore[no-untyped-def]
    # Only what the command loads counts: an editable install's import hook may load `re` at start-up.
    code = ("import sys; before = set(sys.modules); from agent.cli import main; "
            f"rc = main(['discover', '--fsroot', {str(dump_root('16em64t-4s2c2t'))!r}, '--format', 'json']); "
            "sys.exit(rc or (3 if {'json', 're', 'argparse'} & (set(sys.modules) - before) else 0))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
