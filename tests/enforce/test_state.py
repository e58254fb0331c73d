"""The state file: format, validation, atomic replacement under kill -9, locking, rebuild from cgroups."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.enforce.cgroup import CgroupLayout, create_cgroup, move_pid, read_mems
from agent.enforce.procfs import start_time
from agent.enforce.state import Allocation, Owner, State, printable
from agent.enforce.state_codec import decode, encode
from agent.enforce.state_file import KEEP_CORRUPT, StateFile
from agent.enforce.state_live import check_live, rebuild_from_cgroups
from agent.errors import StateError
from agent.topology.cpuset import CPUSet
from tests.enforce.state_writer import PERIOD, state_for

REPO = Path(__file__).resolve().parents[2]
Spawn = Callable[[], "subprocess.Popen[bytes]"]


def alloc(name: str, cpus: list[int], **kw: Any) -> Allocation:
    fields: dict[str, Any] = {
        "id": name, "cpus": CPUSet(cpus), "mems": CPUSet([0]), "cgroup": f"topolet/{name}",
        "owner": Owner(pid=100, start_time=7), "policy": "single-numa-node", "created_at": 1.0,
    }
    fields.update(kw)
    return Allocation(**fields)


# --- the documented format, built independently of the code under test ---------------------------

def _checksum(body: object) -> str:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def _alloc_json(**over: Any) -> dict[str, Any]:
    a: dict[str, Any] = {
        "id": "a", "cpus": "0-1", "mems": "0", "cgroup": "topolet/a",
        "owner": {"pid": 10, "start_time": 5, "pod_uid": None, "container": None},
        "policy": "single-numa-node", "created_at": 1.5,
    }
    a.update(over)
    return a


def _body(allocations: list[dict[str, Any]] | None = None, **over: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"generation": 3, "reserved": "7", "allocations": [_alloc_json()]}
    if allocations is not None:
        b["allocations"] = allocations
    b.update(over)
    return b


def _doc(body: object, version: object = 1, checksum: str | None = None) -> bytes:
    return json.dumps({"version": version, "checksum": checksum or _checksum(body), "body": body}).encode()


VALID = _doc(_body())
_owner = _alloc_json()["owner"]

CORRUPT: list[tuple[str, bytes]] = [
    ("garbage", b"\x00\xffnot json at all"),
    ("empty", b""),
    ("truncated", VALID[: len(VALID) // 2]),
    ("bad checksum", _doc(_body(generation=4), checksum=_checksum(_body()))),
    ("wrong version", _doc(_body(), version=2)),
    ("version as text", _doc(_body(), version="1")),
    ("no version", json.dumps({"checksum": _checksum(_body()), "body": _body()}).encode()),
    ("top level list", b"[1, 2]"),
    ("extra top-level key", json.dumps({"version": 1, "checksum": _checksum(_body()), "body": _body(),
                                        "x": 1}).encode()),
    ("CPU in two allocations",
     _doc(_body([_alloc_json(), _alloc_json(id="b", cgroup="topolet/b", cpus="1-2")]))),
    ("allocation on a reserved CPU", _doc(_body(reserved="1"))),
    ("duplicate id", _doc(_body([_alloc_json(), _alloc_json(cgroup="topolet/b", cpus="4")]))),
    ("duplicate cgroup", _doc(_body([_alloc_json(), _alloc_json(id="b", cpus="4")]))),
    ("bad cpulist", _doc(_body([_alloc_json(cpus="0-")]))),
    ("cpus not text", _doc(_body([_alloc_json(cpus=3)]))),
    ("no CPUs", _doc(_body([_alloc_json(cpus="")]))),
    ("bad reserved", _doc(_body(reserved="x"))),
    ("pid is a bool", _doc(_body([_alloc_json(owner={**_owner, "pid": True})]))),
    ("negative pid", _doc(_body([_alloc_json(owner={**_owner, "pid": -4})]))),
    ("start time without pid", _doc(_body([_alloc_json(owner={**_owner, "pid": None})]))),
    ("owner key missing", _doc(_body([_alloc_json(owner={"pid": 10})]))),
    ("extra allocation key", _doc(_body([{**_alloc_json(), "x": 1}]))),
    ("bad affinity", _doc(_body([{**_alloc_json(), "affinity": "0-"}]))),
    ("affinity not text", _doc(_body([{**_alloc_json(), "affinity": [0]}]))),
    ("cgroup escapes", _doc(_body([_alloc_json(cgroup="../etc")]))),
    ("cgroup not clean", _doc(_body([_alloc_json(cgroup="/topolet/a/")]))),
    ("bad id", _doc(_body([_alloc_json(id="a/b")]))),
    ("empty policy", _doc(_body([_alloc_json(policy="")]))),
    ("created_at not a number", _doc(_body([_alloc_json(created_at="now")]))),
    ("created_at NaN", VALID.replace(b'"created_at": 1.5', b'"created_at": NaN')),
    ("negative generation", _doc(_body(generation=-1))),
    ("generation is a bool", _doc(_body(generation=False))),
    ("allocations not a list", _doc({**_body(), "allocations": {}})),
    ("deep nesting", b"[" * 100000),
]


def test_the_documented_format_loads(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_bytes(VALID)
    s = StateFile(str(tmp_path)).load()
    assert s.generation == 3 and s.reserved == CPUSet([7])
    assert s.allocations == (
        Allocation("a", CPUSet([0, 1]), CPUSet([0]), "topolet/a", Owner(10, 5), "single-numa-node", 1.5),
    )


@pytest.mark.parametrize(("name", "data"), CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_file_is_refused_and_rebuilt(tmp_path: Path, name: str, data: bytes) -> None:
    sf = StateFile(str(tmp_path))
    (tmp_path / "state.json").write_bytes(data)
    with pytest.raises(StateError):
        sf.load()
    rebuilt = State((alloc("r", [5]),), CPUSet([0]))
    calls: list[int] = []

    def rebuild() -> State:
        calls.append(1)
        return rebuilt

    got = sf.load_or_rebuild(rebuild)
    assert calls == [1]
    assert got.allocations == rebuilt.allocations and got.reserved == rebuilt.reserved
    assert sf.load() == got
    (copy,) = sf.corrupt_copies()
    assert Path(copy).read_bytes() == data  # kept for a post-mortem


def test_missing_file(tmp_path: Path) -> None:
    sf = StateFile(str(tmp_path / "new"))
    with pytest.raises(StateError):
        sf.load()
    assert sf.load(missing_ok=True) == State()
    got = sf.load_or_rebuild(lambda: State((alloc("r", [1]),)))
    assert got.get("r") is not None and sf.load() == got
    assert sf.load_or_rebuild(lambda: pytest.fail("rebuilt a valid file")) == got


def test_commit_round_trip_generation_and_write_count(tmp_path: Path) -> None:
    seen: list[int] = []
    sf = StateFile(str(tmp_path), on_write=lambda: seen.append(1))
    s1 = sf.commit(State((alloc("a", [0, 1]),), CPUSet([3])))
    assert s1.generation == 1 and sf.load() == s1
    s2 = sf.commit(s1.with_allocation(alloc("b", [2])).without("a"))
    assert s2.generation == 2 and [a.id for a in sf.load().allocations] == ["b"]
    assert sf.writes == 2 and len(seen) == 2
    with pytest.raises(StateError):  # derived from generation 1, but 2 is on disk
        sf.commit(s1.with_allocation(alloc("c", [4])))
    assert sf.load() == s2 and sf.writes == 2
    doc = json.loads((tmp_path / "state.json").read_text())
    assert doc["version"] == 1 and doc["checksum"] == _checksum(doc["body"])
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_state_refuses_conflicts() -> None:
    s = State((alloc("a", [0, 1]),), CPUSet([5]))
    with pytest.raises(StateError):
        s.with_allocation(alloc("b", [1, 2]))  # CPU 1 twice
    with pytest.raises(StateError):
        s.with_allocation(alloc("b", [5]))  # reserved
    with pytest.raises(StateError):
        s.with_allocation(alloc("b", [3], cgroup="topolet/a"))
    assert s.with_allocation(alloc("a", [2])).get("a") == alloc("a", [2])  # replaces by id
    assert s.allocated() == CPUSet([0, 1])


_alloc_st = st.tuples(
    st.integers(0, 30), st.integers(1, 4), st.lists(st.integers(0, 7), max_size=3),
    st.none() | st.integers(1, 2**22), st.none() | st.uuids().map(str), st.floats(0, 2e9),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_alloc_st, max_size=8, unique_by=lambda t: t[0]), st.integers(0, 10**9))
def test_encode_decode_round_trip(specs: list[tuple[int, int, list[int], int | None, str | None, float]],
                                  generation: int) -> None:
    allocations = tuple(
        Allocation(f"w{i}", CPUSet(range(8 * i, 8 * i + n)), CPUSet(mems), f"topolet/w{i}",
                   Owner(pid, None, uid, "ctr" if uid else None), "best-effort", t,
                   affinity=CPUSet(mems[:1]) if uid else CPUSet())  # the pod scope's NUMA nodes
        for i, n, mems, pid, uid, t in specs
    )
    s = State(allocations, CPUSet([1000]), generation)
    assert decode(encode(s)) == s


def test_kill9_mid_rewrite_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    sf = StateFile(str(tmp_path))
    sf.commit(state_for(1))
    last = 1
    rng = random.Random(20240607)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(25):
        p = subprocess.Popen([sys.executable, "-m", "tests.enforce.state_writer", str(tmp_path)],
                             cwd=REPO, env=env, stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        # Let it rewrite for a random moment, then kill it wherever it is.
        try:
            p.wait(timeout=rng.uniform(0.0, 0.05))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert p.returncode == -signal.SIGKILL  # it was still writing: it never exits on its own
        s = sf.load()  # raises on a torn file
        assert s.generation >= last
        assert len(s.allocations) == s.generation % PERIOD
        assert all(a.policy.startswith(f"p{s.generation}-") for a in s.allocations)
        last = s.generation
    assert last > 1  # the writers did rewrite it
    sf.commit(sf.load())  # sweeps the temp files dead writers left
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_lock_excludes_other_processes(tmp_path: Path) -> None:
    sf = StateFile(str(tmp_path))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom agent.enforce.state_file import StateFile\n"
         "with StateFile(sys.argv[1]).lock():\n    print('held', flush=True)\n    time.sleep(60)\n",
         str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(StateError):
            with sf.lock(timeout=0.2):
                pass
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout:
            holder.stdout.close()
    with sf.lock(timeout=5):  # released when its holder died
        sf.commit(State())


def test_owner_tells_a_recycled_pid(spawn: Spawn) -> None:
    p = spawn()
    owner = Owner.of_process(p.pid)
    assert owner.start_time == start_time(p.pid) and owner.process_alive()
    assert not Owner(p.pid, (owner.start_time or 0) + 1).process_alive()  # same pid, other process
    p.kill()
    p.wait()
    assert not owner.process_alive()
    with pytest.raises(StateError):
        Owner.of_process(p.pid)


def test_rebuild_from_live_cgroups(
    cpuset_root: CgroupLayout, two_cpus: tuple[int, int], spawn: Spawn, tmp_path: Path
) -> None:
    layout = cpuset_root
    a, b = two_cpus
    mems = read_mems(layout, "", effective=True)
    w1 = create_cgroup(layout, layout.workload_path("w1"), cpus=CPUSet([a]), mems=mems)
    create_cgroup(layout, layout.workload_path("w2"), cpus=CPUSet([b]), mems=mems)
    create_cgroup(layout, layout.workload_path("never-set"))
    create_cgroup(layout, layout.workload_path("s", shared=True), cpus=CPUSet([a, b]), mems=mems)
    # Overlaps both (v1 lets siblings overlap): created last, it must lose every CPU.
    create_cgroup(layout, layout.workload_path("zz"), cpus=CPUSet([a, b]), mems=mems)
    p = spawn()
    move_pid(layout, w1, p.pid)

    s = rebuild_from_cgroups(layout)
    assert [x.id for x in s.allocations] == ["w1", "w2"]
    got1, got2 = s.allocations
    assert (got1.cpus, got1.mems, got1.cgroup) == (CPUSet([a]), mems, w1)
    assert got1.owner == Owner(p.pid, start_time(p.pid)) and got1.owner.process_alive()
    assert got2.cpus == CPUSet([b]) and got2.owner == Owner()

    s = rebuild_from_cgroups(layout, reserved=CPUSet([b]))
    assert [x.id for x in s.allocations] == ["w1"] and s.reserved == CPUSet([b])

    sf = StateFile(str(tmp_path))
    (tmp_path / "state.json").write_bytes(b"{")
    assert sf.load_or_rebuild(lambda: rebuild_from_cgroups(layout)).get("w1") == got1


# --- hostile files and states that the checksum cannot catch ------------------------------------

@pytest.fixture
def no_hang() -> Any:
    """Turn a read that would block forever into a test failure after 10 s."""
    def fail(_signum: int, _frame: object) -> None:
        pytest.fail("blocked reading the state file")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_state_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, no_hang: None,
                                                                     kind: str) -> None:
    path = tmp_path / "state.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "elsewhere.json").write_bytes(VALID)
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.mkdir()
    sf = StateFile(str(tmp_path))
    for call in (sf.load, lambda: sf.load_or_rebuild(State), lambda: sf.commit(State())):
        with pytest.raises(StateError, match="not a regular file|cannot read"):
            call()
    assert os.listdir(tmp_path) == [p.name for p in tmp_path.iterdir()]  # still there, untouched
    assert path.is_fifo() or path.is_symlink() or path.is_dir()


def test_every_corrupt_copy_is_kept_newest_few_and_none_before_a_commit(tmp_path: Path) -> None:
    sf = StateFile(str(tmp_path))
    path = tmp_path / "state.json"
    garbage = [f"not json {i}".encode() for i in range(KEEP_CORRUPT + 3)]
    for i, data in enumerate(garbage):
        path.write_bytes(data)
        # Deferred: nothing is written, no copy made, the corrupt file stays where it was.
        got = sf.load_or_rebuild(lambda: State((alloc("r", [5]),)), commit=False)
        assert got.get("r") is not None and path.read_bytes() == data
        assert len(sf.corrupt_copies()) == min(i, KEEP_CORRUPT)
        sf.commit(got)
        assert sf.load().get("r") is not None
        copies = sf.corrupt_copies()
        assert len(copies) == min(i + 1, KEEP_CORRUPT)
        assert [Path(c).read_bytes() for c in copies] == garbage[max(0, i + 1 - KEEP_CORRUPT):i + 1]


LIVE_CPUS = CPUSet(range(8))


@pytest.mark.parametrize(("name", "allocation", "why"), [
    ("cgroup outside topolet", _alloc_json(cgroup="system.slice/sshd.service"), "neither under topolet/"),
    ("the parent itself", _alloc_json(cgroup="topolet"), "neither under topolet/"),
    ("a look-alike parent", _alloc_json(cgroup="topolet-x/a"), "neither under topolet/"),
    ("a look-alike kubepods", _alloc_json(cgroup="notkubepods.slice/a"), "neither under topolet/"),
    ("pid 1 as owner", _alloc_json(owner={**_owner, "pid": 1}), "pid 1"),
    ("CPUs the machine lacks", _alloc_json(cpus="5,8-4095"), "CPUs 8-4095 are not on this machine"),
    ("memory nodes it lacks", _alloc_json(mems="0,9"), "memory nodes 9"),
])
def test_a_whole_but_untrue_state_is_refused_against_the_live_machine(
        tmp_path: Path, name: str, allocation: dict[str, Any], why: str) -> None:
    (tmp_path / "state.json").write_bytes(_doc(_body([allocation])))
    sf = StateFile(str(tmp_path))
    state = sf.load()  # the checksum holds
    with pytest.raises(StateError, match=why):
        check_live(state, cpus=LIVE_CPUS, mems=CPUSet([0, 1]), parent="topolet")

    def check(s: State) -> None:
        check_live(s, cpus=LIVE_CPUS, mems=CPUSet([0, 1]), parent="topolet")

    got = sf.load_or_rebuild(lambda: State(reserved=CPUSet([7])), check=check)
    assert got.allocations == () and got.generation == state.generation + 1
    (copy,) = sf.corrupt_copies()
    assert Path(copy).read_bytes() == _doc(_body([allocation]))


@pytest.mark.parametrize("cgroup", [
    "topolet/a", "kubepods/pod1234/abc", "kubepods.slice/kubepods-pod12.slice/cri-containerd-ab.scope",
    "kubelet.slice/kubepods/burstable/pod9/c1",
    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod12.slice/cri-containerd-ab.scope"])
def test_states_under_topolet_or_kubepods_pass_the_live_check(cgroup: str) -> None:
    check_live(State((alloc("a", [0, 1], cgroup=cgroup),)), cpus=LIVE_CPUS, mems=CPUSet([0]),
               parent="topolet")


def test_printable_escapes_what_a_terminal_would_act_on() -> None:
    assert printable("exec best-effort/any") == "exec best-effort/any"
    assert printable("\x1b]0;owned\x07\x1b[2J\r\nx") == "\\x1b]0;owned\\x07\\x1b[2J\\r\\nx"
    assert printable("\u202egpj.exe") == "\\u202egpj.exe"
