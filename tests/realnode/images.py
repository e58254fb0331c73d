"""The real node's only image, built here from Debian's busybox-static: no registry, no base image.

`busybox_image()` writes an OCI image layout tarball (what `ctr images import` reads) holding one
uncompressed layer: `/bin/busybox` and a link per applet the tests run.  Its default command sleeps
forever, so the same image serves as containerd's sandbox ("pause") image and as the test pods'
image.  The tarball is reproducible (fixed times, owners and order) and cached under
`${TOPOLET_CACHE_DIR:-~/.cache/topolet}/realnode/`, keyed by the busybox binary's digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
IMAGE = "localhost/topolet/busybox:test"  # sandbox image and test containers' image alike
APPLETS = ("sh", "sleep", "cat", "true", "ls")
SLEEP_FOREVER = ["/bin/sleep", "2147483647"]


def cache_dir() -> Path:
    """The real node's cache folder (shared with tests/controlplane/build.sh's root)."""
    base = os.environ.get("TOPOLET_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "topolet")
    return Path(base) / "realnode"


def _layer(busybox: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for d in ("bin", "proc", "sys", "dev", "etc", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            add(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        add(info, busybox)
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            add(info)
    return out.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest[7:]}")
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))
    return digest, len(data)


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def busybox_image() -> Path:
    """The OCI layout tarball of IMAGE, built once per busybox binary (cached)."""
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} is missing (Debian package busybox-static)")
    busybox = BUSYBOX.read_bytes()
    key = hashlib.sha256(busybox + _json([IMAGE, APPLETS, SLEEP_FOREVER])).hexdigest()[:12]
    path = cache_dir() / f"busybox-{key}.oci.tar"
    if path.exists():
        return path
    layer = _layer(busybox)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = _json({"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
                    "config": {"Env": ["PATH=/bin"], "Cmd": SLEEP_FOREVER},
                    "rootfs": {"type": "layers", "diff_ids": [diff_id]}})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        layer_d, layer_n = _blob(tar, layer)
        config_d, config_n = _blob(tar, config)
        manifest = _json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                          "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                     "digest": config_d, "size": config_n},
                          "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                      "digest": layer_d, "size": layer_n}]})
        manifest_d, manifest_n = _blob(tar, manifest)
        index = _json({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_d,
            "size": manifest_n, "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": IMAGE,
                            "org.opencontainers.image.ref.name": IMAGE.rpartition(":")[2]}}]})
        for name, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", index)):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)
    return path
