"""Serving a controller's admission webhooks from this host to a test cluster's API server.

Shared by Kueue (`kueue.py`) and the training operators (`operators.py`): a webhook Service without a
selector plus an EndpointSlice on a non-loopback address of this host (`webhook_address()`; the API
server runs with `--enable-aggregator-routing=true`, so it dials the EndpointSlice, and it refuses
loopback there), the serving certificate either written by the controller's own cert management into
a Secret that `SecretVolume` copies to its cert dir (the kubelet's part), or made here by
`serving_certificate()` with the CA put in the webhook configurations (`with_ca_bundle()`), as
cert-manager does for upstream's cert-manager installs. `manifests()` reads a kustomization's
resources with its JSON 6902 patches applied, the subset of kustomize the upstream configs use.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import fcntl
import ipaddress
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.controlplane.harness import ControlPlaneError, openssl

# netdevice(7): an interface's flags and its (first) IPv4 address.
_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP = 0x8913, 0x8915, 0x1
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def webhook_address() -> str:
    """A non-loopback, non-link-local IPv4 address of an interface of this host that is up: where the
    webhooks are served. The API server refuses loopback and link-local addresses in EndpointSlices."""
    for _index, name in socket.if_nameindex():
        request = struct.pack("256s", name.encode()[:15])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request), 16)[0]
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on this interface
                continue
        address = ipaddress.IPv4Address(packed[20:24])
        if flags & _IFF_UP and not (address.is_loopback or address.is_link_local or address.is_unspecified):
            return str(address)
    raise ControlPlaneError("this host has no non-loopback IPv4 address for a webhook endpoint")


# libyaml's parser where PyYAML has it: the operators' CRDs are megabytes, seconds in pure Python.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def apply_json6902(doc: dict[str, Any], ops: Sequence[Mapping[str, Any]]) -> None:
    """Apply JSON patch operations (add, replace, remove) to `doc` in place."""
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op["op"] == "add":
                node.insert(index, copy.deepcopy(op["value"]))
            else:
                node[index] = copy.deepcopy(op["value"])
        else:
            node[last] = copy.deepcopy(op["value"])


def manifests(directory: Path) -> list[dict[str, Any]]:
    """The documents of `directory`'s kustomization.yaml resources, with its patches that are JSON 6902
    operation lists applied to their targets (matched by kind, and by name when the target names one);
    strategic-merge patches are left to the caller."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs = [d for resource in kustomization.get("resources") or []
            for d in load_yaml_docs(directory / resource)]
    for patch in kustomization.get("patches") or []:
        target = patch.get("target")
        if target is None or "path" not in patch:
            continue
        ops = yaml.safe_load((directory / patch["path"]).read_text())
        if not isinstance(ops, list):
            continue
        for doc in docs:
            named = target.get("name") in (None, doc["metadata"]["name"])
            if doc.get("kind") == target.get("kind") and named:
                apply_json6902(doc, ops)
    return docs


def create_or_keep(api: Any, path: str, body: Mapping[str, Any]) -> None:
    """Create `body` in collection `path`; one that exists already is kept as it is."""
    from agent.errors import KubeAPIError

    try:
        api.create(path, body)
    except KubeAPIError as exc:
        if exc.status != 409:
            raise


def install_webhook_endpoint(api: Any, namespace: str, service: str, address: str, port: int) -> None:
    """Service `service` (no selector) in `namespace` and its EndpointSlice at address:port (replaced)."""
    from agent.errors import KubeAPIError
    from agent.kubeapi.client import resource_path

    create_or_keep(api, resource_path("", "v1", "services", namespace=namespace), {
        "metadata": {"name": service},
        # Unnamed port: the API server matches it to the EndpointSlice port named "".
        "spec": {"ports": [{"port": 443, "protocol": "TCP", "targetPort": port}]},
    })
    slices = resource_path("discovery.k8s.io", "v1", "endpointslices", namespace=namespace)
    body = {
        "metadata": {"name": service, "labels": {
            "kubernetes.io/service-name": service,
            "endpointslice.kubernetes.io/managed-by": "tests.topolet.io"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "", "port": port, "protocol": "TCP"}],
    }
    with contextlib.suppress(KubeAPIError):
        api.request("DELETE", f"{slices}/{service}")
    api.create(slices, body)


