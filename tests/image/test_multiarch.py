"""The arm64 image from the same recipe, run under qemu-user, and both images pushed as one image index.

`image/build.sh` with IMAGE_ARCH=arm64 builds into build/image-arm64 (what `make image-arm64` builds; up
to date when its inputs are unchanged): the arm64 base, the aarch64 wheels of the lock and the C helper
compiled by arm64's gcc under qemu-user, all cached under ~/.cache/topolet/image. The image's own
interpreter then runs `topolet discover` on a sysfs dump, under qemu-user, and must say what the host
says. `image/push.sh` combines both images into one OCI index and pushes it with skopeo to a
throwaway registry (Debian's docker-registry, distribution's registry) on a free local port.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, require, topolet_bin
from tests.image import built

DUMP = "nvidiagpunumanodes"
ARM64_OUT = REPO / "build" / "image-arm64"
EM_AARCH64 = 183  # ELF e_machine of an aarch64 object
# The image's manifests and what they select (daemonset/agent.yaml, daemonset/controller/controller.yaml).
ARCHITECTURES = ["amd64", "arm64"]


def _require_tools() -> None:
    require(os.geteuid() == 0, "building the image needs root (debootstrap, buildah chroot isolation)")
    for tool in ("buildah", "debootstrap", "umoci", "unshare", "qemu-aarch64-static"):
        require(shutil.which(tool) is not None, f"{tool} is not installed (make image-deps)")


@pytest.fixture(scope="module")
def arm64_image() -> dict[str, str]:
    """The arm64 image built from this tree in build/image-arm64: image.env's variables."""
    _require_tools()
    return built.build(ARM64_OUT, arch="arm64")


