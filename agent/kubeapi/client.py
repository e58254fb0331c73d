"""Access to the Kubernetes API server: one raw-JSON request path, this node's name, the agent's namespace.

`load_api_client(kubeconfig)` (controller-runtime's order of sources), `KubeClient(api_client)`
(`.get/.list/.list_paged/.create/.patch/.apply/.watch`, plain dicts, never the generated models; a
whole collection is listed in pages of `LIST_PAGE_SIZE`),
`resource_path(...)`, `node_name(value)`, `agent_namespace(value)`, `api_call(what)`,
`REQUEST_TIMEOUT`.  Failures are `KubeAPIError` (`.status` None when the server was not reached);
configuration errors are ConfigError.  The `kubernetes` package is imported only inside functions.
Token refresh, sources and method details: agent/kubeapi/README.md, "The client".
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlencode

from agent.api.objects import as_list
from agent.api.validate import is_dns_label, is_dns_subdomain
from agent.errors import ConfigError, KubeAPIError

_log = logging.getLogger(__name__)

# A call that cannot connect in 5 s or answer in 20 s is treated as the API being down: the caller
# retries on its next reconcile instead of blocking enforcement behind a hung socket.
REQUEST_TIMEOUT: tuple[float, float] = (5.0, 20.0)
# Connection-level retries inside one call (urllib3 never retries a non-idempotent read failure).
CONNECT_RETRIES = 2
# A watch event bigger than this is not an object we can use (and would otherwise grow without bound).
MAX_WATCH_LINE = 8 << 20
# The request headers (the bearer token among them) and the server's URL are worked out again after
# this long.  Asking the configuration every request cost a quarter of a small request's client CPU
# (the kubeconfig loader's hook sets the host again, which scans the environment for proxies); a
# projected token is rotated well before the old one expires, and the in-cluster loader itself
# re-reads it only once a minute.
AUTH_REFRESH_SECONDS = 1.0
# Objects per page of a whole-collection list (client-go's pager asks for as many): a response stays a
# few MiB however big the collection, where one unpaged list of 100,000 pods is hundreds of MiB of JSON.
LIST_PAGE_SIZE = 500
# What a continued page must not carry: the snapshot is the continue token's, not a version we name.
_FIRST_PAGE_ONLY = ("resourceVersion", "resourceVersionMatch")
PageReader = Callable[[list[Any]], list[Any]]  # one page's raw objects -> what the caller keeps of them
Page = tuple[dict[str, Any], list[Any]]  # a page's list object less its items, and its items (read)
# Called by the JSON decoder on each object of a response as it is completed, innermost first; what it
# returns stands for the object (`agent.kubeapi.bulk.drop_bulk`: a pod's bulk dropped while decoding).
ObjectHook = Callable[[dict[str, Any]], Any]
DEFAULT_NAMESPACE = "topolet-system"
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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


def _unreachable_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words: urllib3 wraps the socket's error in two layers."""
    reason = getattr(exc, "reason", None)  # MaxRetryError: the last attempt's error
    text = str(reason if isinstance(reason, BaseException) else exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return found.group(1).strip() if found else text


@contextmanager
def api_call(what: str, server: str = "") -> Iterator[None]:
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
        where = f"API server {server}" if server else "API server"
        raise KubeAPIError(f"{what}: {where} unreachable: {_unreachable_reason(exc)}") from exc


def one_line(exc: BaseException) -> str:
    """An error as one line of log or message text (its whitespace runs made one space)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def kubeconfig_source(kubeconfig: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Where the client configuration comes from, as controller-runtime's GetConfig looks:
    ("file", paths) for `kubeconfig`, else $KUBECONFIG (paths joined by ':' merge as kubectl merges
    them), ("in-cluster", "") in a pod, else ("file", "~/.kube/config") when that exists, else
    ("none", "")."""
    if kubeconfig:
        return "file", kubeconfig
    if environ.get("KUBECONFIG", "").strip(os.pathsep + " "):
        return "file", environ["KUBECONFIG"]
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return "in-cluster", ""
    home = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".kube", "config")
    return ("file", home) if os.path.isfile(home) else ("none", "")