def wait_crds_established(api: Any, names: Sequence[str], timeout_s: float) -> None:
    """Wait until every CRD in `names` has its Established condition."""
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            crd = api.get(f"{CRD_PATH}/{name}")
            conditions = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CRD {name} not established: {conditions}")
            time.sleep(0.1)


def webhook_ca(directory: Path) -> Path:
    """A CA for webhook serving certificates in `directory` (ca.crt, ca.key), made once; ca.crt's path."""
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the `openssl` command is needed to generate the webhook certificates")
    directory.mkdir(parents=True, exist_ok=True)
    ca_crt = directory / "ca.crt"
    if not ca_crt.exists():
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", str(directory / "ca.key"), "-out", str(ca_crt), "-days", "30",
                 "-subj", "/CN=topolet-test-webhook-ca",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return ca_crt


def serving_certificate(ca_crt: Path, cert_dir: Path, dns_name: str) -> None:
    """tls.crt and tls.key in `cert_dir` for `dns_name` (a Service's <name>.<namespace>.svc, the name
    the API server checks when it calls a webhook Service), signed by the CA of webhook_ca()."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    key, csr, crt = cert_dir / "tls.key", cert_dir / "tls.csr", cert_dir / "tls.crt"
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={dns_name}")
    ext = cert_dir / "tls.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{dns_name}\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_crt.with_suffix(".key")),
             "-CAcreateserial", "-out", str(crt), "-days", "30", "-extfile", str(ext))
    key.chmod(0o600)


def with_ca_bundle(config: Mapping[str, Any], ca_crt: Path, namespace: str, service: str) -> dict[str, Any]:
    """A webhook configuration whose webhooks all call Service namespace/service trusting `ca_crt`."""
    out = copy.deepcopy(dict(config))
    bundle = base64.b64encode(ca_crt.read_bytes()).decode()
    for hook in out["webhooks"]:
        hook["clientConfig"]["service"].update(namespace=namespace, name=service)
        hook["clientConfig"]["caBundle"] = bundle
    return out


class SecretVolume:
    """The kubelet's secret volume for a controller's serving cert: the Secret's keys as files in a
    directory.

    Cert rotators such as Kueue's write their CA and serving cert to a Secret and wait until a kubelet
    has mounted that Secret at their cert dir (`tls.crt` there); with no kubelet, this thread copies
    the Secret's data there (each file written aside, then renamed, as the kubelet swaps its
    atomic-writer directory) whenever it changes.
    """

    def __init__(self, plane: Any, namespace: str, name: str, directory: Path,
                 interval_s: float = 0.25) -> None:
        self.plane = plane
        self.path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        self.directory = directory
        self.interval_s = interval_s
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"secret-volume-{name}", daemon=True)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        from agent.errors import KubeAPIError
        from agent.kubeapi.client import KubeClient

        api = KubeClient(self.plane.client())
        seen = ""
        try:
            while not self._stop.is_set():
                try:
                    secret = api.get(self.path)
                    version = secret["metadata"]["resourceVersion"]
                    if version != seen and secret.get("data"):
                        self._write(secret["data"])
                        seen = version
                except KubeAPIError as exc:
                    if not self._stop.is_set():
                        self.errors.append(str(exc))
                self._stop.wait(self.interval_s)
        finally:
            api.close()

    def _write(self, data: Mapping[str, str]) -> None:
        for key, value in data.items():
            target = self.directory / key
            aside = self.directory / f".{key}.tmp"
            aside.write_bytes(base64.b64decode(value))
            aside.chmod(0o600)
            os.replace(aside, target)
