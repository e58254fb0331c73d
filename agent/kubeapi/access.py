"""Whether this process can reach the API server and do what it needs there, said in one line.

Public API:

- `check_access(kube, needs)`: GET /version (any identity may), then one read per `needs` entry
  (`(path, what)`, e.g. list Jobs with limit 1).  Raises KubeAPIError whose message says which of
  the three failed: the server was not reached, it refused the credentials (401), or it refused this
  identity the read (403, the RBAC), each with what to check.
- `hint(exc) -> str`: that advice for one KubeAPIError ("" when there is none to give).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.errors import KubeAPIError
from agent.kubeapi.client import KubeClient

HINTS = {
    None: "is the API server up, and is this the right kubeconfig (--kubeconfig, $KUBECONFIG)?",
    401: "the API server does not accept these credentials (an expired token or certificate?)",
    403: "this identity lacks RBAC for it: apply the component's ClusterRole and its binding",
}


def hint(exc: KubeAPIError) -> str:
    """What to check for `exc`, by its HTTP status (None: not reached)."""
    return HINTS.get(exc.status, "")


def check_access(kube: KubeClient, needs: Iterable[tuple[str, str]]) -> None:
    """Reach the API server, then try each `(path, what)` read once; KubeAPIError with a hint if not."""
    try:
        kube.get("/version", what="reach the API server")
        for path, what in needs:
            kube.list(path, {"limit": 1}, what=what)
    except KubeAPIError as exc:
        advice = hint(exc)
        if not advice:
            raise
        raise KubeAPIError(f"{exc} ({advice})", exc.status) from exc
