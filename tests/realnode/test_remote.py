"""The remote-cluster parts of the real node, with no node: the description, attaching, rootfs detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.controlplane.harness import Binaries, ControlPlane
from tests.realnode.node import root_is_initramfs
from tests.realnode.remote import REMOTE_ENV, Remote, attach, load_remote, write_remote

ROOT_ON_RAMFS = "1 0 0:2 / / rw - rootfs rootfs rw,size=1000k\n22 1 0:21 / /proc rw - proc proc rw\n"
ROOT_ON_DISK = ("23 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                "24 23 0:5 / /dev rw shared:2 - devtmpfs udev rw\n")


@pytest.mark.parametrize(("mountinfo", "expected"), [(ROOT_ON_RAMFS, True), (ROOT_ON_DISK, False)])
def test_root_is_initramfs(tmp_path: Path, mountinfo: str, expected: bool) -> None:
    path = tmp_path / "mountinfo"
    path.write_text(mountinfo)
    assert root_is_initramfs(str(path)) is expected


class _Cluster:
    """What write_remote reads of a Cluster: its plane."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane


def test_description_round_trip_and_attach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = ControlPlane(Binaries(Path("/e"), Path("/a")), tmp_path / "host")
    host.pki.mkdir(parents=True)
    host.ca_file.write_text("CA\n")
    job = tmp_path / "job"
    job.mkdir()
    path = write_remote(job / "cluster.json", _Cluster(host), Path("/c/kubelet"),  # type: ignore[arg-type]
                        Path("/c/kubectl"), Path("/c/busybox.tar"), daemonset_controller=True)

    monkeypatch.delenv(REMOTE_ENV, raising=False)
    assert load_remote() is None
    monkeypatch.setenv(REMOTE_ENV, str(path))
    remote = load_remote()
    assert remote == Remote(port=host.port, ca_file=str(job / "remote-pki" / "ca.crt"),
                            admin_token=host.admin_token,
                            controller_manager_token=host.controller_manager_token,
                            kubelet="/c/kubelet", kubectl="/c/kubectl", busybox_image="/c/busybox.tar",
                            daemonset_controller=True)
    assert Path(remote.ca_file).read_text() == "CA\n"  # a copy: the guest sees the job folder only

    cluster = attach(remote, tmp_path / "guest")
    assert cluster.plane.url == f"https://127.0.0.1:{host.port}" == host.url
    assert cluster.plane.ca_file == Path(remote.ca_file)
    config = json.loads(cluster.plane.kubeconfig.read_text())
    assert config["clusters"][0]["cluster"] == {"server": host.url, "certificate-authority": remote.ca_file}
    assert config["users"][0]["user"] == {"token": host.admin_token}
    cluster.stop()  # starts and stops nothing: the servers are the host's