@pytest.fixture(scope="module")
def arm64_bundle(arm64_image: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    path = tmp_path_factory.mktemp("bundle-arm64") / "topolet"
    config = built.unpack(arm64_image["IMAGE_OCI"], path, out=ARM64_OUT)
    yield path, config
    shutil.rmtree(path, ignore_errors=True)


def _config(layout: str) -> dict[str, Any]:
    """The image config of `layout:ref` (an OCI layout image/build.sh wrote)."""
    path, ref = layout.rsplit(":", 1)
    index = json.loads((Path(path) / "index.json").read_text())
    (descriptor,) = [d for d in index["manifests"]
                     if d["annotations"]["org.opencontainers.image.ref.name"] == ref]
    blobs = Path(path) / "blobs" / "sha256"
    manifest = json.loads((blobs / descriptor["digest"].removeprefix("sha256:")).read_text())
    config: dict[str, Any] = json.loads(
        (blobs / manifest["config"]["digest"].removeprefix("sha256:")).read_text())
    return config


def test_arm64_image_is_arm64_with_an_arm64_helper(arm64_image: dict[str, str],
                                                   arm64_bundle: tuple[Path, Any]) -> None:
    """The config says linux/arm64 and the C helper inside is an aarch64 object, as is the interpreter."""
    assert arm64_image["IMAGE_ARCH"] == "arm64"
    config = _config(arm64_image["IMAGE_OCI"])
    assert (config["os"], config["architecture"]) == ("linux", "arm64")
    rootfs = arm64_bundle[0] / "rootfs"
    (helper,) = (rootfs / "usr/local/lib/python3.11/dist-packages/agent").glob("_native*.so")
    python = rootfs / "usr/bin" / os.readlink(rootfs / "usr/bin/python3")  # python3 -> python3.11
    for elf in (helper, python):
        assert int.from_bytes(elf.read_bytes()[18:20], "little") == EM_AARCH64, elf


def test_arm64_interpreter_and_discover_run_under_qemu(arm64_bundle: tuple[Path, Any],
                                                       dump_root: Any) -> None:
    """Under qemu-user the image's python3 is aarch64 3.11, and `topolet discover` on a dump says what
    the host's topolet says: the same labels and model from the arm64 build of the C helper."""
    path, config = arm64_bundle
    probe = "import platform, sys; print(platform.machine(), sys.version_info[:2])"
    done = built.run(path, config, ["python3", "-c", probe], timeout_s=300)
    assert done.returncode == 0, built.describe(done)
    assert done.stdout.split(None, 1) == ["aarch64", "(3, 11)\n"]
    root = dump_root(DUMP)
    done = built.run(path, config, ["topolet", "discover", "--fsroot", "/mnt/dump", "--format", "json"],
                     binds={root: "/mnt/dump"}, timeout_s=300)
    assert done.returncode == 0, built.describe(done)
    host = subprocess.run([topolet_bin(), "discover", "--fsroot", str(root), "--format", "json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == json.loads(host.stdout)
    assert len(json.loads(done.stdout)["packages"]) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A throwaway registry (distribution's, Debian's docker-registry) on a free port: host:port."""
    binary = shutil.which("docker-registry")
    require(binary is not None, "docker-registry is not installed (make image-deps)")
    assert binary is not None
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(json.dumps({
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(tmp_path / "storage")}},
        "http": {"addr": f"127.0.0.1:{port}"}}))
    log = open(tmp_path / "registry.log", "w")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, (tmp_path / "registry.log").read_text()
            assert time.monotonic() < deadline, "the registry did not listen within 30 s"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _skopeo_raw(ref: str, *args: str) -> bytes:
    done = subprocess.run(["skopeo", "inspect", "--tls-verify=false", *args, ref],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout


def _image_env(out: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (out / "image.env").read_text().splitlines())


def test_push_gives_one_index_of_both_architectures(arm64_image: dict[str, str], registry: str,
                                                    tmp_path: Path) -> None:
    """`make image-push REGISTRY=...` (image/push.sh): the registry holds an OCI image index of the
    amd64 and arm64 images under the build's tag (<version>-<commit>), whose digest push.sh prints with
    the chart's --set flags; each platform's manifest is the one its build wrote, so a node pulls the
    image built for it."""
    require(shutil.which("skopeo") is not None, "skopeo is not installed (make image-deps)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("IMAGE_BASE", "IMAGE_TREE", "IMAGE_ARCH", "IMAGE_OUT", "IMAGE_ARCHES")}
    env["IMAGE_PUSH_TLS_VERIFY"] = "false"
    done = subprocess.run([str(REPO / "image" / "push.sh"), f"{registry}/team"], env=env, capture_output=True,
                          text=True, timeout=built.BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stdout)  # the lines an operator reads: what was pushed, its digest, the reference to pull
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
    # What push.sh built (or found up to date): the fixture's arm64 image unless the tree changed since.
    with built.output_lock(), built.output_lock(ARM64_OUT):
        amd64_env, arm64_env = _image_env(built.DEFAULT_OUT), _image_env(ARM64_OUT)
    version = amd64_env["IMAGE_REF"].rsplit(":", 1)[1]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip()
    tag = f"{version}-{commit}" + ("-dirty" if dirty else "")  # each build a tag of its own
    assert lines["pushed"] == f"{registry}/team/topolet:{tag}"
    digest = lines["digest"]
    assert lines["pull"] == f"{registry}/team/topolet@{digest}"
    assert lines["helm"] == (f"--set image.repository={registry}/team/topolet --set image.tag={tag} "
                             f"--set image.digest={digest}")

    raw = _skopeo_raw(f"docker://{registry}/team/topolet:{tag}", "--raw")
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == digest
    index = json.loads(raw)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    platforms = {m["platform"]["architecture"]: m for m in index["manifests"]}
    assert sorted(platforms) == ARCHITECTURES
    assert all(m["platform"]["os"] == "linux" for m in index["manifests"])
    assert platforms["amd64"]["digest"] == amd64_env["IMAGE_DIGEST"]
    assert platforms["arm64"]["digest"] == arm64_env["IMAGE_DIGEST"]
    # What an arm64 node's runtime resolves the tag to: the arm64 image's layer (skopeo reports the
    # index's digest as the tag's).
    arm64 = json.loads(_skopeo_raw(f"docker://{registry}/team/topolet:{tag}", "--override-arch", "arm64"))
    blobs = ARM64_OUT / "oci" / "blobs" / "sha256"
    manifest = json.loads((blobs / arm64_env["IMAGE_DIGEST"].removeprefix("sha256:")).read_text())
    assert arm64["Architecture"] == "arm64" and arm64["Digest"] == digest
    assert arm64["Layers"] == [layer["digest"] for layer in manifest["layers"]]

    # The index is a function of its images alone: combined again, in the other order, same digest.
    again = subprocess.run([sys.executable, str(REPO / "image" / "index.py"), str(tmp_path / "oci"), version,
                            str(ARM64_OUT / "oci"), str(REPO / "build" / "image" / "oci")],
                           capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == digest


def test_manifests_select_linux_and_the_built_architectures() -> None:
    """The agent's DaemonSet and the controller's Deployment run only on Linux nodes of the
    architectures the index holds: a node of any other gets no pod rather than one that cannot start."""
    for path in ("daemonset/agent.yaml", "daemonset/controller/controller.yaml"):
        docs = [d for d in yaml.safe_load_all((REPO / path).read_text()) if d]
        (workload,) = [d for d in docs if d["kind"] in ("DaemonSet", "Deployment")]
        spec = workload["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}, path
        required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        terms = required["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ARCHITECTURES}]}], path
