"""The picture commands end to end: `discover --format svg|png`, `status --format svg`, `status --watch`."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from agent.enforce.state import Allocation, Owner, State
from agent.enforce.state_file import StateFile
from agent.render.layout import HOLDER_FILLS, RESERVED_FILL, layout
from agent.render.svg import render_svg
from agent.render.terminal import render_frame
from agent.topology.cpuset import CPUSet
from agent.topology.discover import discover
from tests.conftest import topolet_bin
from tests.render.test_pictures import read_svg

DUMP = "32em64t-2n8c+dax+nvme+mic+dimms"
UID = "6f1c2a44-93b1-4d0e-8a52-0c1d2e3f4a5b"


def _interruptible() -> None:
    """In the child before exec: Ctrl-C's default back.  A test runner started in the background by a
    shell without job control ignores SIGINT, and an ignored signal stays ignored across exec, so the
    watch would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(*words: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([topolet_bin(), *words], capture_output=True, timeout=120, check=False)


def test_discover_svg_is_the_dumps_picture(dump_root) -> None:  # type: ignore[no-untyped-def]
    root = str(dump_root(DUMP))
    result = _run("discover", "--fsroot", root, "--format", "svg")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == render_svg(layout(discover(root)))
    boxes = read_svg(result.stdout.decode())
    assert sum(b.kind == "pu" for b in boxes.values()) == len(discover(root).cpus)


def test_discover_png_to_stdout_and_to_a_file_are_the_same_image(dump_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = str(dump_root(DUMP))
    piped = _run("discover", "--fsroot", root, "--format", "png")
    assert piped.returncode == 0, piped.stderr
    out = tmp_path / "machine.png"
    written = _run("discover", "--fsroot", root, "--format=png", "--output", str(out))
    assert written.returncode == 0 and written.stdout == b"", written.stderr
    assert out.read_bytes() == piped.stdout
    picture = layout(discover(root))
    with Image.open(io.BytesIO(piped.stdout)) as image:
        assert image.format == "PNG" and image.size == (picture.width, picture.height)


def test_discover_picture_to_an_unwritable_path_is_one_line_and_exit_2(dump_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = _run("discover", "--fsroot", str(dump_root(DUMP)), "--format", "svg",
                  "--output", str(tmp_path / "missing" / "x.svg"))
    assert result.returncode == 2
    assert result.stderr.decode().startswith("topolet discover: cannot write")


def _machine_state(state_dir: Path) -> tuple[State, CPUSet, CPUSet]:
    """A state on this machine's CPUs: a pod container on the last CPU, the first reserved (if two)."""
    cpus = discover("/").cpus.sorted()
    held = CPUSet([cpus[-1]])
    reserved = CPUSet([cpus[0]]) if len(cpus) > 1 else CPUSet()
    alloc = Allocation(f"pod-{UID}.main", held, CPUSet(), f"kubepods/pod{UID}/c1",
                       Owner(pod_uid=UID, container="main"), "single-numa-node/full-cores", 1.0)
    state = State((alloc,), reserved)
    sf = StateFile(str(state_dir))
    with sf.lock():
        return sf.commit(state), held, reserved


def test_status_svg_colours_the_pods_cpus_and_names_it(tmp_path: Path) -> None:
    _, held, reserved = _machine_state(tmp_path)
    out = tmp_path / "status.svg"
    result = _run("status", "--state-dir", str(tmp_path), "--format", "svg", "--output", str(out))
    assert result.returncode == 0, result.stderr
    boxes = read_svg(out.read_text())
    cpu = held.min()
    assert boxes[f"pu-{cpu}"].fill == HOLDER_FILLS[0]
    for r in reserved:
        assert boxes[f"pu-{r}"].fill == RESERVED_FILL
    legend = [b.text[0] for b in boxes.values() if b.kind == "legend"]
    assert legend[0] == f"pod {UID}/main: CPUs {cpu} (1)"


def _frames(proc: subprocess.Popen[bytes], count: int, deadline: float) -> list[str]:
    """Read the watch's stdout until `count` whole frames have arrived (the one after them begun)."""
    assert proc.stdout is not None
    buf = b""
    while buf.count(b"\f") < count and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
    return buf.decode().split("\f\n")[:count]


def test_watch_redraws_frames_from_the_state_until_interrupted(tmp_path: Path) -> None:
    state, held, reserved = _machine_state(tmp_path)
    words = ["status", "--watch", "--interval", "0.2", "--state-dir", str(tmp_path)]
    proc = subprocess.Popen([topolet_bin(), *words], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_interruptible)
    try:
        first = _frames(proc, 2, time.monotonic() + 60)
        assert len(first) == 2, first
        for frame in first:
            assert f"  A  pod {UID}/main  CPUs {held.cpulist()}" in frame.splitlines()
            assert "1 allocation(s)" in frame
        # The next frames read the state afresh: the allocation released, the CPUs shared again.
        sf = StateFile(str(tmp_path))
        with sf.lock():
            sf.commit(State((), reserved, state.generation))
        deadline = time.monotonic() + 60
        later: list[str] = []
        while time.monotonic() < deadline and not any("0 allocation(s)" in f for f in later):
            later = _frames(proc, 6, deadline)
        assert any("0 allocation(s)" in f for f in later), later
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


@pytest.mark.parametrize("words, why", [
    (["--interval", "0"], "--interval must be a positive number"),
    (["--interval", "nan"], "--interval must be a positive number"),
    (["--format", "svg"], "--watch draws the terminal view"),
])
def test_watch_refuses_bad_options(tmp_path: Path, words: list[str], why: str) -> None:
    result = _run("status", "--watch", "--state-dir", str(tmp_path), *words)
    assert result.returncode == 2
    assert why in result.stderr.decode()


def test_frame_shows_each_numa_nodes_cpus_and_who_holds_them() -> None:
    data = {
        "generation": 9, "reserved": "15",
        "numa": [{"numa": 0, "cpus": "0-7", "reserved": "", "exclusive": "0-3,6", "free": "4-5,7",
                  "free_count": 3},
                 {"numa": 1, "cpus": "8-15", "reserved": "15", "exclusive": "8-9", "free": "10-14",
                  "free_count": 5}],
        "allocations": [
            {"id": f"pod-{UID}.main", "cpus": "0-3", "mems": "0", "cgroup": "kubepods/x", "gpus": [],
             "pid": None, "pod_uid": UID, "policy": "single-numa-node/any", "alive": True},
            {"id": "exec-42-7", "cpus": "6,8-9", "mems": "", "cgroup": "topolet/exec-42-7", "gpus": [],
             "pid": 42, "pod_uid": None, "policy": "exec best-effort/any", "alive": False},
        ],
    }
    lines = render_frame(data, "12:00:00", 2.0).splitlines()
    assert lines[0] == "topolet status  12:00:00  generation 9  (every 2s; Ctrl-C stops)"
    assert "NUMA 0: 8 CPUs: 5 exclusive (A 4, B 1), 3 shared, 0 reserved" in lines
    assert "      0  AAAA..B." in lines
    assert "NUMA 1: 8 CPUs: 2 exclusive (B 2), 5 shared, 1 reserved" in lines
    assert "      8  BB.....#" in lines
    assert f"  A  pod {UID}/main  CPUs 0-3  mems 0" in lines
    assert "  B  pid 42 (exec-42-7), gone  CPUs 6,8-9" in lines


def test_png_without_pillow_says_how_to_get_it(dump_root, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import sys

    code = ("import sys; sys.modules['PIL'] = None; from agent.cli import main; "
            f"sys.exit(main(['discover', '--fsroot', {str(dump_root(DUMP))!r}, '--format', 'png', "
            f"'--output', {str(tmp_path / 'x.png')!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2
    why = "topolet discover: PNG output needs Pillow: pip install pillow (or use --format svg)\n"
    assert result.stderr.endswith(why)
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("command", ["discover", "status"])
def test_output_goes_with_a_picture_format_only(command: str, tmp_path: Path) -> None:
    result = _run(command, "--format", "json", "--output", str(tmp_path / "x"))
    assert result.returncode == 2
    assert "--output is for the pictures" in result.stderr.decode()
    assert not (tmp_path / "x").exists()


def test_watch_on_a_terminal_clears_the_screen_for_each_frame(tmp_path: Path) -> None:
    import pty

    _, held, _ = _machine_state(tmp_path)
    main, sub = pty.openpty()
    words = ["status", "--watch", "--interval", "0.2", "--state-dir", str(tmp_path)]
    proc = subprocess.Popen([topolet_bin(), *words], stdout=sub, stderr=subprocess.PIPE,
                            preexec_fn=_interruptible)
    os.close(sub)
    buf = b""
    try:
        deadline = time.monotonic() + 60
        while buf.count(b"\x1b[H\x1b[2J") < 3 and time.monotonic() < deadline:
            if select.select([main], [], [], 0.5)[0]:
                buf += os.read(main, 65536)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        os.close(main)
    assert proc.returncode == 0, err
    frames = buf.decode().split("\x1b[H\x1b[2J")
    assert frames[0] == "" and len(frames) >= 4
    assert b"\f" not in buf
    assert all(f"pod {UID}/main  CPUs {held.cpulist()}" in f for f in frames[1:3])
