"""`ListMeter`: the real `KubeClient`, noting each list request's query and the size of its response body
(for the paged-list test on the real API server and bench/lists.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.kubeapi.client import KubeClient


class ListMeter(KubeClient):
    """Each list request (a GET that is not a watch) as (query, response bytes) in `.lists`."""

    def __init__(self, api_client: Any) -> None:
        super().__init__(api_client)
        self.lists: list[tuple[dict[str, object], int]] = []

    def _send(self, method: str, path: str, query: Mapping[str, object] | None, body: object,
              content_type: str | None, timeout: tuple[float, float], what: str) -> Any:
        resp = super()._send(method, path, query, body, content_type, timeout, what)
        if method == "GET" and not (query or {}).get("watch"):
            # Read the body here to size it: urllib3 keeps it, and `request` decodes the same bytes.
            self.lists.append(({k: v for k, v in (query or {}).items() if v is not None}, len(resp.data)))
        return resp

    @property
    def largest(self) -> int:
        """The largest list response so far, in bytes (0 before any)."""
        return max((size for _, size in self.lists), default=0)
