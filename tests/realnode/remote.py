"""A real node whose control plane runs on another machine: the host of tests/vm's cgroup v2 guest.

The host runs the test cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and a
DaemonSet controller, and writes what the node's side needs into a file (`write_remote`); the guest
runs only the node (containerd, runc, the kubelet, the agent) and its tests there, with
`TOPOLET_REALNODE_CLUSTER=<that file>` set:

    host:  write_remote(job / "cluster.json", cluster, parts, kubectl)      # then boot the guest
    guest: remote = load_remote(); cluster = attach(remote, workdir)     # tests/realnode/conftest.py

In the guest, `forward_api` listens on the guest's 127.0.0.1 at the API server's own port and
carries every connection to the host's (qemu's user network: 10.0.2.2 is the host's loopback), so
the kubelet, kubectl, the agent and the DaemonSet's pod reach the same URL as on the host and the
API server's serving certificate (127.0.0.1, localhost) verifies unchanged.  The binaries built on the
host (kubelet, kubectl) and the busybox image are read from the host's cache, shared at the same
path; containerd, runc, ctr and the CNI plugins are the guest's own Debian packages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.controlplane.cluster import Cluster, ClusterBinaries
from tests.controlplane.harness import Binaries, ControlPlane, _Process
from tests.realnode.node import CNI_BIN_DIRS, RealNodeError, RealNodeParts

REMOTE_ENV = "TOPOLET_REALNODE_CLUSTER"
HOST_FROM_GUEST = "10.0.2.2"  # qemu user networking: the host's loopback
FORWARD_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Remote:
    """What the node's side needs from the host's cluster and builds."""

    port: int  # the API server's, on 127.0.0.1 both sides
    ca_file: str
    admin_token: str
    controller_manager_token: str
    kubelet: str
    kubectl: str
    busybox_image: str
    daemonset_controller: bool  # the host runs one (tests/realnode/node.py: start_daemonset_controller)
    containerd2: str = ""  # containerd 2.4.2 and its runc shim built on the host ("": not shared)
    containerd2_shim: str = ""


def write_remote(path: Path, cluster: Cluster, kubelet: Path, kubectl: Path, busybox_image: Path,
                 *, daemonset_controller: bool, containerd2: tuple[Path, Path] | None = None) -> Path:
    """Write the description of `cluster` for a node elsewhere; the CA certificate lands next to it.
    `containerd2`: containerd 2.4.2 and its shim, for nodes with `runtime=CONTAINERD_2_4` there."""
    plane = cluster.plane
    ca = path.parent / "remote-pki" / "ca.crt"
    ca.parent.mkdir(exist_ok=True)
    shutil.copyfile(plane.ca_file, ca)
    remote = Remote(port=plane.port, ca_file=str(ca), admin_token=plane.admin_token,
                    controller_manager_token=plane.controller_manager_token, kubelet=str(kubelet),
                    kubectl=str(kubectl), busybox_image=str(busybox_image),
                    daemonset_controller=daemonset_controller,
                    containerd2=str(containerd2[0]) if containerd2 else "",
                    containerd2_shim=str(containerd2[1]) if containerd2 else "")
    path.write_text(json.dumps(asdict(remote), indent=1))
    return path


def load_remote() -> Remote | None:
    """The description named by TOPOLET_REALNODE_CLUSTER, or None when the cluster is local."""
    path = os.environ.get(REMOTE_ENV)
    if not path:
        return None
    return Remote(**json.loads(Path(path).read_text()))


def attach(remote: Remote, workdir: Path) -> Cluster:
    """A Cluster object for the remote cluster: its API, tokens and CA; it starts and stops nothing."""
    workdir.mkdir(parents=True, exist_ok=True)
    missing = Path("/nonexistent")  # the servers run on the host: never started from here
    plane = ControlPlane(Binaries(etcd=missing, kube_apiserver=missing), workdir)
    plane.port = remote.port
    plane.url = f"https://127.0.0.1:{remote.port}"
    plane.admin_token = remote.admin_token
    plane.controller_manager_token = remote.controller_manager_token
    plane.pki = Path(remote.ca_file).parent
    if plane.ca_file != Path(remote.ca_file):
        raise RealNodeError(f"the CA must be named ca.crt in its folder: {remote.ca_file}")
    plane.write_kubeconfig(plane.kubeconfig, plane.admin_token)
    return Cluster(plane, ClusterBinaries(missing, missing), workdir)


def remote_parts(remote: Remote) -> RealNodeParts:
    """The node's parts in the guest: the host's kubelet, image and (if named) containerd 2.4.2, this
    machine's containerd 1.6 and runc."""
    missing = [name for name in ("containerd", "runc", "ctr") if shutil.which(name) is None]
    cni = next((d for d in CNI_BIN_DIRS if os.path.exists(os.path.join(d, "ptp"))), None)
    if cni is None:
        missing.append("the CNI plugins (containernetworking-plugins)")
    shared = (remote.kubelet, remote.kubectl, remote.busybox_image, remote.containerd2,
              remote.containerd2_shim)
    missing += [p for p in shared if p and not os.path.exists(p)]
    if missing:
        raise RealNodeError(f"missing in the guest: {', '.join(missing)}")
    return RealNodeParts(Path(remote.kubelet), str(shutil.which("containerd")), str(shutil.which("runc")),
                         str(shutil.which("ctr")), cni, Path(remote.busybox_image),
                         Path(remote.containerd2) if remote.containerd2 else None,
                         Path(remote.containerd2_shim) if remote.containerd2_shim else None)


