"""One NUMA policy table per side: a policy's name is spelled only in the contract and the two tables.

`agent/api/policies.py` names the policies (`NumaPolicy`); `agent/alloc/policies.py` (the node's
allocator) and `agent/admission/engine/policies.py` (the admission engine) each hold one row per policy
they accept, and every other module dispatches through them or uses the enum.  Adding a policy is then
one row per side: the scan below lists every other module whose code (not its docstrings or comments)
spells a policy name as a string, and expects none.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from agent.admission.engine.policies import ENGINE_POLICIES, engine_policy
from agent.alloc.policies import ALLOC_POLICIES
from agent.api.policies import ALLOC_NUMA_POLICIES, POD_SET_NUMA_POLICIES, NumaPolicy
from tests.conftest import REPO

AGENT = REPO / "agent"
# "none" is every other field's word for nothing too: the scan looks for the unmistakable names.
POLICY_NAMES = frozenset({NumaPolicy.SINGLE_NUMA_NODE.value, NumaPolicy.RESTRICTED.value,
                          NumaPolicy.BEST_EFFORT.value, NumaPolicy.SPREAD.value})
TABLES = frozenset({"agent/api/policies.py", "agent/alloc/policies.py", "agent/admission/engine/policies.py"})


def policy_strings(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) of each string constant in `source`'s code that is a policy name; a string that
    stands alone as a statement (a docstring, or one documenting the line above) does not count."""
    tree = ast.parse(source)
    documents = {id(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in POLICY_NAMES
                and id(node) not in documents):
            yield node.lineno, node.value


def test_scan_sees_code_not_documentation() -> None:
    source = '''"""Module: "single-numa-node" in a docstring."""
X = "restricted"
def f(p: str = "spread") -> bool:
    """'best-effort' documented."""
    return p in ("best-effort",)  # "single-numa-node" in a comment
'''
    assert sorted(policy_strings(source)) == [(2, "restricted"), (3, "spread"), (5, "best-effort")]


def test_no_module_outside_the_tables_names_a_policy() -> None:
    found: dict[str, list[str]] = {}
    for path in sorted(AGENT.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in TABLES:
            continue
        hits = [f"{line}: {name!r}" for line, name in policy_strings(Path(path).read_text())]
        if hits:
            found[rel] = hits
    assert found == {}, "NUMA policy names spelled outside the policy tables (use agent.api.policies):\n" \
        + "\n".join(f"{rel}: {', '.join(hits)}" for rel, hits in found.items())


def test_each_side_has_one_row_per_policy_it_accepts() -> None:
    assert set(ALLOC_POLICIES) == set(ALLOC_NUMA_POLICIES)
    assert set(ENGINE_POLICIES) == set(POD_SET_NUMA_POLICIES)
    assert set(ALLOC_POLICIES) | set(ENGINE_POLICIES) == set(NumaPolicy)


def test_rows_say_what_each_policy_does() -> None:
    single, restricted = NumaPolicy.SINGLE_NUMA_NODE, NumaPolicy.RESTRICTED
    assert {p for p, row in ALLOC_POLICIES.items() if row.strict} == {single, restricted}
    assert {p for p, row in ALLOC_POLICIES.items() if row.one_node} == {single}
    assert {p for p, row in ENGINE_POLICIES.items() if row.zoned} == {single, restricted}
    assert {p for p, row in ENGINE_POLICIES.items() if row.one_zone} == {single}
    # names the engine does not know (and a pod set's "node" before a node resolves it): node totals
    assert engine_policy("node") is engine_policy(NumaPolicy.NONE)
