"""The image's debootstrap base built cold, into an empty cache, as on a machine that never built it.

Every other test finds the base cached under ~/.cache/topolet/image, so a bug on the cold path (an
EXIT trap that failed once debootstrap had unmounted everything, ending a finished build with exit 1
and no message) passed them all.  This build costs about a minute and a half; CI takes it every run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.conftest import REPO, require


def test_base_builds_into_an_empty_cache(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "debootstrap needs root")
    require(shutil.which("debootstrap") is not None, "debootstrap is not installed (make image-deps)")
    cache = tmp_path / "cache"
    env = {**os.environ, "TOPOLET_CACHE_DIR": str(cache)}
    out = subprocess.run([str(REPO / "image" / "base.sh")], capture_output=True, text=True, env=env,
                         timeout=1200, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "base ready" in out.stderr
    tarball = Path(out.stdout.strip())
    assert tarball.parent == cache / "image" and tarball.stat().st_size > 0
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert "./usr/bin/python3" in names or "./usr/bin/python3.11" in names
    # The trap cleaned up after itself: no work folder and no mount of it is left behind.
    assert [p.name for p in (cache / "image").iterdir() if p.name.startswith(".base-")] == []
    assert str(cache) not in Path("/proc/self/mountinfo").read_text()
    # Run again, the cached base is answered at once with the same path.
    again = subprocess.run([str(REPO / "image" / "base.sh")], capture_output=True, text=True, env=env,
                           timeout=60, check=False)
    assert again.returncode == 0 and again.stdout.strip() == str(tarball)
    shutil.rmtree(cache)  # 160 MiB that pytest would otherwise keep for its last three runs