def forward_api(remote: Remote, log: Path, host: str = HOST_FROM_GUEST) -> _Process:
    """socat on 127.0.0.1:<API port> here, to the same port on `host`; returns once it accepts."""
    if shutil.which("socat") is None:
        raise RealNodeError("socat is not installed (tests/vm/build.sh puts it in the guest)")
    proc = _Process("api-forward", ["socat", f"TCP-LISTEN:{remote.port},bind=127.0.0.1,reuseaddr,fork",
                                    f"TCP:{host}:{remote.port}"], log)
    deadline = time.monotonic() + FORWARD_TIMEOUT_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", remote.port), timeout=2):
                return proc
        except OSError:
            if not proc.running() or time.monotonic() > deadline:
                proc.stop()
                raise RealNodeError(f"the API forwarder did not start:\n{proc.log_tail()}") from None
            time.sleep(0.1)



def forget_remote_nodes(cluster: Cluster, before: set[str], namespaces: tuple[str, ...] = ()) -> list[str]:
    """On the host, after the node's machine is gone: delete `namespaces`, and the real nodes' Nodes
    (`rn-*`) that joined since `before` with the pods bound to them (grace 0: no kubelet is left to
    finish them); the Nodes deleted.  A node that stopped cleanly deleted its own Node already."""
    from agent.errors import KubeAPIError
    from agent.kubeapi.client import KubeClient

    api = KubeClient(cluster.plane.client())
    gone: list[str] = []
    try:
        for ns in namespaces:
            with contextlib.suppress(KubeAPIError):
                api.request("DELETE", f"/api/v1/namespaces/{ns}")
        names = {n["metadata"]["name"] for n in api.list("/api/v1/nodes")["items"]
                 if n["metadata"]["name"].startswith("rn-")} - before
        for name in sorted(names):
            pods = api.list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={name}"})["items"]
            for pod in pods:
                meta = pod["metadata"]
                with contextlib.suppress(KubeAPIError):
                    api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                body={"gracePeriodSeconds": 0}, content_type="application/json")
            with contextlib.suppress(KubeAPIError):
                api.request("DELETE", f"/api/v1/nodes/{name}")
            gone.append(name)
    finally:
        api.close()
    return gone
