"""A real node for the tests and bench/: Debian's containerd and runc, a kubelet built from k8s.io/kubernetes.

`RealNode(cluster, parts)` runs, next to a `tests.controlplane.cluster.Cluster` (whose control plane
has a real kube-controller-manager and kube-scheduler):

- containerd 1.6 (or, with `runtime=CONTAINERD_2_4`, containerd 2.4.2 with NRI on its own socket,
  `nri_socket`: tests/realnode/containerd.py writes either config) with its own root, state, socket,
  runc root, CNI config (the `ptp` plugin, a /24 of its own, host-local addresses kept in its folder)
  and network namespaces under its state folder, the image of `tests.realnode.images` imported with
  `ctr -n k8s.io images import` and used as the sandbox ("pause") image;
- the kubelet (`tests/controlplane/build.sh kubelet`, v1.37.2) with its own --root-dir (so its own
  pod-resources socket and cpu_manager_state), the cgroupfs driver and a cgroup root of its own,
  `topolet-rn-<pid>-<tag>`, created in every cgroup hierarchy, so nothing it or runc makes can meet
  the host's other tests (tests/enforce writes the cpuset hierarchy too).  It registers a Node
  named `rn-<tag>` with admin credentials.  The recipe that works on hosts like this one:
  `failCgroupV1: false`, `failSwapOn: false`, containerd's `restrict_oom_score_adj` (these hosts
  withhold CAP_SYS_RESOURCE: runc fails "can't get final child's PID from pipe" without it);
  the kubelet's "RuntimeConfig unimplemented" and image-filesystem stats errors are not fatal.

Both daemons (and so every shim and container) run in a mount namespace of the node's own, made by
a holder process (`unshare --mount`): their mounts never reach the host's, and in it the six kernel
settings the kubelet would otherwise rewrite on the host at start (vm.overcommit_memory,
kernel.panic, ...) are bind-mounted files already holding the values it wants.  With
`makeIPTablesUtilChains: false` it adds no iptables chains either.

The cluster's controller manager runs no node lifecycle controller, so the harness does its one part
that matters here: once the kubelet reports the Node Ready, it lifts the `not-ready` taint the API
server put on the new Node.

Everything lives under `/run/topolet-realnode/<pid>-<tag>/` (short: unix socket paths are limited
to 108 bytes).  `stop()` kills the kubelet, containerd, every shim started for this containerd and
every process in the node's cgroups, unmounts everything mounted below the folder (overlay
snapshots, sandbox shm, network namespaces), removes the node's cgroups in every hierarchy and the
folder, and deletes the Node; it is idempotent and runs after a failed test too.  `sweep()` does the
same for nodes of test processes that no longer exist (a killed run).

`restart_kubelet()` and `restart_containerd()` stop only the daemon: containers keep running under
their shims, as on a real node.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.controlplane.cluster import Cluster
from tests.controlplane.harness import ControlPlaneError, _Process, build_components, free_port
from tests.realnode.containerd import CONTAINERD_1_6, CONTAINERD_2_4, ContainerdSetup, write_config
from tests.realnode.images import IMAGE, busybox_image

BASE = Path("/run/topolet-realnode")
CGROUP_MOUNT = Path("/sys/fs/cgroup")
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
READY_TIMEOUT_S = 120.0
# The kubelet's device manager keeps its Registration socket here whatever its --root-dir.
KUBELET_DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
IMPORT_TIMEOUT_S = 600.0
MNT_DETACH = 2
# What the kubelet's container manager sets at start (pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables); in the node's mount namespace these files already say so.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
# containerd 1.6 (and 2.4) puts every shim's socket here, whatever its state dir.
SHIM_SOCKETS = "/run/containerd/s/"
# The kubelet links each container's log here, on the host (its --pod-logs-dir is the node's own).
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# Where milestone() appends `<name> <CLOCK_MONOTONIC seconds>` lines (tests/vm times the guest's node).
MILESTONES_ENV = "TOPOLET_REALNODE_MILESTONES"
# "1" where the node runs under emulation (tests/vm's guest under TCG): see emulated().
EMULATED_ENV = "TOPOLET_REALNODE_EMULATED"
# Under emulation: waits this many times longer, polled this seldom (each poll of the API or of
# `ctr` costs the emulated CPUs the node itself needs).
EMULATED_SLACK = 4.0
EMULATED_POLL_S = 1.0


class RealNodeError(ControlPlaneError):
    """A part of the real node is missing or did not come up (its log's tail in the message)."""


def emulated() -> bool:
    """Whether the node runs under emulation (TOPOLET_REALNODE_EMULATED=1): minutes where a real machine
    takes seconds, so waits are longer, polls sparser and the agent's probes patient."""
    return os.environ.get(EMULATED_ENV) == "1"


def wait(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    """tests.kube.kubelet_standin.wait_for, stretched under emulation (see emulated())."""
    from tests.kube.kubelet_standin import wait_for

    if emulated():
        return wait_for(check, what, timeout * EMULATED_SLACK, interval=EMULATED_POLL_S)
    return wait_for(check, what, timeout)


def request_timeout() -> tuple[float, float]:
    """(connect, read) seconds for a test's API call: the agent's own, stretched under emulation (the
    guest reaches the API server through a forwarder, and a loaded host answers it in seconds)."""
    from agent.kubeapi.client import REQUEST_TIMEOUT

    if emulated():
        return REQUEST_TIMEOUT[0] * EMULATED_SLACK, REQUEST_TIMEOUT[1] * EMULATED_SLACK
    return REQUEST_TIMEOUT


def milestone(name: str) -> None:
    """Note that `name` was reached now, in the file TOPOLET_REALNODE_MILESTONES names (if any)."""
    path = os.environ.get(MILESTONES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {time.monotonic():.3f}\n")


@dataclass(frozen=True)
class RealNodeParts:
    """The binaries and the image a real node runs."""

    kubelet: Path
    containerd: str
    runc: str
    ctr: str
    cni_bin: str
    image: Path
    containerd2: Path | None = None  # containerd v2.4.2 and its runc shim (build.sh), for CONTAINERD_2_4
    containerd2_shim: Path | None = None


def find_parts() -> RealNodeParts:
    """Build (or find in the cache) the kubelet, containerd 2.4.2 with its shim and the image; find
    containerd 1.6, runc, ctr and the CNI plugins (Debian packages: `make deps`).  RealNodeError
    names what is missing."""
    missing = [name for name in ("containerd", "runc", "ctr") if shutil.which(name) is None]
    cni = next((d for d in CNI_BIN_DIRS if os.path.exists(os.path.join(d, "ptp"))), None)
    if cni is None:
        missing.append("the CNI plugins (containernetworking-plugins)")
    if not os.path.exists("/bin/busybox"):
        missing.append("/bin/busybox (busybox-static)")
    if missing:
        raise RealNodeError(f"missing: {', '.join(missing)} (make deps installs them)")
    built = build_components("kubelet", "containerd", "containerd-shim-runc-v2")
    return RealNodeParts(built["kubelet"], str(shutil.which("containerd")), str(shutil.which("runc")),
                         str(shutil.which("ctr")), str(cni), busybox_image(),
                         built["containerd"], built["containerd-shim-runc-v2"])


def hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: the v1 controllers' and the unified one."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] in ("cgroup", "cgroup2"):
                out.append(Path(fields[4]))
    return sorted(set(out))


def _v1_cpuset_mount() -> Path | None:
    for h in hierarchies():
        if (h / "cpuset.cpus").exists() and (h / "tasks").exists():
            return h
    return None


def root_is_initramfs(mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether / is the kernel's own rootfs, an initramfs never switched away from (tests/vm's guest):
    pivot_root(2) refuses to move it, so runc must enter its containers' roots without it."""
    with open(mountinfo) as f:
        for line in f:
            fields = line.split()
            if fields[4] == "/":
                return fields[fields.index("-") + 1] == "rootfs"
    return False


def _kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pids_in_tree(root: Path) -> set[int]:
    pids: set[int] = set()
    for dirpath, _, files in os.walk(root):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.procs")) as f:
                pids.update(int(p) for p in f.read().split())
    return pids


def _remove_cgroup_tree(root: Path) -> None:
    """Kill what runs in `root` and remove it bottom-up (an exiting process lingers for a moment)."""
    if not root.exists():
        return
    for _ in range(300):
        _kill_pids(_pids_in_tree(root))
        dirs = sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: -len(p.parts))
        for d in dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        if not root.exists():
            return
        time.sleep(0.05)
    raise RealNodeError(f"cannot remove cgroup {root}: {sorted(_pids_in_tree(root))}")


def _mounts_under(folder: Path) -> list[str]:
    prefix = str(folder) + "/"
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix) or point == str(folder):
                out.append(point)
    return out


def _unmount_under(folder: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(20):
        points = _mounts_under(folder)
        if not points:
            return
        for point in sorted(points, key=lambda p: -p.count("/")):
            libc.umount2(point.encode(), MNT_DETACH)
    raise RealNodeError(f"mounts left under {folder}: {_mounts_under(folder)}")


def _processes_mentioning(text: str) -> set[int]:
    """Pids whose command line contains `text` (the shims name their containerd's socket)."""
    needle = text.encode()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if needle in f.read():
                out.add(int(entry))
    out.discard(os.getpid())
    return out


def _shim_sockets(pids: set[int]) -> set[str]:
    """Paths of the unix sockets these processes listen on under containerd's shim folder: a shim
    killed with SIGKILL leaves its socket file behind."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
                    if m:
                        inodes.add(m.group(1))
    out = set()
    with contextlib.suppress(OSError), open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith(SHIM_SOCKETS):
                out.add(fields[7])
    return out


def _clean_folder(folder: Path, cgroup_name: str) -> None:
    """Tear down what a node left in `folder` and its cgroups, whoever started it."""
    shims = _processes_mentioning(str(folder) + "/")
    sockets = _shim_sockets(shims)
    _kill_pids(shims)
    for path in sockets:
        with contextlib.suppress(OSError):
            os.unlink(path)
    for h in hierarchies():
        _remove_cgroup_tree(h / cgroup_name)
    _kill_pids(_processes_mentioning(str(folder) + "/"))
    _unmount_under(folder)
    shutil.rmtree(folder, ignore_errors=True)
    # A killed kubelet leaves its links; the next node's kubelet would ask its runtime about them.
    with contextlib.suppress(OSError):
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(folder) + "/"):
                    link.unlink()


def sweep() -> list[str]:
    """Clean up the nodes of test processes that are gone; the tags cleaned."""
    cleaned: list[str] = []
    if not BASE.exists():
        return cleaned
    for entry in BASE.iterdir():
        m = re.fullmatch(r"(\d+)-[0-9a-f]+", entry.name)
        if m is None or Path(f"/proc/{m.group(1)}").exists():
            continue
        _clean_folder(entry, f"topolet-rn-{entry.name}")
        cleaned.append(entry.name)
    return cleaned


class RealNode:
    """One real node (containerd + kubelet) registered with `cluster`; start() it, stop() it."""

    def __init__(self, cluster: Cluster, parts: RealNodeParts, *, cpu_manager_policy: str = "none",
                 reserved_cpus: str = "", runtime: str = CONTAINERD_1_6,
                 nri_required_plugins: Sequence[str] = (), numa_split: bool = False,
                 topology_manager_policy: str = "none", device_plugins: bool = False) -> None:
        """`runtime`: CONTAINERD_1_6 (Debian's) or CONTAINERD_2_4 (with NRI on `nri_socket`, where
        `nri_required_plugins` makes NRI's default validator refuse containers while one is missing).
        `numa_split`: the kubelet sees this machine's CPUs as two NUMA nodes
        (`tests.realnode.numa_split`; the agent needs `--fsroot numa_split.agent_root(...)` to see the
        same); `topology_manager_policy`: the kubelet's; `device_plugins`: the kubelet's device-plugins
        folder, which it keeps at the fixed `/var/lib/kubelet/device-plugins` whatever its root dir, is
        one of this node's own (`device_plugins_dir`, bound there in its mount namespace), so the
        plugins a test registers reach this kubelet and no other node's."""
        hexid = uuid.uuid4().hex[:8]
        self.cluster = cluster
        self.parts = parts
        self.cpu_manager_policy = cpu_manager_policy
        self.reserved_cpus = reserved_cpus
        self.tag = f"{os.getpid()}-{hexid}"
        self.name = f"rn-{hexid}"
        self.dir = BASE / self.tag
        self.cgroup_name = f"topolet-rn-{self.tag}"
        self.containerd_socket = self.dir / "containerd.sock"
        self.runtime = runtime
        self.nri_socket = self.dir / "nri.sock"
        self.nri_required_plugins = tuple(nri_required_plugins)
        self.numa_split = numa_split
        self.topology_manager_policy = topology_manager_policy
        self.device_plugins = device_plugins
        self.kubelet_root = self.dir / "kubelet"
        self.subnet = f"10.251.{random.randrange(256)}.0/24"
        self.namespace_holder: _Process | None = None
        self.containerd: _Process | None = None
        self.kubelet: _Process | None = None
        self._kubelet_port = free_port()
        self._healthz_port = free_port()

    # ---- where things are ------------------------------------------------------------------------

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's pod-resources gRPC socket."""
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def device_plugins_dir(self) -> Path:
        """The kubelet's device-plugins folder (with `device_plugins`): its Registration socket and the
        plugins' own."""
        return self.dir / "device-plugins"

    @property
    def cpuset_root(self) -> Path:
        """The kubelet's cgroup root in the cpuset hierarchy (the agent's --cgroup-root)."""
        mount = _v1_cpuset_mount()
        return (mount if mount is not None else CGROUP_MOUNT) / self.cgroup_name

    @property
    def cpu_manager_state(self) -> Path:
        return self.kubelet_root / "cpu_manager_state"

    def logs(self, chars: int = 3000) -> str:
        """The tail of containerd's and the kubelet's logs."""
        parts = []
        for proc in (self.containerd, self.kubelet):
            if proc is not None:
                parts.append(f"--- {proc.name} {self.name} ---\n{proc.log_tail(chars)}")
        return "\n".join(parts)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start containerd (image imported) and the kubelet; return once the Node is Ready."""
        sweep()
        self.dir.mkdir(parents=True)
        try:
            self._make_cgroup_root()
            self._start_namespace()
            self._write_containerd_config()
            self.start_containerd()
            milestone("containerd answering")
            self._ctr("images", "import", str(self.parts.image))
            self._write_kubelet_config()
            self.start_kubelet()
            milestone("kubelet healthy")
            self.wait_ready()
            milestone("node ready")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop everything and remove every process, mount, cgroup and file of this node (idempotent)."""
        for proc in (self.kubelet, self.containerd, self.namespace_holder):
            if proc is not None:
                proc.stop()
        self.kubelet = self.containerd = self.namespace_holder = None
        _clean_folder(self.dir, self.cgroup_name)
        from agent.errors import KubeAPIError

        with contextlib.suppress(KubeAPIError, Exception), self.api() as api:
            api.request("DELETE", f"/api/v1/nodes/{self.name}")

    def _make_cgroup_root(self) -> None:
        for h in hierarchies():
            path = h / self.cgroup_name
            if (h / "cgroup.subtree_control").exists():
                # v2: the kubelet accepts a cgroup root only when it has every controller the machine
                # has (on a hybrid host's unified hierarchy there are none to enable).
                wanted = (h / "cgroup.controllers").read_text().split()
                enabled = (h / "cgroup.subtree_control").read_text().split()
                missing = " ".join(f"+{c}" for c in wanted if c not in enabled)
                if missing:
                    (h / "cgroup.subtree_control").write_text(missing)
            path.mkdir()
            if (path / "cpuset.cpus").exists():
                # A v1 cpuset starts empty and its children copy it; a v2 one reads empty though it
                # inherits: give it the whole machine, which is what the tests read back as the node's.
                v1 = (h / "cpuset.effective_cpus").exists()
                for f in ("cpus", "mems"):
                    source = h / (f"cpuset.effective_{f}" if v1 else f"cpuset.{f}.effective")
                    (path / f"cpuset.{f}").write_text(source.read_text())

    def _start_namespace(self) -> None:
        """The holder of the node's mount namespace, the kubelet's kernel settings bound in it."""
        values = self.dir / "sysctl"
        values.mkdir()
        binds = []
        for name, value in KUBELET_SYSCTLS.items():
            f = values / name.replace("/", ".")
            f.write_text(value + "\n")
            binds.append(f"mount --bind {f} /proc/sys/{name}")
        ready = self.dir / "namespace.ready"
        if self.numa_split:
            from tests.realnode.numa_split import host_cpus, kubelet_node_dir

            nodes = kubelet_node_dir(self.dir / "sys-node", host_cpus())
            binds.append(f"mount --bind {nodes} /sys/devices/system/node")
        if self.device_plugins:
            self.device_plugins_dir.mkdir()
            binds.append(f"mkdir -p {KUBELET_DEVICE_PLUGINS} && "
                         f"mount --bind {self.device_plugins_dir} {KUBELET_DEVICE_PLUGINS}")
        script = " && ".join([*binds, f"touch {ready}", "exec sleep 2147483647"])
        self.namespace_holder = _Process("mount-namespace", ["unshare", "--mount", "--propagation", "private",
                                                             "--", "sh", "-c", script],
                                         self.dir / "namespace.log")
        self._wait(ready.exists, "the node's mount namespace", self.namespace_holder, timeout=30)

    def _in_namespace(self, argv: list[str]) -> list[str]:
        assert self.namespace_holder is not None and self.namespace_holder.running()
        return ["nsenter", f"--target={self.namespace_holder.popen.pid}", "--mount", "--", *argv]

    def start_containerd(self) -> None:
        """Start containerd and wait until it answers on its socket."""
        assert self.containerd is None or not self.containerd.running()
        binary = self.parts.containerd if self.runtime == CONTAINERD_1_6 else str(self.parts.containerd2)
        argv = [binary, "--config", str(self.dir / "containerd.toml")]
        self.containerd = _Process("containerd", self._in_namespace(argv), self.dir / "containerd.log")
        self._wait(lambda: self._ctr_ok("version"), "containerd to answer", self.containerd)

    def stop_containerd(self) -> None:
        """Stop containerd alone (its shims and their containers keep running)."""
        if self.containerd is not None:
            self.containerd.popen.send_signal(signal.SIGTERM)
            self.containerd.popen.wait(30)
            self.containerd = None

    def restart_containerd(self) -> None:
        self.stop_containerd()
        self.start_containerd()

    def start_kubelet(self) -> None:
        """Start the kubelet and wait until its healthz answers."""
        assert self.kubelet is None or not self.kubelet.running()
        kubeconfig = self.cluster.plane.write_kubeconfig(self.dir / "kubelet.kubeconfig",
                                                         self.cluster.plane.admin_token)
        argv = [str(self.parts.kubelet), "--config", str(self.dir / "kubelet.json"),
                "--kubeconfig", str(kubeconfig), "--root-dir", str(self.kubelet_root),
                "--cert-dir", str(self.dir / "kubelet-pki"), "--hostname-override", self.name, "--v", "2"]
        self.kubelet = _Process("kubelet", self._in_namespace(argv), self.dir / "kubelet.log")
        self._wait(self._kubelet_healthy, "the kubelet's healthz", self.kubelet)

    def stop_kubelet(self) -> None:
        """Stop the kubelet alone (containers keep running)."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()

    def _kubelet_healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self._healthz_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _wait(self, check: Callable[[], bool], what: str, proc: _Process | None,
              timeout: float = READY_TIMEOUT_S) -> None:
        slow = emulated()
        deadline = time.monotonic() + timeout * (EMULATED_SLACK if slow else 1.0)
        while not check():
            if proc is not None and not proc.running():
                raise RealNodeError(f"{proc.name} exited with {proc.popen.returncode} waiting for {what}:\n"
                                    f"{proc.log_tail()}")
            if time.monotonic() > deadline:
                raise RealNodeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{self.logs()}")
            time.sleep(EMULATED_POLL_S if slow else 0.2)

    def wait_ready(self) -> None:
        """Wait for the Node to be Ready, then lift the not-ready taint (the lifecycle controller's part)."""
        def ready() -> bool:
            node = self.node_object()
            if node is None:
                return False
            conds = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
            return conds.get("Ready") == "True"

        self._wait(ready, f"Node {self.name} Ready", self.kubelet)
        with self.api() as api:
            node = api.get(f"/api/v1/nodes/{self.name}", timeout=request_timeout())
            taints = [t for t in (node.get("spec") or {}).get("taints") or []
                      if not t["key"].startswith("node.kubernetes.io/not-ready")]
            api.patch(f"/api/v1/nodes/{self.name}", {"spec": {"taints": taints or None}},
                      "application/merge-patch+json", timeout=request_timeout())

    # ---- configuration ---------------------------------------------------------------------------

    def _write_containerd_config(self) -> None:
        if self.runtime == CONTAINERD_2_4 and None in (self.parts.containerd2, self.parts.containerd2_shim):
            raise RealNodeError("containerd 2.4 is not among this node's parts (build.sh containerd)")
        write_config(self.runtime, ContainerdSetup(
            self.dir, self.containerd_socket, self.cgroup_name, self.subnet, self.parts.cni_bin,
            self.parts.runc, root_is_initramfs(), self.parts.containerd2_shim, self.nri_socket,
            self.nri_required_plugins, EMULATED_SLACK if emulated() else 1.0))

    def _write_kubelet_config(self) -> None:
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "failSwapOn": False,
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_name}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1", "port": self._kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self._healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cpuManagerPolicy": self.cpu_manager_policy,
            "cpuManagerReconcilePeriod": "10s",
            "podLogsDir": str(self.dir / "pod-logs"),
            "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE here to lower it
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "registerNode": True,
            "makeIPTablesUtilChains": False,  # no chains in the host's iptables
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
        }
        if self.reserved_cpus:
            config["reservedSystemCPUs"] = self.reserved_cpus
        if self.topology_manager_policy != "none":
            config["topologyManagerPolicy"] = self.topology_manager_policy
        (self.dir / "kubelet.json").write_text(json.dumps(config, indent=1))

    # ---- tools -----------------------------------------------------------------------------------

    def _ctr(self, *args: str, timeout: float = 120.0) -> str:
        done = subprocess.run([self.parts.ctr, "--address", str(self.containerd_socket), "-n", "k8s.io",
                               *args], capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def _ctr_ok(self, *args: str) -> bool:
        try:
            self._ctr(*args)
            return True
        except (RealNodeError, subprocess.TimeoutExpired):
            return False

    def task_pids(self) -> dict[str, int]:
        """Container id → pid of its task, from containerd (`ctr task ls`)."""
        out: dict[str, int] = {}
        for line in self._ctr("tasks", "ls").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[2] == "RUNNING":
                out[fields[0]] = int(fields[1])
        return out

    @contextlib.contextmanager
    def api(self) -> Iterator[Any]:
        """A KubeClient on the cluster (admin), closed afterwards."""
        from agent.kubeapi.client import KubeClient

        client = KubeClient(self.cluster.plane.client())
        try:
            yield client
        finally:
            client.close()

    def node_labels(self) -> dict[str, str]:
        """The Node's labels (none when the Node is gone)."""
        node = self.node_object() or {}
        return dict((node.get("metadata") or {}).get("labels") or {})

    def node_object(self) -> dict[str, Any] | None:
        from agent.errors import KubeAPIError

        with self.api() as api:
            try:
                return dict(api.get(f"/api/v1/nodes/{self.name}", timeout=request_timeout()))
            except KubeAPIError as exc:
                if exc.status == 404:
                    return None
                raise


# ---- pods and the agent on a real node ----------------------------------------------------------

def guaranteed_pod(name: str, node: str, cpu: str | None = "1", memory: str = "64Mi",
                   annotations: dict[str, str] | None = None, limits: bool = True) -> dict[str, Any]:
    """A one-container pod of the busybox image that sleeps, placed on `node` by the scheduler
    (a nodeSelector on the hostname label); Guaranteed with `limits`, else Burstable (`cpu` None:
    no CPU request)."""
    res: dict[str, Any] = {"requests": {"memory": memory, **({"cpu": cpu} if cpu is not None else {})}}
    if limits:
        res["limits"] = dict(res["requests"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                     "enableServiceLinks": False,
                     "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["/bin/sleep", "2147483647"], "resources": res}]}}


def container_id(pod: dict[str, Any], name: str = "c") -> str | None:
    """The bare runtime id of a running container of `pod` (None until it runs)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == name and "running" in (cs.get("state") or {}) and cs.get("containerID"):
            return str(cs["containerID"]).partition("://")[2]
    return None


def proc_cgroup(pid: int, controller: str = "cpuset") -> str:
    """The cgroup of `pid` in the v1 hierarchy of `controller` (or the unified one), from /proc."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(",") or (controller == "" and controllers == ""):
                return path
    raise RealNodeError(f"process {pid} has no {controller} cgroup")


def proc_affinity(pid: int) -> str:
    """`Cpus_allowed_list` of `pid`."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise RealNodeError(f"no affinity for {pid}")


def cpuset_of(pid: int) -> tuple[Path, str]:
    """(cgroup folder, its cpuset.cpus) of the cgroup the runtime put `pid` in."""
    mount = _v1_cpuset_mount()
    base = mount if mount is not None else CGROUP_MOUNT
    folder = base / proc_cgroup(pid, "cpuset" if mount is not None else "").lstrip("/")
    return folder, (folder / "cpuset.cpus").read_text().strip()


class NodeAgent:
    """`topolet agent` as a host process against a real node: its kubelet's pod-resources socket, its
    cgroups (the kubelet's cgroup root as the agent's --cgroup-root), the Node's labels (sink `node`)."""

    def __init__(self, node: RealNode, *extra: str) -> None:
        self.node = node
        self.extra = extra
        self.state_dir = node.dir / "topolet-state"
        self.proc: _Process | None = None

    def start(self, *more: str) -> _Process:
        from tests.conftest import REPO, topolet_bin

        assert self.proc is None or not self.proc.running()
        kc = self.node.cluster.plane.write_kubeconfig(self.node.dir / "agent.kubeconfig",
                                                      self.node.cluster.plane.admin_token)
        argv = [topolet_bin(), "agent", "--mode", "kubernetes", "--kubeconfig", str(kc),
                "--node-name", self.node.name, "--state-dir", str(self.state_dir),
                "--cgroup-root", str(self.node.cpuset_root),
                "--pod-resources-socket", str(self.node.pod_resources_socket),
                "--label-sink", "node", "--listen", "127.0.0.1:0", "--reconcile-seconds", "1",
                "--runtime-bundles", str(self.node.dir / "containerd-state" / "io.containerd.runtime.v2.task"
                                         / "k8s.io"),
                *self.extra, *more]
        self.proc = _Process("agent", argv, self.node.dir / "agent.log",
                             env={"POD_NAMESPACE": "default", "PYTHONPATH": str(REPO)})
        return self.proc

    def running(self) -> bool:
        return self.proc is not None and self.proc.running()

    def kill(self) -> None:
        """SIGKILL the agent (a crash: no clean-up of its own)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.popen.pid, signal.SIGKILL)
            self.proc.popen.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def log(self) -> str:
        return self.proc.log_tail(1 << 20) if self.proc is not None else (
            (self.node.dir / "agent.log").read_text(errors="replace")
            if (self.node.dir / "agent.log").exists() else "")

    def metrics_port(self) -> int | None:
        m = re.findall(r"serving /metrics and /healthz on [^:]*:(\d+)", self.log())
        return int(m[-1]) if m else None

    def state(self) -> Any:
        """The agent's allocation state (agent.enforce.state.State)."""
        from agent.enforce.state_file import StateFile

        return StateFile(str(self.state_dir)).load(missing_ok=True)


class WriteCounter:
    """Counts writes to files (cgroup files included) with inotify, read promptly on a thread so that
    consecutive writes are not merged into one event.  `with WriteCounter(paths) as w: ...; w.counts`."""

    IN_MODIFY = 0x2

    def __init__(self, paths: list[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._paths: dict[int, Path] = {}
        for p in paths:
            wd = self._libc.inotify_add_watch(self._fd, str(p).encode(), self.IN_MODIFY)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {p}")
            self._paths[wd] = p
        self.counts: dict[Path, int] = dict.fromkeys(paths, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="write-counter", daemon=True)

    def _run(self) -> None:
        import select
        import struct

        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if not ready:
                continue
            with contextlib.suppress(BlockingIOError):
                data = os.read(self._fd, 1 << 16)
                off = 0
                while off + 16 <= len(data):
                    wd, _mask, _cookie, length = struct.unpack_from("iIII", data, off)
                    off += 16 + length
                    if wd in self._paths:
                        self.counts[self._paths[wd]] += 1

    def __enter__(self) -> WriteCounter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._fd)


# ---- the DaemonSet's own pod on a real node ------------------------------------------------------

IMAGE_ENV = REPO / "build" / "image" / "image.env"
AGENT_NS = "topolet-system"
LOCAL_IMAGE = "localhost/topolet:0.1.0"  # what daemonset/components/local-image runs


@contextlib.contextmanager
def image_build_lock() -> Iterator[None]:
    """Hold image/build.sh's lock (shared): a build under way finishes before its output is read."""
    lock = IMAGE_ENV.parent / ".lock"
    if not lock.exists():
        yield
        return
    import fcntl

    with open(lock) as f:
        # A read-only 9p share (tests/vm's guest) may refuse locks: no build runs there meanwhile.
        with contextlib.suppress(OSError):
            fcntl.flock(f, fcntl.LOCK_SH)
        yield


def image_env() -> dict[str, str]:
    """What `make image` wrote (image/build.sh: IMAGE_REF, IMAGE_ARCHIVE, sizes); {} before it ran."""
    with image_build_lock():
        if not IMAGE_ENV.exists():
            return {}
        return dict(line.split("=", 1) for line in IMAGE_ENV.read_text().splitlines() if "=" in line)


def start_daemonset_controller(cluster: Cluster) -> _Process:
    """A kube-controller-manager that runs only the DaemonSet controller, on the cluster's plane."""
    return start_controller_manager(cluster, "daemonset", ("daemonset-controller",))


def start_controller_manager(cluster: Cluster, name: str, controllers: Sequence[str]) -> _Process:
    """A kube-controller-manager of a test's own (`kube-controller-manager-<name>`) running only
    `controllers`, beside the cluster's (which runs the Job, namespace and garbage collectors)."""
    plane = cluster.plane

    def argv(port: int) -> list[str]:
        kc = plane.write_kubeconfig(cluster.workdir / f"kcm-{name}.kubeconfig",
                                    plane.controller_manager_token, user="kube-controller-manager")
        return [str(cluster.binaries.kube_controller_manager), "--kubeconfig", str(kc),
                "--bind-address", "127.0.0.1", "--secure-port", str(port),
                "--cert-dir", str(cluster.workdir / f"kcm-{name}-certs"), "--leader-elect=false",
                "--controllers", ",".join(controllers), "--use-service-account-credentials=true",
                "--service-account-private-key-file", str(plane.pki / "sa.key"),
                "--root-ca-file", str(plane.ca_file), "--profiling=false"]

    return cluster._start(f"kube-controller-manager-{name}", argv)


def write_overlay(folder: Path, node: RealNode, image_ref: str, metrics_port: int) -> Path:
    """An overlay of daemonset/ for `node`: the base with its local-image component (the image imported
    into the node's containerd, pull policy Never), and only what this test machine needs on top: a
    nodeSelector on the node (a session's cluster also has simulated nodes); hostNetwork with
    KUBERNETES_SERVICE_HOST/PORT set to the test API server, which listens on 127.0.0.1 only (no
    kube-proxy routes the `kubernetes` Service here) and a free metrics port; the node's own host
    paths (its kubelet's pod-resources folder, a state and a features.d folder, and an NRI socket
    folder of its own: never this machine's /var/run/nri, whose socket may belong to another runtime;
    the node's containerd 1.6 has no NRI, so --route auto finds no socket there and takes the
    pod-cgroup route); the kubelet's cgroup root as --cgroup-root; no reserved CPU (a 2-CPU machine
    would have nothing to pin otherwise)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(REPO / "daemonset", folder)
    api_port = node.cluster.plane.url.rsplit(":", 1)[1]
    state, features = node.dir / "agent-state", node.dir / "agent-features.d"
    spec, c = "/spec/template/spec", "/spec/template/spec/containers/0"
    host = {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"{spec}/nodeSelector", "value": {"kubernetes.io/hostname": node.name}},
        {"op": "add", "path": f"{spec}/hostNetwork", "value": True},
        {"op": "add", "path": f"{c}/env/-", "value": host},
        {"op": "add", "path": f"{c}/env/-", "value": {"name": "KUBERNETES_SERVICE_PORT", "value": api_port}},
        {"op": "add", "path": f"{c}/args/-", "value": f"--cgroup-root={node.cpuset_root}"},
        {"op": "add", "path": f"{c}/args/-", "value": f"--listen=0.0.0.0:{metrics_port}"},
        {"op": "add", "path": f"{c}/args/-", "value": "--reserved-cpus="},
        {"op": "add", "path": f"{c}/args/-", "value": "--reconcile-seconds=1"},
        {"op": "replace", "path": f"{c}/ports/0/containerPort", "value": metrics_port},
        {"op": "replace", "path": "/spec/template/spec/volumes/3/hostPath/path", "value": str(state)},
        {"op": "replace", "path": "/spec/template/spec/volumes/4/hostPath/path", "value": str(features)},
        {"op": "replace", "path": "/spec/template/spec/volumes/5/hostPath/path",
         "value": str(node.kubelet_root / "pod-resources")},
        {"op": "test", "path": "/spec/template/spec/volumes/7/name", "value": "nri"},
        {"op": "replace", "path": "/spec/template/spec/volumes/7/hostPath/path",
         "value": str(node.dir / "agent-nri")},
    ]
    if emulated():
        # Python starts in minutes, not seconds, under emulation: probes that a real machine passes
        # would kill the agent before it serves (its startup probe allows 60 s).
        ops += [
            {"op": "replace", "path": f"{c}/startupProbe/failureThreshold", "value": 300},
            {"op": "replace", "path": f"{c}/livenessProbe/timeoutSeconds", "value": 20},
            {"op": "replace", "path": f"{c}/livenessProbe/failureThreshold", "value": 10},
            {"op": "replace", "path": f"{c}/readinessProbe/timeoutSeconds", "value": 20},
        ]
    if image_ref != LOCAL_IMAGE:
        raise RealNodeError(f"the image is {image_ref}; daemonset/components/local-image runs {LOCAL_IMAGE}")
    (folder / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [base], "components": [f"{base}/components/local-image"],
        "patches": [{"target": {"kind": "DaemonSet", "name": "topolet-agent"}, "patch": json.dumps(ops)}],
    }, indent=1))
    return folder


class DaemonSetAgent:
    """The agent as the DaemonSet's pod on `node`, from the image of `make image` (see write_overlay):
    start() imports the image, starts a DaemonSet controller, `kubectl apply -k`s the overlay and waits
    for the pod to run; stop() deletes the DaemonSet and the namespace."""

    def __init__(self, node: RealNode, env: dict[str, str], *, kubectl: Path | None = None,
                 start_controller: bool = True) -> None:
        """`kubectl` None: build.sh's; `start_controller` False where another machine runs the cluster's
        DaemonSet controller (tests/realnode/remote.py)."""
        self.node = node
        self.env = env
        self.kubectl = kubectl
        self.start_controller = start_controller
        self.pod: dict[str, Any] | None = None
        self._controller: _Process | None = None
        self._kubectl: Any = None

    def start(self) -> dict[str, Any]:
        from tests.controlplane.kubectl import Kubectl, build_kubectl

        node = self.node
        with image_build_lock():
            # Minutes under emulation (tests/vm's guest): 220 MB read, hashed and unpacked.
            node._ctr("images", "import", self.env["IMAGE_ARCHIVE"], timeout=IMPORT_TIMEOUT_S)
        milestone("agent image imported")
        if self.start_controller:
            self._controller = start_daemonset_controller(node.cluster)
        self._kubectl = Kubectl(self.kubectl or build_kubectl(), node.cluster.plane.kubeconfig)
        overlay = write_overlay(node.dir / "overlay", node, self.env["IMAGE_REF"], free_port())
        self._kubectl.run("apply", "-k", str(overlay))

        found: list[dict[str, Any]] = []

        def running() -> bool:
            with node.api() as api:
                found[:] = [p for p in api.list(f"/api/v1/namespaces/{AGENT_NS}/pods")["items"]
                            if p["spec"].get("nodeName") == node.name and container_id(p, "agent")]
            return bool(found)

        node._wait(running, "the DaemonSet's pod running on the real node", None, timeout=180)
        milestone("daemonset pod running")
        self.pod = found[0]
        return self.pod

    def pid(self) -> int:
        """The agent container's process (its task in containerd)."""
        assert self.pod is not None
        cid = str(container_id(self.pod, "agent"))
        pids: dict[str, int] = {}

        def started() -> bool:
            pids.update(self.node.task_pids())
            return cid in pids

        self.node._wait(started, "the agent's task", None, timeout=60)
        return pids[cid]

    def memory_bytes(self) -> int:
        """The agent container's memory use as its cgroup counts it (memory.current on cgroup v2,
        memory.usage_in_bytes on v1): what its 128Mi limit is held against."""
        pid = self.pid()
        mount = next((h for h in hierarchies() if (h / "memory.usage_in_bytes").exists()), None)
        if mount is not None:
            return int((mount / proc_cgroup(pid, "memory").lstrip("/") / "memory.usage_in_bytes").read_text())
        return int((CGROUP_MOUNT / proc_cgroup(pid, "").lstrip("/") / "memory.current").read_text())

    def logs(self) -> str:
        if self._kubectl is None:
            return ""
        done = self._kubectl.run("logs", "-n", AGENT_NS, "daemonset/topolet-agent", "--tail=60", check=False)
        if done.returncode == 0:
            return f"--- DaemonSet agent ---\n{done.stdout}"
        # The API server cannot reach a kubelet in a guest: read the container's log files there.
        files = sorted((self.node.dir / "pod-logs").glob(f"{AGENT_NS}_*/agent/*.log"))
        tails = "".join(f"{f}:\n{f.read_text(errors='replace')[-4000:]}" for f in files)
        return f"--- DaemonSet agent ---\n{done.stderr}{tails}"

    def stop(self) -> None:
        if self._kubectl is not None:
            self._kubectl.run("delete", "-n", AGENT_NS, "daemonset/topolet-agent", "--ignore-not-found",
                              "--wait=true", "--timeout=60s", check=False)
            self._kubectl.run("delete", "namespace", AGENT_NS, "--ignore-not-found", "--wait=false",
                              check=False)
            self._kubectl = None
        if self._controller is not None:
            self._controller.stop()
            self._controller = None
