"""The agent's OCI image (`make image`): built from the working tree, unpacked, and run in a chroot.

The build takes about 1.5 minutes with its base and wheels cached (image/README.md), and is skipped
when build/image already holds an image of the same inputs.
Reproducibility (the same inputs give the same digest) builds twice and lives in `make image-check`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, require, topolet_bin
from tests.image import built

DUMP = "nvidiagpunumanodes"
# The controller's Deployment runs the same image as this non-root uid (daemonset/controller/).
CONTROLLER_UID = 65532


@pytest.fixture(scope="module")
def image() -> dict[str, str]:
    """The image built from this tree in build/image, as `make image` builds it: image.env's variables."""
    require(os.geteuid() == 0, "building the image needs root (debootstrap, buildah chroot isolation)")
    for tool in ("buildah", "debootstrap", "umoci", "unshare"):
        require(shutil.which(tool) is not None, f"{tool} is not installed (make image-deps)")
    return built.build()


@pytest.fixture(scope="module")
def bundle(image: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """The image unpacked as an OCI runtime bundle: (bundle directory, its config.json)."""
    path = tmp_path_factory.mktemp("bundle") / "topolet"
    config = built.unpack(image["IMAGE_OCI"], path)
    yield path, config
    shutil.rmtree(path, ignore_errors=True)


def _agent_container() -> dict[str, Any]:
    docs = yaml.safe_load((REPO / "daemonset" / "agent.yaml").read_text())
    spec: dict[str, Any] = docs["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "agent"]
    return {"container": container, "pod_security": spec.get("securityContext", {})}


def test_archive_is_tagged_for_ctr_import(image: dict[str, str]) -> None:
    """The docker-archive is tagged localhost/topolet:<version>, what the local-image component runs."""
    with built.output_lock(), tarfile.open(image["IMAGE_ARCHIVE"]) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        (manifest,) = json.load(member)
    version = image["IMAGE_REF"].rsplit(":", 1)[1]
    assert manifest["RepoTags"] == [f"localhost/topolet:{version}"]
    # --squash: one layer, so what the install step deleted is not hidden below a later one
    assert len(manifest["Layers"]) == 1
    assert image["IMAGE_DIGEST"].startswith("sha256:") and len(image["IMAGE_DIGEST"]) == 71


def test_process_matches_the_daemonset(bundle: tuple[Path, Any]) -> None:
    """The image's entry point with its default arguments is the DaemonSet's command, run as its user."""
    _, config = bundle
    agent = _agent_container()
    process = config["process"]
    assert process["args"] == agent["container"]["command"] == ["topolet", "agent"]
    assert process["user"]["uid"] == agent["pod_security"]["runAsUser"] == 0
    assert process["user"]["gid"] == agent["pod_security"]["runAsGroup"] == 0
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in process["env"]


def test_help_and_version_run_in_the_image(bundle: tuple[Path, Any]) -> None:
    """`topolet --help` and `--version` run on the read-only root: this tree's version, on Python 3.11."""
    path, config = bundle
    done = built.run(path, config, ["topolet", "--help"])
    assert done.returncode == 0, built.describe(done)
    for command in ("discover", "agent", "controller"):
        assert command in done.stdout
    version = (REPO / "pyproject.toml").read_text().split('version = "', 1)[1].split('"', 1)[0]
    done = built.run(path, config, ["topolet", "--version"])
    assert done.returncode == 0, built.describe(done)
    assert done.stdout.strip() == f"topolet {version}"
    done = built.run(path, config, ["python3", "-c", "import sys; print(sys.version_info[:2])"])
    assert done.returncode == 0, built.describe(done)
    assert "(3, 11)" in done.stdout


def test_discover_in_the_image_matches_the_host(bundle: tuple[Path, Any], dump_root: Any) -> None:
    """`topolet discover --fsroot` on a bind-mounted dump gives inside the image what it gives here."""
    path, config = bundle
    root = dump_root(DUMP)
    done = built.run(path, config, ["topolet", "discover", "--fsroot", "/mnt/dump", "--format", "json"],
                     binds={root: "/mnt/dump"})
    assert done.returncode == 0, built.describe(done)
    host = subprocess.run([topolet_bin(), "discover", "--fsroot", str(root), "--format", "json"],
                          capture_output=True, text=True, check=True)
    inside = json.loads(done.stdout)
    assert inside == json.loads(host.stdout)
    assert len(inside["packages"]) == 2
    done = built.run(path, config, ["topolet", "discover", "--fsroot", "/mnt/dump", "--format", "labels"],
                     binds={root: "/mnt/dump"})
    assert done.returncode == 0, built.describe(done)
    assert "topolet.io/numa.nodes=" in done.stdout


# Every module of the agent, imported by the image's interpreter: nothing the install step removed
# (kubernetes.aio and its aiohttp stack) or left out is needed. _native_build is the cffi build script,
# which runs only under pip; a __main__ module runs its command when imported.
_IMPORT_ALL = """
import importlib, pkgutil, sys
import agent
names = [m.name for m in pkgutil.walk_packages(agent.__path__, "agent.")
         if m.name != "agent._native_build" and not m.name.endswith(".__main__")]
for name in names:
    importlib.import_module(name)
from kubernetes import client, config, watch
print(len(names), "aiohttp" in sys.modules)
"""


@pytest.mark.parametrize("uid", [0, CONTROLLER_UID], ids=["agent-uid", "controller-uid"])
def test_every_agent_module_imports_in_the_image(bundle: tuple[Path, Any], uid: int) -> None:
    """All of agent/ imports in the image, as the agent's root and as the controller's non-root uid."""
    path, config = bundle
    done = built.run(path, config, ["python3", "-c", _IMPORT_ALL], uid=uid)
    assert done.returncode == 0, built.describe(done)
    count, aiohttp = done.stdout.split()
    expected = sum(1 for p in (REPO / "agent").rglob("*.py")
                   if "__pycache__" not in p.parts and p.name not in ("_native_build.py", "__main__.py"))
    assert int(count) == expected
    assert aiohttp == "False"


def test_image_holds_no_build_tools_docs_or_caches(bundle: tuple[Path, Any]) -> None:
    """No compiler, header, pip, manual, documentation beyond copyright, translation or apt list."""
    rootfs = bundle[0] / "rootfs"
    for tool in ("cc", "gcc", "g++", "clang", "ld", "as", "make", "pip", "pip3"):
        for bindir in ("usr/bin", "usr/local/bin", "usr/sbin"):
            assert not (rootfs / bindir / tool).exists(), f"/{bindir}/{tool} is in the image"
    assert not list((rootfs / "usr").glob("include/**/*.h")), "C headers in the image"
    site = rootfs / "usr/local/lib/python3.11/dist-packages"
    assert not list(site.glob("pip")) and not list(site.glob("pip-*.dist-info"))
    assert not (site / "kubernetes" / "aio").exists()
    assert not (rootfs / "usr/share/man").exists()
    docs = [p for p in (rootfs / "usr/share/doc").rglob("*") if p.is_file() and p.name != "copyright"]
    assert docs == []
    assert sorted(p.name for p in (rootfs / "usr/share/locale").iterdir()) in ([], ["locale.alias"])
    assert list((rootfs / "var/lib/apt/lists").glob("*")) in ([], [rootfs / "var/lib/apt/lists/partial"])
    assert list((rootfs / "var/log").iterdir()) == []


def test_bytecode_is_prebuilt_and_hash_based(bundle: tuple[Path, Any]) -> None:
    """Every installed module has bytecode whose validity is a source hash, not a build-time mtime."""
    site = bundle[0] / "rootfs/usr/local/lib/python3.11/dist-packages"
    tag = "cpython-311"  # the image's interpreter: Debian bookworm's python3
    sources = list(site.rglob("*.py"))
    assert any(p.parent.name == "agent" for p in sources)
    for source in sources:
        pyc = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
        assert pyc.exists(), f"no bytecode for {source.relative_to(site)}"
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert flags & 0b01, f"{pyc.relative_to(site)} is timestamp-based"  # PEP 552 hash-based
