"""hwloc conformance: `topolet discover --format conformance` equals hwloc's answer on 26 real dumps.

The grader and the dumps are copied from the project's shared data (see tests/data/hwloc/ORIGIN.md).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import HWLOC_DATA, topolet_bin

# hwloc's grader over 26 real machines, as `make conformance`: slow, out of `make unit` (CONTRIBUTING.md).
pytestmark = pytest.mark.slow


def test_all_graded_dumps_match_hwloc(tmp_path):
    cmd = [sys.executable, str(HWLOC_DATA / "hwloc_conformance.py"), "--data", str(HWLOC_DATA),
           "--cache", str(tmp_path), "--", topolet_bin(), "discover", "--fsroot", "{root}",
           "--format", "conformance"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    last = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 0, p.stdout + p.stderr
    assert last == "conformance: 26/26 dumps match", p.stdout
