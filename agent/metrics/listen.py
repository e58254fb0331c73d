"""The `--listen` address of the /metrics server: `host:port`, `[v6]:port` or `:port`."""

from __future__ import annotations

from agent.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) of `text`; an empty host is 127.0.0.1, port 0 any free one.  ConfigError if malformed."""
    host, colon, port = text.strip().rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen address {text!r} is not host:port (port 0-65535; e.g. 127.0.0.1:9470)")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise ConfigError(f"listen address {text!r}: write an IPv6 host in brackets, [::1]:9470")
    return host.strip("[]") or DEFAULT_HOST, int(port)
