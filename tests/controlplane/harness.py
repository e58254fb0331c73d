"""A real etcd + kube-apiserver on loopback, built from the Go module proxy, for the Kubernetes tests."""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"

# A cold build of kube-apiserver on two cores takes several minutes; a cached one returns at once.
BUILD_TIMEOUT_S = 60 * 60
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
PROFILING_ENV = "TOPOLET_API_PROFILING"  # set: the API server serves /debug/pprof (benchmarks only)
ADMIN_USER = "admin"
UNPRIVILEGED_USER = "nobody"
# The identities kubeadm gives these components (their certificates' CNs); RBAC's default bindings
# grant them what they need, so the test cluster runs them with no extra role.
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
DEFAULT_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


@dataclass(frozen=True)
class Binaries:
    """Paths of the built control-plane executables."""

    etcd: Path
    kube_apiserver: Path


def build_components(*components: str, timeout_s: float = BUILD_TIMEOUT_S) -> dict[str, Path]:
    """Build (or find in the cache) control-plane components through build.sh; name → binary path."""
    if shutil.which("go") is None:
        raise ControlPlaneError(f"the Go toolchain (`go`) is not on PATH; it builds {', '.join(components)}")
    try:
        done = subprocess.run(
            [str(BUILD_SCRIPT), *components],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ControlPlaneError(f"build.sh took longer than {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise ControlPlaneError(f"build.sh failed ({done.returncode}):\n{done.stderr[-4000:]}")
    paths = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    missing = [c for c in components if c not in paths]
    if missing:
        raise ControlPlaneError(f"build.sh printed no path for {missing}: {done.stdout!r}")
    return {c: Path(paths[c]) for c in components}


def build_binaries(timeout_s: float = BUILD_TIMEOUT_S) -> Binaries:
    """Build (or find in the cache) etcd and kube-apiserver through build.sh and return their paths."""
    paths = build_components("etcd", "kube-apiserver", timeout_s=timeout_s)
    return Binaries(etcd=paths["etcd"], kube_apiserver=paths["kube-apiserver"])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def decode_jwt_payload(token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified (the tests read what the API server signed)."""
    payload = token.split(".")[1]
    payload += "=" * (-len(payload) % 4)
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload))
    return claims


def openssl(*args: str) -> None:
    """Run the `openssl` command with `args`; ControlPlaneError with its stderr when it fails."""
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()}")


def generate_pki(pki: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1/localhost signed by it, and a service-account key."""
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the `openssl` command is needed to generate the test certificates")
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = pki / "ca.key", pki / "ca.crt"
    key, csr, crt = pki / "apiserver.key", pki / "apiserver.csr", pki / "apiserver.crt"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(ca_key), "-out", str(ca_crt), "-days", "30", "-subj", "/CN=topolet-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
    ext = pki / "apiserver.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
    )
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(crt), "-days", "30", "-extfile", str(ext))
    # The API server signs service-account tokens with this key and verifies them with the same file.
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", str(pki / "sa.key"))


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the thread that spawned us dies, so a killed test run leaves none."""
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class _Process:
    """One child in its own process group, its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log: Path,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            # The death signal follows the spawning *thread*; only tie it to the main thread, which lives
            # as long as the test run (a helper thread that restarts the API server may end early).
            tie = threading.current_thread() is threading.main_thread()
            self.popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent if tie else None,
                env=None if env is None else {**os.environ, **env},
            )

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the whole group, SIGKILL it if it lingers, and reap the child."""
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        # Anything the leader left behind in its group goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


class ControlPlane:
    """etcd and kube-apiserver on loopback ports with token authentication and RBAC."""

    def __init__(self, binaries: Binaries, workdir: Path) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.pki = workdir / "pki"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.admin_token = uuid.uuid4().hex
        self.unprivileged_token = uuid.uuid4().hex
        self.controller_manager_token = uuid.uuid4().hex
        self.scheduler_token = uuid.uuid4().hex
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._lock = threading.Lock()

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start etcd, then the API server, and wait until both are ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        generate_pki(self.pki)
        (self.workdir / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},{ADMIN_USER}-uid,"system:masters"\n'
            f"{self.unprivileged_token},{UNPRIVILEGED_USER},{UNPRIVILEGED_USER}-uid\n"
            f"{self.controller_manager_token},{CONTROLLER_MANAGER_USER},{CONTROLLER_MANAGER_USER}-uid\n"
            f"{self.scheduler_token},{SCHEDULER_USER},{SCHEDULER_USER}-uid\n"
        )
        atexit.register(self.stop)
        self._start_etcd()
        self.start_apiserver()
        self.write_kubeconfig(self.kubeconfig, self.admin_token)

    def stop(self) -> None:
        """Stop both servers (idempotent); the data directory stays for inspection."""
        with self._lock:
            for proc in (self._apiserver, self._etcd):
                if proc is not None:
                    proc.stop()
            self._apiserver = self._etcd = None

    def stop_apiserver(self) -> None:
        """Stop the API server only; etcd keeps the data and the port stays reserved for a restart."""
        with self._lock:
            if self._apiserver is not None:
                self._apiserver.stop()
                self._apiserver = None

    def start_apiserver(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start the API server on the same port and data (no-op when running) and wait for /readyz."""
        with self._lock:
            if self._apiserver is not None and self._apiserver.running():
                return
            if self._etcd is None or not self._etcd.running():
                raise ControlPlaneError("etcd is not running; start() the control plane first")
            self._apiserver = _Process("kube-apiserver", self._apiserver_argv(),
                                       self.workdir / "kube-apiserver.log")
            proc = self._apiserver
        self._wait_ready(proc, "/readyz", timeout_s)

    def apiserver_running(self) -> bool:
        """Whether the API server process is alive."""
        proc = self._apiserver
        return proc is not None and proc.running()

    def _start_etcd(self) -> None:
        data = self.workdir / "etcd-data"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        argv = [
            str(self.binaries.etcd), "--name", "test", "--data-dir", str(data),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}", "--initial-cluster-state", "new",
            # A throw-away store: durability across a host crash buys nothing here and fsync costs much.
            "--unsafe-no-fsync", "--log-level", "warn",
        ]
        self._etcd = _Process("etcd", argv, self.workdir / "etcd.log")
        self._wait_ready(self._etcd, "/health", READY_TIMEOUT_S, base=client)

    def _apiserver_argv(self) -> list[str]:
        sa_key = str(self.pki / "sa.key")
        return [
            str(self.binaries.kube_apiserver),
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.port),
            "--tls-cert-file", str(self.pki / "apiserver.crt"),
            "--tls-private-key-file", str(self.pki / "apiserver.key"),
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--token-auth-file", str(self.workdir / "tokens.csv"),
            "--authorization-mode", "Node,RBAC",
            "--anonymous-auth=false",
            "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
            "--service-account-key-file", sa_key,
            "--service-account-signing-key-file", sa_key,
            "--api-audiences", DEFAULT_AUDIENCE,
            "--service-cluster-ip-range", "10.96.0.0/16",
            # Loopback cannot be a Service endpoint, so the kubernetes Service keeps no endpoints.
            "--endpoint-reconciler-type", "none",
            # Webhook (and CRD conversion) Services resolve to their EndpointSlices' addresses, not their
            # ClusterIP: with no kube-proxy nothing routes a ClusterIP, so Kueue's webhook Service gets a
            # selector-less EndpointSlice on a local non-loopback address (tests/controlplane/kueue.py).
            "--enable-aggregator-routing=true",
            # ValidatingAdmissionPolicy and MutatingAdmissionPolicy are on by default; these add the
            # node checks a DaemonSet's credentials meet in a real cluster.
            "--enable-admission-plugins", "NodeRestriction",
            # /debug/pprof only when a benchmark asks for the API server's profile (bench/admission_api.py).
            f"--profiling={'true' if os.environ.get(PROFILING_ENV) else 'false'}",
            "--cert-dir", str(self.workdir / "apiserver-certs"),
        ]

    def _wait_ready(self, proc: _Process, path: str, timeout_s: float, base: str | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        url = (base or self.url) + path
        last = ""
        while time.monotonic() < deadline:
            if not proc.running():
                raise ControlPlaneError(
                    f"{proc.name} exited with {proc.popen.returncode} before it was ready:\n{proc.log_tail()}"
                )
            try:
                status, body = self.raw_get(url, token=self.admin_token if base is None else None)
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:300]}"
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.25)
        proc.stop()
        raise ControlPlaneError(f"{proc.name} not ready after {timeout_s:.0f} s ({last}):\n{proc.log_tail()}")

    # ---- access ----------------------------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's serving certificate."""
        return self.pki / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig for the admin user (group system:masters)."""
        return self.workdir / "admin.kubeconfig"

    def raw_get(self, url: str, token: str | None = None, timeout_s: float = 5.0) -> tuple[int, str]:
        """GET a URL (absolute, or a path on the API server); return (status, body), 4xx/5xx included."""
        if url.startswith("/"):
            url = self.url + url
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        ctx = ssl.create_default_context(cafile=str(self.ca_file)) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def write_kubeconfig(self, path: Path, token: str, user: str = "user") -> Path:
        """Write a kubeconfig that reaches this API server with a bearer token; return its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url,
                                                      "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is YAML, and the kubernetes client reads it without our choosing a YAML writer.
        path.write_text(json.dumps(config, indent=1))
        path.chmod(0o600)
        return path

    def client(self, token: str | None = None) -> Any:
        """A kubernetes.client.ApiClient for a bearer token (the admin's when none is given)."""
        from kubernetes import client as k8s

        conf = k8s.Configuration()
        conf.host = self.url
        conf.ssl_ca_cert = str(self.ca_file)
        conf.verify_ssl = True
        conf.api_key = {"authorization": token or self.admin_token}
        conf.api_key_prefix = {"authorization": "Bearer"}
        return k8s.ApiClient(conf)

    def mint_token(
        self,
        namespace: str,
        service_account: str,
        bound_pod: tuple[str, str] | None = None,
        node: tuple[str, str] | None = None,
        audiences: Sequence[str] = (DEFAULT_AUDIENCE,),
        expiration_seconds: int = 3600,
    ) -> str:
        """A TokenRequest token for namespace/service_account, bound to a Pod or a Node (name, uid).

        A pod-bound token carries the pod's node (claim kubernetes.io.node, user extra
        authentication.kubernetes.io/node-name) when the pod has spec.nodeName. A token binds to at
        most one object, so bound_pod and node exclude each other.
        """
        from kubernetes import client as k8s

        if bound_pod is not None and node is not None:
            raise ValueError("a token binds to one object: give bound_pod or node, not both")
        ref = None
        if bound_pod is not None:
            ref = k8s.V1BoundObjectReference(api_version="v1", kind="Pod",
                                             name=bound_pod[0], uid=bound_pod[1])
        elif node is not None:
            ref = k8s.V1BoundObjectReference(api_version="v1", kind="Node", name=node[0], uid=node[1])
        body = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=list(audiences), expiration_seconds=expiration_seconds,
                                        bound_object_ref=ref)
        )
        with self.client() as api:
            out = k8s.CoreV1Api(api).create_namespaced_service_account_token(service_account, namespace, body)
        if out.status is None or not out.status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{service_account} returned no token")
        return str(out.status.token)
