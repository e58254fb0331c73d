"""Combines single-architecture OCI layouts (image/build.sh's `oci/`) into one multi-architecture image.

Usage: python image/index.py OUT REF LAYOUT [LAYOUT ...]

Writes OUT as an OCI layout whose REF names an image index (application/vnd.oci.image.index.v1+json)
listing each LAYOUT's image under REF with its platform (`linux/<architecture>`, read from the image's
config), and hard-links (or copies) every blob it needs. Prints the index's digest. No registry and no
container storage: the index is a function of its manifests alone, so the same images give the same
digest (the order is by architecture, whatever order the layouts come in).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


class LayoutError(RuntimeError):
    """A layout is not what image/build.sh writes (no manifest under REF, a blob missing)."""


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _manifest_for(layout: Path, ref: str) -> dict[str, Any]:
    """The descriptor of the image manifest that `layout`'s index.json names `ref`."""
    index = json.loads((layout / "index.json").read_text())
    for descriptor in index.get("manifests", []):
        if descriptor.get("annotations", {}).get(REF_NAME) == ref and descriptor["mediaType"] == MANIFEST:
            return dict(descriptor)
    raise LayoutError(f"{layout}: no image manifest named {ref!r}")


def _link(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _write_blob(out: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = _blob(out, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def combine(out: Path, ref: str, layouts: list[Path]) -> str:
    """Write the multi-architecture layout `out` from `layouts`; the image index's digest."""
    entries: list[dict[str, Any]] = []
    for layout in layouts:
        descriptor = _manifest_for(layout, ref)
        manifest = json.loads(_blob(layout, descriptor["digest"]).read_bytes())
        config = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())
        platform = {"architecture": config["architecture"], "os": config["os"]}
        if config.get("variant"):
            platform["variant"] = config["variant"]
        for digest in [descriptor["digest"], manifest["config"]["digest"],
                       *(layer["digest"] for layer in manifest["layers"])]:
            source = _blob(layout, digest)
            if not source.is_file():
                raise LayoutError(f"{layout}: blob {digest} is missing")
            _link(source, _blob(out, digest))
        entries.append({"mediaType": MANIFEST, "digest": descriptor["digest"], "size": descriptor["size"],
                        "platform": platform})
    architectures = [e["platform"]["architecture"] for e in entries]
    if len(set(architectures)) != len(architectures):
        raise LayoutError(f"two images for one architecture: {architectures}")
    entries.sort(key=lambda e: (e["platform"]["architecture"], e["platform"].get("variant", "")))
    body = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries},
                      separators=(",", ":")).encode()
    digest = _write_blob(out, body)
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    top = {"schemaVersion": 2, "manifests": [
        {"mediaType": INDEX, "digest": digest, "size": len(body), "annotations": {REF_NAME: ref}}]}
    (out / "index.json").write_text(json.dumps(top, separators=(",", ":")))
    return digest


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out, ref, layouts = Path(argv[0]), argv[1], [Path(a) for a in argv[2:]]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        print(combine(out, ref, layouts))
    except (LayoutError, OSError, KeyError, ValueError) as e:
        print(f"index.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
