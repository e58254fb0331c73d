"""tests/lanes.py: which tests `make test` may run side by side on its two pytest workers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.lanes import GUEST, LONG_FIRST, OPERATORS, REALNODE, lane_of, ordered, rank


@pytest.mark.parametrize(("nodeid", "group"), [
    ("tests/vm/test_guest_enforce.py::test_x", GUEST),
    ("tests/vm/test_guest_realnode.py::test_y[a-b]", GUEST),
    ("tests/realnode/test_realnode.py::test_z", REALNODE),
    ("tests/realnode/sub/test_w.py::C::test_v[p]", REALNODE),
    ("tests/kube/test_nrt.py::test_a[x]", "tests/kube/test_nrt.py"),
    ("tests/kube/test_nrt.py::Cls::test_b", "tests/kube/test_nrt.py"),
    ("tests/test_layers.py::test_c", "tests/test_layers.py"),
    # a path that merely names a lane is a file of its own
    ("tests/kube/test_realnode_like.py::test_d", "tests/kube/test_realnode_like.py"),
    ("tests/vmx/test_e.py::test_f", "tests/vmx/test_e.py"),
])
def test_a_test_runs_in_its_lane_else_with_its_file(nodeid: str, group: str) -> None:
    assert lane_of(nodeid) == group


def test_the_lanes_start_first_then_the_long_folders_in_their_order() -> None:
    assert rank(GUEST) < rank(REALNODE) < rank("tests/image/test_image.py") < rank("tests/bench/test_x.py")
    assert rank("tests/kube/test_nrt.py") == rank("tests/test_layers.py") == len(LONG_FIRST)


def test_ordering_is_stable_and_keeps_each_group_together() -> None:
    groups = ["tests/a.py", "tests/a.py", REALNODE, "tests/image/test_i.py", GUEST, "tests/b.py", REALNODE,
              GUEST]
    order = ordered(groups)
    assert sorted(order) == list(range(len(groups)))
    assert [groups[i] for i in order] == [GUEST, GUEST, REALNODE, REALNODE, "tests/image/test_i.py",
                                         "tests/a.py", "tests/a.py", "tests/b.py"]
    assert order[:2] == [4, 7] and order[-3:] == [0, 1, 5]  # each group's own order kept


def test_nothing_to_order() -> None:
    assert ordered([]) == []


REALNODE_FIXTURES = {"realnode_parts", "realnode_cluster"}  # what every real node of tests/realnode needs


def test_every_test_that_starts_a_real_node_is_in_its_lane(request: pytest.FixtureRequest) -> None:
    for item in request.session.items:
        if REALNODE_FIXTURES & set(getattr(item, "fixturenames", ())):
            assert lane_of(item.nodeid) == REALNODE, item.nodeid


def test_every_test_that_starts_the_operators_is_in_their_lane(request: pytest.FixtureRequest) -> None:
    users = [item.nodeid for item in request.session.items
             if "operators" in getattr(item, "fixturenames", ())]
    assert all(lane_of(nodeid) == OPERATORS for nodeid in users), users


def test_the_real_node_bench_is_in_the_real_node_lane() -> None:
    from tests.bench.test_bench_smoke import BENCHES

    real = [p.id for p in BENCHES if "--real-node" in p.values[0].args]
    assert real and all(
        lane_of(f"tests/bench/test_bench_smoke.py::test_bench_runs_at_its_smallest_size[{i}]") == REALNODE
        for i in real)


def test_the_kueue_bench_runs_the_operators_in_their_lane() -> None:
    from tests.bench.test_bench_smoke import BENCHES

    (kueue,) = [p for p in BENCHES if p.values[0].script == "kueue.py"]
    assert "--kinds" not in kueue.values[0].args  # every kind: the operators start
    nodeid = f"tests/bench/test_bench_smoke.py::test_bench_runs_at_its_smallest_size[{kueue.id}]"
    assert lane_of(nodeid) == OPERATORS


def test_two_workers_run_a_lane_on_one_of_them() -> None:
    # A real xdist run of a lane's tests beside a file's: each lane (and file) on one worker.
    lane, other = "tests/realnode/test_remote.py", "tests/labels/test_registry.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-v", "--no-loadscope-reorder",
         lane, other], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", done.stdout, re.M)
    workers = {path: {gw for gw, p in ran if p == path} for path in (lane, other)}
    assert all(len(w) == 1 for w in workers.values()), workers
    assert sum(p == lane for _, p in ran) >= 3


def test_the_kueue_bench_smoke_runs_first_in_the_operators_lane(request: pytest.FixtureRequest) -> None:
    """The bench starts its own operators, the MPI operator among them, in a subprocess: it must run
    before any test of this session takes the `operators` fixture, which holds the MPI operator's lock
    until the session ends (tests/lanes.py).  Within a lane tests run in collection order."""
    lane = [item.nodeid for item in request.session.items if lane_of(item.nodeid) == OPERATORS]
    users = [item.nodeid for item in request.session.items
             if "operators" in getattr(item, "fixturenames", ())]
    bench = [n for n in lane if n.startswith("tests/bench/test_bench_smoke.py::") and "kueue.py" in n]
    if not bench or not users:  # a run that collects only part of the suite
        return
    assert lane.index(bench[0]) < min(lane.index(n) for n in users), (bench, users[:3])
