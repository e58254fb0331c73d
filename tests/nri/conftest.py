"""Fixtures of the NRI tests: NRI's runtime side built once (needs go) and a short temporary folder."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.nri.goruntime import build_runtime, go_available


@pytest.fixture(scope="module")
def runtime_binary() -> str:
    """The nri-runtime binary (tests/nri/runtime/build.sh); a skip without go, a failure under CI."""
    require(go_available(), "needs go to build NRI's runtime side from the Go module proxy")
    return build_runtime()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder whose unix socket paths stay under 108 bytes (pytest's tmp_path may not)."""
    with tempfile.TemporaryDirectory(prefix="nri-") as d:
        yield Path(d)
