"""Links in a dump never lead the scan out of it, through openat2 or through the walk that stands in
for it where the kernel (or a seccomp filter) refuses openat2, forced here by TOPOLET_SCAN_NO_OPENAT2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agent.errors import TopologyError
from agent.topology import native
from tests.conftest import require, topolet_bin
from tests.native.test_scan_dumps import DUMPS, dump_root
from tests.native.test_scan_malformed import CPU, NODE, error_paths, make_tree, write

FORCE = "TOPOLET_SCAN_NO_OPENAT2"


@pytest.fixture(params=["openat2", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with openat2 and with the fallback walk (the C side reads the variable per scan)."""
    if request.param == "fallback":
        monkeypatch.setenv(FORCE, "1")
    else:
        monkeypatch.delenv(FORCE, raising=False)
    return str(request.param)


def escaping(link: Path, host_target: str) -> str:
    """A relative link text that, followed by the kernel from link's folder, reaches host_target."""
    return "../" * len(link.parent.resolve().parts[1:]) + host_target.lstrip("/")


def test_sys_linked_to_the_host_sys_is_refused(tmp_path: Path, mode: str) -> None:
    write(tmp_path, "proc/cpuinfo", "processor\t: 0\n\n")
    (tmp_path / "sys").symlink_to("/sys")
    with pytest.raises(TopologyError, match="ELOOP"):
        native.scan(str(tmp_path))
    env = dict(os.environ)
    p = subprocess.run([topolet_bin(), "discover", "--fsroot", str(tmp_path), "--format", "conformance"],
                       capture_output=True, text=True, env=env, timeout=60, check=False)
    assert p.returncode != 0
    assert p.stdout == ""
    assert "ELOOP" in p.stderr and "sys/devices/system/cpu" in p.stderr


def test_escaping_relative_links_read_nothing_of_the_host(tmp_path: Path, mode: str) -> None:
    require(Path("/sys/devices/system/cpu/cpu0/topology").is_dir(), "host has no cpu0 topology to lure to")
    root = make_tree(tmp_path)
    topo = root / CPU / "cpu0" / "topology"
    for f in topo.iterdir():
        f.unlink()
    topo.rmdir()
    topo.symlink_to(escaping(topo, "/sys/devices/system/cpu/cpu0/topology"))
    nodes = root / NODE
    for d in sorted(nodes.rglob("*"), key=lambda p: -len(p.parts)):
        d.rmdir() if d.is_dir() and not d.is_symlink() else d.unlink()
    nodes.rmdir()
    nodes.symlink_to(escaping(nodes, "/sys/devices/system/node"))

    s = native.scan(str(root))
    errors = error_paths(s)
    assert s.cpus[0].thread_siblings is None and s.cpus[0].core_id == -1
    assert errors[f"{CPU}/cpu0/topology/thread_siblings_list"] == "ELOOP"
    # inside the root the link names itself: a loop, not the host's NUMA nodes
    assert s.nodes == ()
    assert errors[NODE] == "ELOOP"
    assert s.cpus[1].core_id == 0  # the rest of the dump is read


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_links_inside_the_root_are_followed(tmp_path: Path, mode: str, absolute: bool) -> None:
    """Links that stay in the dump resolve as on the machine it came from: '/' is the dump's root."""
    root = make_tree(tmp_path)
    (root / "elsewhere").mkdir()
    (root / NODE).rename(root / "elsewhere" / "node")
    (root / NODE).symlink_to("/elsewhere/node" if absolute else "../../../elsewhere/node")
    s = native.scan(str(root))
    assert [n.id for n in s.nodes] == [0, 1]
    assert not s.errors


# dumps rich in links: PCI device links, HMAT initiator links, GPU memory nodes, POWER SMT4
LINKED_DUMPS = ["32em64t-2n8c+dax+nvme+mic+dimms", "fakememinitiators-1np2c+1npp+gi", "nvidiagpunumanodes",
                "256ppc-8n8s4t"]


@pytest.mark.slow  # four real machines unpacked, each scanned both ways (CONTRIBUTING.md, Test tiers)
def test_fallback_reads_dumps_as_openat2_does(dumps_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(LINKED_DUMPS) <= set(DUMPS)
    for name in LINKED_DUMPS:
        root = str(dump_root(name, dumps_dir))
        monkeypatch.delenv(FORCE, raising=False)
        want = native.scan(root, parts=1)
        monkeypatch.setenv(FORCE, "1")
        assert native.scan(root, parts=1) == want, name
