"""The real node's containerd configuration (tests/realnode/node.py): Debian's 1.6, or 2.4.2 with NRI.

`CONTAINERD_1_6` is Debian's containerd 1.6 (`make deps`), the node's default: a version-2 config.
`CONTAINERD_2_4` is containerd v2.4.2 and its runc shim built by `tests/controlplane/build.sh
containerd containerd-shim-runc-v2` with its NRI plugin on: a version-3 config, as proven on hosts
like this one in docs/recipes/containerd-2.4-nri.md.  Its NRI socket is the node's own
(`<node dir>/nri.sock`, never /var/run/nri/nri.sock, which may belong to another runtime), its plugin
folders are empty ones of the node's (containerd launches no plugin of the host's), and with
`required_plugins` NRI's default validator refuses a container while a plugin so named is not
connected (a pod may still opt out with the annotation TOLERATE_MISSING_PLUGINS = "true").

Both share what the node owns: root, state, socket, runc root and the CNI network (the `ptp`
plugin, a /24 of its own, host-local addresses kept in the node's folder), the busybox image of
`tests.realnode.images` as the sandbox ("pause") image, `restrict_oom_score_adj` (these hosts
withhold CAP_SYS_RESOURCE: runc fails "can't get final child's PID from pipe" without it) and the
cgroupfs driver (the kubelet takes it from the CRI runtime).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.realnode.images import IMAGE

CONTAINERD_1_6 = "containerd-1.6"
CONTAINERD_2_4 = "containerd-2.4"
RUNTIMES = (CONTAINERD_1_6, CONTAINERD_2_4)
# The default validator's opt-out annotation (the recipe's; NRI names no default).
TOLERATE_MISSING_PLUGINS = "tolerate-missing-plugins.nri.io"
NRI_REGISTRATION_TIMEOUT_S = 5.0
NRI_REQUEST_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ContainerdSetup:
    """What a node's containerd config names: its folder, socket, CNI network, runc and (2.4) shim."""

    folder: Path
    socket: Path
    network: str  # the CNI network's name
    subnet: str
    cni_bin: str
    runc: str
    no_pivot_root: bool  # the root is an initramfs (tests/vm's guest): pivot_root(2) refuses it
    shim: Path | None = None  # containerd-shim-runc-v2 of 2.4.2 (Debian's 1.6 shim is in /usr/bin)
    nri_socket: Path | None = None
    required_plugins: tuple[str, ...] = ()
    # NRI's timeouts are multiplied by this (tests/vm's emulated guest: a plugin answers in seconds).
    nri_timeout_scale: float = 1.0


def write_config(runtime: str, setup: ContainerdSetup) -> Path:
    """Write the CNI network and `runtime`'s config into setup.folder; the config's path."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}: one of {', '.join(RUNTIMES)}")
    cni_conf = setup.folder / "cni"
    cni_conf.mkdir(exist_ok=True)
    (cni_conf / "10-topolet-rn.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": setup.network,
        "plugins": [{"type": "ptp", "ipMasq": False, "ipam": {
            "type": "host-local", "ranges": [[{"subnet": setup.subnet}]],
            "dataDir": str(setup.folder / "cni-ipam")}}]}))
    path = setup.folder / "containerd.toml"
    path.write_text(config_1_6(setup, cni_conf) if runtime == CONTAINERD_1_6 else config_2_4(setup, cni_conf))
    return path


def config_1_6(setup: ContainerdSetup, cni_conf: Path) -> str:
    """containerd 1.6's version-2 config."""
    d = setup.folder
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d}/containerd-root"
state = "{d}/containerd-state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{setup.socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd-opt"
[{cri}]
  sandbox_image = "{IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_port = "0"
  [{cri}.cni]
    bin_dir = "{setup.cni_bin}"
    conf_dir = "{cni_conf}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{_runc_options(f"{cri}.containerd.runtimes.runc", setup)}"""


def config_2_4(setup: ContainerdSetup, cni_conf: Path) -> str:
    """containerd 2.4's version-3 config with NRI on (its plugin folders made empty here)."""
    if setup.shim is None or setup.nri_socket is None:
        raise ValueError("containerd 2.4 needs its own runc shim and an NRI socket")
    d = setup.folder
    for folder in ("nri-plugins", "nri-conf.d"):
        (d / folder).mkdir(exist_ok=True)
    nri = "plugins.'io.containerd.nri.v1.nri'"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    validator = ""
    if setup.required_plugins:
        validator = f"""  [{nri}.default_validator]
    enable = true
    required_plugins = {_toml_strings(setup.required_plugins)}
    tolerate_missing_plugins_annotation = "{TOLERATE_MISSING_PLUGINS}"
"""
    return f"""version = 3
root = "{d}/containerd-root"
state = "{d}/containerd-state"
disabled_plugins = ["io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{setup.socket}"
[ttrpc]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/containerd-opt"
[{nri}]
  disable = false
  disable_connections = false
  socket_path = "{setup.nri_socket}"
  plugin_path = "{d}/nri-plugins"
  plugin_config_path = "{d}/nri-conf.d"
  plugin_registration_timeout = "{NRI_REGISTRATION_TIMEOUT_S * setup.nri_timeout_scale:g}s"
  plugin_request_timeout = "{NRI_REQUEST_TIMEOUT_S * setup.nri_timeout_scale:g}s"
{validator}[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{IMAGE}"
[{runtime}]
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [{runtime}.cni]
    bin_dirs = ["{setup.cni_bin}"]
    conf_dir = "{cni_conf}"
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{setup.shim}"
{_runc_options(f"{runtime}.containerd.runtimes.runc", setup)}[plugins.'io.containerd.grpc.v1.cri']
  stream_server_port = "0"
"""


def _runc_options(table: str, setup: ContainerdSetup) -> str:
    """The runc runtime's options, the same under both config versions (the table's name differs)."""
    return f"""      [{table}.options]
        BinaryName = "{setup.runc}"
        Root = "{setup.folder}/runc"
        SystemdCgroup = false
        NoPivotRoot = {str(setup.no_pivot_root).lower()}
"""


def _toml_strings(values: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"
