"""Which tests may run side by side: `make test` runs pytest on both cores (pytest-xdist), one group of
tests after another on each core.

A group is a test file (its module fixtures set up once), or a lane: tests that share a part of this
machine no test can make its own, one after another.  `lane_of` is the policy, `ordered` puts the
lanes and the long files first, so that the last group to start is a short one.  tests/conftest.py
hands both to xdist: its scheduler groups test ids by `lane_of` (xdist's own `loadgroup` marks are lost
on pytest 9.2, pytest-xdist#1386), and the collection comes `ordered`.
"""

from __future__ import annotations

from collections.abc import Sequence

# (test id prefix, lane): the real node keeps the kubelet's device-plugin folder at the fixed
# /var/lib/kubelet/device-plugins (tests/realnode/node.py); a TCG guest takes a whole core, and two at once
# would starve the host's API server each one's node talks to (tests/vm).  A test elsewhere that starts
# either gets a line here (`test_every_test_has_one_group_and_real_nodes_share_a_lane` checks the first).
# The MPI operator binds port 8080 on every interface (tests/controlplane/operators.py): one worker at a
# time runs the training operators (other test sessions on the machine wait for their turn on its lock).
# Within a lane, tests run in collection order: tests/bench/test_bench_smoke.py's kueue.py (the bench
# starts its own operators in a subprocess) must come before any test taking the `operators` fixture,
# which holds the MPI operator's lock for the rest of the session; so operator tests live in folders
# that sort after tests/bench/ (`test_the_kueue_bench_smoke_runs_first_in_the_operators_lane`).
REALNODE, GUEST, OPERATORS = "realnode", "guest", "operators"
LANES: tuple[tuple[str, str], ...] = (
    ("tests/vm/", GUEST),
    ("tests/realnode/", REALNODE),
    ("tests/controlplane/test_operators.py", OPERATORS),
    ("tests/kueue/test_native_training_e2e.py", OPERATORS),
    ("tests/kueue/test_training_e2e.py", OPERATORS),
    ("tests/kueue/test_training_fields.py", OPERATORS),
    ("tests/bench/test_bench_smoke.py::test_bench_runs_at_its_smallest_size[kueue.py]", OPERATORS),
    ("tests/bench/test_bench_smoke.py::test_bench_runs_at_its_smallest_size[kube.py--real-node]", REALNODE),
)

# Groups of several minutes each (measured: `make test` prints the slowest with --durations), started
# first in this order after the lanes; everything else follows in collection order.
LONG_FIRST: tuple[str, ...] = (
    GUEST,
    REALNODE,
    "tests/image/",
    "tests/bench/",
    "tests/kueue/",
    "tests/chart/",
)


def lane_of(nodeid: str) -> str:
    """The group of the test `nodeid` (`path::name[params]`): its lane, else its file."""
    for prefix, lane in LANES:
        if nodeid.startswith(prefix):
            return lane
    return nodeid.partition("::")[0]


def rank(group: str) -> int:
    """Where `group` starts: the index of the first LONG_FIRST entry it is or begins with, else after
    all of them."""
    for at, first in enumerate(LONG_FIRST):
        if group == first or group.startswith(first):
            return at
    return len(LONG_FIRST)


def ordered(groups: Sequence[str]) -> list[int]:
    """The indexes of `groups` (one per test, in collection order) with the long groups first: stable,
    so that each group keeps its tests' order."""
    return sorted(range(len(groups)), key=lambda i: rank(groups[i]))
