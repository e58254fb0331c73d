"""Access to the Kubernetes API server: the client, this node's name, the agent's namespace, API errors.

Public API (stable; the in-cluster daemon builds on it):

- `load_api_client(kubeconfig: str | None) -> kubernetes.client.ApiClient`: the pod's in-cluster
  service-account config when `kubeconfig` is None, else that kubeconfig file.  Raises ConfigError.
- `node_name(args_value: str | None) -> str`: `--node-name`, else env `NODE_NAME`; ConfigError when
  neither names a valid node.
- `agent_namespace(value: str | None = None) -> str`: `value`, else env `POD_NAMESPACE`, else the
  service-account namespace file, else "topolet-system".
- `KubeAPIError` (a TopoletError): an API call failed (server down, timeout, HTTP error); `.status`
  is the HTTP status or None when the server was not reached.  `api_call(what)` is the context
  manager that turns the client's exceptions into it.
- `REQUEST_TIMEOUT`: the (connect, read) seconds every call in agent/kube passes as `_request_timeout`.

The `kubernetes` package is imported only inside functions here and in the rest of agent/kube, so
`topolet discover` and the standalone agent never load it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agent.errors import ConfigError, TopoletError
from agent.labels.validate import is_dns_subdomain

# A call that cannot connect in 5 s or answer in 20 s is treated as the API being down: the caller
# retries on its next reconcile instead of blocking enforcement behind a hung socket.
REQUEST_TIMEOUT: tuple[float, float] = (5.0, 20.0)
# Connection-level retries inside one call (urllib3 never retries a non-idempotent read failure).
CONNECT_RETRIES = 2
DEFAULT_NAMESPACE = "topolet-system"
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeAPIError(TopoletError):
    """A Kubernetes API call failed; `status` is the HTTP status, None when the server was not reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404


def _status_message(body: object) -> str:
    """The `message` of a metav1.Status body, or the body itself cut short."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body[:300]
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return body[:300]


@contextmanager
def api_call(what: str) -> Iterator[None]:
    """Run one API call, turning the client's HTTP and connection exceptions into KubeAPIError."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        status = int(exc.status) if exc.status else None
        detail = _status_message(exc.body) or str(exc.reason or "")
        raise KubeAPIError(f"{what}: HTTP {status}: {detail}".rstrip(": "), status) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise KubeAPIError(f"{what}: API server unreachable: {exc}") from exc


def load_api_client(kubeconfig: str | None) -> Any:
    """An ApiClient from the in-cluster service account (`kubeconfig` None) or a kubeconfig file."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    conf = k8s.Configuration()
    # The config loaders carry no annotations.
    load_incluster: Any = k8s_config.load_incluster_config
    load_kubeconfig: Any = k8s_config.load_kube_config
    try:
        if kubeconfig is None:
            # Re-reads the projected token when it rotates (bound tokens expire within the hour).
            load_incluster(client_configuration=conf, try_refresh_token=True)
        else:
            if not os.path.isfile(kubeconfig):
                raise ConfigError(f"kubeconfig not found: {kubeconfig}")
            load_kubeconfig(config_file=kubeconfig, client_configuration=conf)
    except k8s_config.ConfigException as exc:
        where = "in-cluster service account" if kubeconfig is None else kubeconfig
        raise ConfigError(f"cannot load Kubernetes client configuration from {where}: {exc}") from exc
    conf.retries = CONNECT_RETRIES
    return k8s.ApiClient(conf)


def node_name(args_value: str | None) -> str:
    """This node's name: `--node-name`, else env NODE_NAME (the downward API's spec.nodeName)."""
    name = (args_value or os.environ.get("NODE_NAME") or "").strip()
    if not name:
        raise ConfigError("no node name: pass --node-name or set NODE_NAME (downward API spec.nodeName)")
    if not is_dns_subdomain(name):
        raise ConfigError(f"invalid node name {name!r}")
    return name


def agent_namespace(value: str | None = None,
                    namespace_file: str = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str:
    """The agent's namespace: `value`, env POD_NAMESPACE, the service-account file, or the default."""
    name = (value or os.environ.get("POD_NAMESPACE") or "").strip()
    if not name:
        try:
            with open(namespace_file, encoding="utf-8") as f:
                name = f.read(256).strip()
        except OSError:
            name = ""
    name = name or DEFAULT_NAMESPACE
    # A namespace is a DNS label: no dots, at most 63 characters.
    if not is_dns_subdomain(name) or "." in name or len(name) > 63:
        raise ConfigError(f"invalid namespace {name!r}")
    return name