def load_api_client(kubeconfig: str | None, environ: Mapping[str, str] = os.environ) -> Any:
    """An ApiClient from `kubeconfig`, $KUBECONFIG, the in-cluster service account or ~/.kube/config
    (`kubeconfig_source` says which).  Raises ConfigError, in one line, when none loads."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    conf = k8s.Configuration()
    # The config loaders carry no annotations.
    load_incluster: Any = k8s_config.load_incluster_config
    load_kubeconfig: Any = k8s_config.load_kube_config
    kind, paths = kubeconfig_source(kubeconfig, environ)
    if kind == "none":
        raise ConfigError("no Kubernetes client configuration: no --kubeconfig, $KUBECONFIG unset, not "
                          "in a pod (in-cluster: $KUBERNETES_SERVICE_HOST unset) and no ~/.kube/config")
    where = "the in-cluster service account" if kind == "in-cluster" else paths
    if kind == "file":
        files = [os.path.expanduser(p) for p in paths.split(os.pathsep) if p.strip()]
        if not any(os.path.isfile(f) for f in files):
            raise ConfigError(f"kubeconfig not found: {paths}")
    try:
        if kind == "in-cluster":
            # Re-reads the projected token when it rotates (bound tokens expire within the hour).
            load_incluster(client_configuration=conf, try_refresh_token=True)
        else:
            load_kubeconfig(config_file=paths, client_configuration=conf)
    except Exception as exc:  # noqa: BLE001 - a malformed file fails in YAML, KeyError, TypeError...
        raise ConfigError(f"cannot load Kubernetes client configuration from {where}: "
                          f"{one_line(exc)}") from exc
    conf.retries = CONNECT_RETRIES
    return k8s.ApiClient(conf)


def resource_path(group: str, version: str, plural: str | None = None, name: str | None = None, *,
                  namespace: str | None = None, subresource: str | None = None) -> str:
    """The URL path of an API group version, a collection or one object ("" group: the core API)."""
    parts = ["api", version] if not group else ["apis", group, version]
    if plural is not None:
        if namespace is not None:
            parts += ["namespaces", namespace]
        parts.append(plural)
        if name is not None:
            parts.append(name)
            if subresource is not None:
                parts.append(subresource)
    return "/" + "/".join(quote(p, safe="") for p in parts)


def _query_text(query: Mapping[str, object] | None) -> str:
    """`query` as a URL query string: None values left out, booleans as the API spells them."""
    if not query:
        return ""
    pairs = [(k, ("true" if v else "false") if isinstance(v, bool) else str(v))
             for k, v in query.items() if v is not None]
    return "?" + urlencode(pairs) if pairs else ""


def _decode(data: bytes, what: str, status: int, object_hook: ObjectHook | None = None) -> dict[str, Any]:
    """A response body as a JSON object (an empty body is an empty object), each object through
    `object_hook` when given."""
    if not data.strip():
        return {}
    try:
        decoded = json.loads(data, object_hook=object_hook)
    except ValueError as exc:
        raise KubeAPIError(f"{what}: the response is not JSON", status) from exc
    if not isinstance(decoded, dict):
        raise KubeAPIError(f"{what}: the response is not a JSON object", status)
    return decoded


class WatchStream:
    """One watch response: iterate for its events; `shutdown()` from any thread wakes a blocked read."""

    def __init__(self, resp: Any, what: str, object_hook: ObjectHook | None = None) -> None:
        self._resp = resp  # urllib3.HTTPResponse, not preloaded
        self.what = what
        self.object_hook = object_hook  # each decoded object of an event goes through it
        self._ended = False  # the server ended the body: the connection can be reused

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        """Each event as a dict, None for a line that is not a JSON object; ends when the server does."""
        with api_call(self.what):
            buf = b""
            for chunk in self._resp.stream(65536, decode_content=True):
                buf += chunk
                while (i := buf.find(b"\n")) >= 0:
                    line, buf = buf[:i], buf[i + 1:]
                    if line.strip():
                        yield _event(line, self.object_hook)
                if len(buf) > MAX_WATCH_LINE:
                    raise KubeAPIError(f"{self.what}: a watch event over {MAX_WATCH_LINE} bytes")
            if buf.strip():
                yield _event(buf, self.object_hook)
        self._ended = True

    def shutdown(self) -> None:
        """Wake a read blocked on the stream (the iterator then ends or raises KubeAPIError)."""
        try:
            self._resp.shutdown()
        except Exception:  # noqa: BLE001 - best effort: the socket may already be gone
            pass

    def close(self) -> None:
        """Give the connection back, or drop it when the body was not read to its end."""
        if not self._ended:
            self._resp.close()
        self._resp.release_conn()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _event(line: bytes, object_hook: ObjectHook | None) -> dict[str, Any] | None:
    try:
        event = json.loads(line, object_hook=object_hook)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


class KubeClient:
    """Raw JSON requests over an ApiClient's configuration, credentials, TLS and REST layer."""

    def __init__(self, api_client: Any) -> None:
        if api_client is None:
            raise ConfigError("a Kubernetes client needs an ApiClient")
        self.api_client = api_client
        self._base: tuple[float, str, dict[str, str]] | None = None  # (when, host, headers)

    @classmethod
    def of(cls, api: Any) -> KubeClient:
        """`api` itself when it is a KubeClient, else a KubeClient over the ApiClient `api`."""
        return api if isinstance(api, KubeClient) else cls(api)

    def close(self) -> None:
        """Close the connection pool."""
        self.api_client.close()

    def _host_and_headers(self, content_type: str | None) -> tuple[str, dict[str, str]]:
        """The server's URL and a request's headers, the base of both reused for AUTH_REFRESH_SECONDS."""
        now = time.monotonic()
        base = self._base
        if base is None or now - base[0] >= AUTH_REFRESH_SECONDS:
            conf = self.api_client.configuration
            headers = dict(self.api_client.default_headers)  # User-Agent and any the caller set
            if self.api_client.cookie:
                headers["Cookie"] = self.api_client.cookie
            headers["Accept"] = "application/json"
            # auth_settings() calls the configuration's refresh hook, which re-reads a rotated token.
            for setting in conf.auth_settings().values():
                if setting.get("in") == "header" and setting.get("value"):
                    headers[setting["key"]] = setting["value"]
            base = self._base = (now, conf.host, headers)
        headers = dict(base[2])
        if content_type is not None:
            headers["Content-Type"] = content_type
        return base[1], headers

    def _send(self, method: str, path: str, query: Mapping[str, object] | None, body: object,
              content_type: str | None, timeout: tuple[float, float], what: str) -> Any:
        """Send one request; the urllib3 response (not read) of a 2xx, else KubeAPIError."""
        host, headers = self._host_and_headers(content_type)
        url = host + path + _query_text(query)
        with api_call(what, host):
            # The REST layer serialises a dict body as JSON for JSON and YAML content types.
            resp = self.api_client.rest_client.request(
                method, url, headers=headers, body=body, _request_timeout=timeout).response
        if 200 <= resp.status < 300:
            return resp
        if resp.status == 401:
            self._base = None  # the token was refused: ask the configuration afresh next time
        try:
            with api_call(what):
                data = resp.data
        finally:
            resp.release_conn()
        detail = _status_message(data) or str(resp.reason or "")
        raise KubeAPIError(f"{what}: HTTP {resp.status}: {detail}".rstrip(": "), int(resp.status))

    def request(self, method: str, path: str, *, query: Mapping[str, object] | None = None,
                body: object = None, content_type: str | None = None,
                timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None,
                object_hook: ObjectHook | None = None) -> dict[str, Any]:
        """One request; the response object as a dict (each object through `object_hook` as it is
        decoded, when given).  Raises KubeAPIError."""
        what = what or f"{method} {path}"
        resp = self._send(method, path, query, body, content_type, timeout, what)
        try:
            with api_call(what):
                data = resp.data
        finally:
            resp.release_conn()
        return _decode(data, what, int(resp.status), object_hook)

    def get(self, path: str, query: Mapping[str, object] | None = None, *,
            timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None) -> dict[str, Any]:
        """GET one object (or an API discovery document)."""
        return self.request("GET", path, query=query, timeout=timeout, what=what)

    def list(self, path: str, query: Mapping[str, object] | None = None, *,
             timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None,
             object_hook: ObjectHook | None = None) -> dict[str, Any]:
        """GET a collection: the list object, `items` and `metadata.resourceVersion` as the API sent them
        (through `object_hook`, when given)."""
        return self.request("GET", path, query=query, timeout=timeout, what=what, object_hook=object_hook)

    def list_paged(self, path: str, query: Mapping[str, object] | None = None, *,
                   page_size: int | None = LIST_PAGE_SIZE, read: PageReader | None = None,
                   timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None,
                   object_hook: ObjectHook | None = None) -> dict[str, Any]:
        """GET a whole collection in pages of `page_size` objects (None: one unpaged request), as one
        list object: the first page's `metadata` (its resourceVersion is the list's) and every page's
        `items`, each page's passed through `read` as it arrives (each of its objects through
        `object_hook` while it is decoded, when given: the whole of a page is then never held decoded).
        Raises KubeAPIError.

        client-go's pager, but for what it does when a continue token expires: the first page asks with
        `limit` and `query` as given, each next one with `continue` and never `resourceVersion`, so
        every page reads the first one's snapshot.  A token that expires mid-list (410 Gone, history
        compacted past the snapshot) starts the paged list again from its first page, a new snapshot,
        where client-go falls back to one unpaged list: that is the response paging keeps small.  A
        second expiry in a row raises its 410, for the caller's back-off.  Only the read items of the
        pages are held, never a raw page once read: `read` may shrink the objects.
        """
        what = what or f"list {path}"
        first = {**(query or {}), "limit": page_size}
        later = {k: v for k, v in first.items() if k not in _FIRST_PAGE_ONLY}
        restarted = False
        while True:
            head, items = self._list_page(path, first, read, timeout, what, object_hook)
            meta = head["metadata"]
            token, pages = meta.pop("continue", None), 1
            try:
                while token:
                    pages += 1
                    page, more = self._list_page(path, {**later, "continue": token}, read, timeout,
                                                 f"{what}, page {pages}", object_hook)
                    items.extend(more)
                    token = page["metadata"].get("continue")
            except KubeAPIError as exc:
                if exc.status != 410 or restarted:
                    raise
                restarted = True
                _log.info("%s: the continue token expired on page %d (%s): listing again from the first page",
                          what, pages, one_line(exc))
                continue
            meta.pop("remainingItemCount", None)
            head["items"] = items
            return head

    def _list_page(self, path: str, query: Mapping[str, object], read: PageReader | None,
                   timeout: tuple[float, float], what: str, object_hook: ObjectHook | None) -> Page:
        """One page: its list object less `items`, and its items through `read` (the raw page goes on
        return when `read` makes new objects)."""
        body = self.list(path, query, timeout=timeout, what=what, object_hook=object_hook)
        items = as_list(body.pop("items", None))
        if not isinstance(body.get("metadata"), dict):
            body["metadata"] = {}
        return body, items if read is None else read(items)

    def create(self, path: str, body: Mapping[str, Any], *,
               timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None) -> dict[str, Any]:
        """POST `body` to the collection at `path`."""
        return self.request("POST", path, body=dict(body), content_type="application/json",
                            timeout=timeout, what=what)

    def patch(self, path: str, body: Mapping[str, Any], content_type: str, *,
              field_manager: str | None = None, force: bool = False,
              timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None) -> dict[str, Any]:
        """PATCH the object at `path` with `body` of `content_type` (merge, strategic or apply patch)."""
        query = {"fieldManager": field_manager, "force": True if force else None}
        return self.request("PATCH", path, query=query, body=dict(body), content_type=content_type,
                            timeout=timeout, what=what)

    def apply(self, path: str, body: Mapping[str, Any], field_manager: str, *, force: bool = True,
              timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None) -> dict[str, Any]:
        """Server-side apply `body` to the object at `path` as `field_manager` (creating it if absent)."""
        if not field_manager:
            raise ConfigError("server-side apply needs a field manager")
        # JSON is YAML: the apply content type takes the JSON the REST layer writes.
        return self.patch(path, body, "application/apply-patch+yaml", field_manager=field_manager,
                          force=force, timeout=timeout, what=what)

    def watch(self, path: str, query: Mapping[str, object] | None = None, *,
              timeout: tuple[float, float] = REQUEST_TIMEOUT, what: str | None = None,
              object_hook: ObjectHook | None = None) -> WatchStream:
        """Start a watch on the collection at `path` (`query` gets watch=true); its events stream, each
        event's objects through `object_hook` as they are decoded, when given."""
        what = what or f"watch {path}"
        resp = self._send("GET", path, {**(query or {}), "watch": True}, None, None, timeout, what)
        return WatchStream(resp, what, object_hook)


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
    if not is_dns_label(name):
        raise ConfigError(f"invalid namespace {name!r}")
    return name
