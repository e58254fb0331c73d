"""`topolet discover`: every output format on real dumps, clear errors for bad roots, no heavy imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import topolet_bin

DUMP = "16em64t-4s2c2t"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([topolet_bin(), "discover", *args], capture_output=True, text=True, timeout=60)


def test_json_and_yaml_carry_the_whole_model(dump_root):
    root = str(dump_root(DUMP))
    as_json = json.loads(run("--fsroot", root, "--format", "json").stdout)
    as_yaml = yaml.safe_load(run("--fsroot", root, "--format", "yaml").stdout)
    assert as_json == as_yaml
    assert as_json["cpus"] == "0-15"
    assert len(as_json["packages"]) == 4
    assert len(as_json["cores"]) == 8
    assert {n["id"] for n in as_json["numa_nodes"]} == {0}


def test_table_shows_packages_cores_and_threads(dump_root):
    out = run("--fsroot", str(dump_root(DUMP))).stdout
    assert out.startswith("Machine: 4 package(s), 8 cores, 16 CPUs online")
    assert "Package 3" in out
    assert "[0,8]" in out  # a core with its two hardware threads


def test_labels_format_prints_key_value_lines(dump_root):
    p = run("--fsroot", str(dump_root(DUMP)), "--format", "labels")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines == sorted(lines)
    assert "topolet.io/cpu.sockets=4" in lines
    assert all("=" in line for line in lines)


@pytest.mark.parametrize("setup", ["missing", "empty", "file", "no-cpu-dir"])
def test_bad_root_prints_one_line_and_exits_2(tmp_path, setup):
    root = tmp_path / "root"
    if setup == "empty":
        root.mkdir()
    elif setup == "file":
        root.write_text("not a folder")
    elif setup == "no-cpu-dir":
        (root / "sys" / "devices" / "system").mkdir(parents=True)
    p = run("--fsroot", str(root), "--format", "conformance")
    assert p.returncode == 2
    assert p.stdout == ""
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("topolet discover: ")
    assert "Traceback" not in p.stderr


def test_discover_does_not_import_the_kubernetes_client(dump_root):
    code = ("import sys; from agent.cli import main; "
            f"main(['discover', '--fsroot', {str(dump_root(DUMP))!r}, '--format', 'json']); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'pynvml')]; "
            "sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("fmt", ["table", "json", "yaml", "labels", "conformance"])
def test_scan_warnings_go_to_stderr_in_every_format(tmp_path, fmt):
    from tests.native.test_scan_malformed import CPU, make_tree, write

    root = make_tree(tmp_path / "root")
    write(root, f"{CPU}/cpu1/topology/core_id", "x\n")  # unreadable: the scan reports it and goes on
    p = run("--fsroot", str(root), "--format", fmt)
    assert p.returncode == 0, p.stderr
    warnings = p.stderr.splitlines()
    assert f"topolet discover: warning: EINVAL: {CPU}/cpu1/topology/core_id" in warnings
    assert all(line.startswith("topolet discover: warning: ") and line.isprintable() for line in warnings)
    assert "Traceback" not in p.stderr
    assert p.stdout and "warning" not in p.stdout.split("\n", 1)[0]
    if fmt in ("json", "conformance"):
        json.loads(p.stdout)  # stdout stays machine-readable


def test_warnings_are_printed_with_control_characters_escaped():
    from agent.topology.report import printable

    assert printable("EINVAL: sys/devices/system/node/node1/distance") == \
        "EINVAL: sys/devices/system/node/node1/distance"
    assert printable("ENOENT: sys/x\x1b[2J\ny") == "ENOENT: sys/x\\x1b[2J\\ny"
