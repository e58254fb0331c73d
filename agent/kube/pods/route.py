"""Chooses and runs how containers are pinned from their first instruction: NRI or pod cgroups.

`PinningRoute` connects the NRI plugin (`handler` is a factory, so the NRI code loads only when the
route tries it) with reconnect back-off, or falls back to the pod-cgroup route; `--route auto`
decides at start (`REGISTER_SECONDS`).  The choice is logged once and reported as
`topolet_info{route}` and the NRT's `topolet.io/pinning-route`.  The pod watch stays the reconciler
under either route (README.md, "Routes").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.nri.plugin import Handler, Plugin

log = logging.getLogger("topolet.kube.route")

NRI = "nri"
POD_CGROUP = "pod-cgroup"
ROUTE_CHOICES = ("auto", NRI, POD_CGROUP)
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"  # nri's DefaultSocketPath (agent.nri.plugin.DEFAULT_SOCKET)
PLUGIN_NAME = "topolet"
PLUGIN_INDEX = "50"  # NRI orders plugins by index; nothing else here adjusts cpusets
REGISTER_SECONDS = 5.0
BACKOFF_MIN_SECONDS = 0.2
BACKOFF_MAX_SECONDS = 5.0
_STEADY_SECONDS = 30.0  # a connection that lasted this long resets the back-off


class PinningRoute:
    """The route chosen at `start()` (`name`, `reason`) and, for NRI, the thread serving the plugin."""

    def __init__(self, asked: str, socket: str, handler: Callable[[], Handler], *, enforce: bool = True,
                 register_seconds: float = REGISTER_SECONDS) -> None:
        if asked not in ROUTE_CHOICES:
            raise ValueError(f"unknown route {asked!r}")
        self.asked = asked
        self.socket = socket
        self._make_handler = handler
        self.handler: Handler | None = None  # made by the first connection
        self.enforce = enforce
        self.register_seconds = register_seconds
        self.name = POD_CGROUP
        self.reason = "not started"
        self.connections = 0  # registrations the runtime answered
        self._stop = threading.Event()
        self._plugin: Plugin | None = None
        self._plugin_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._serving: threading.Thread | None = None  # runs the registered plugin
        self._ended: list[str] = []  # why the last connection ended

    def start(self) -> str:
        """Choose the route (connecting to the runtime where NRI may be used), log it; its name."""
        if self.asked == POD_CGROUP:
            self.reason = "--route pod-cgroup"
        elif not self.enforce:
            self.reason = "--enforcement off: nothing is pinned through the runtime"
        elif self.asked == "auto" and not os.path.exists(self.socket):
            self.reason = f"no NRI socket at {self.socket}"
        else:
            error = self._first_connection()
            if error is None:
                self.name = NRI
                self.reason = f"registered as an NRI plugin on {self.socket}"
                runtime = getattr(self.handler, "runtime", "")
                if runtime:
                    self.reason += f" ({runtime})"
                self._start_thread(connected=True)
            elif self.asked == NRI:
                self.name = NRI
                self.reason = f"--route nri; the runtime did not answer yet ({error}): connecting again"
                self._start_thread(connected=False)
            else:
                self.reason = f"NRI socket {self.socket} did not answer: {error}"
        log.info("pinning route: %s (%s)", self.name, self.reason)
        return self.name

    def stop(self) -> None:
        """End the plugin thread (the runtime sees the plugin go; containers keep their cpusets)."""
        self._stop.set()
        with self._plugin_lock:
            plugin = self._plugin
        if plugin is not None:
            plugin.close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the connection ---------------------------------------------------------------------------

    def _connect(self) -> Plugin | str:
        """A plugin connected and registered (its serving thread running), or why not."""
        from agent.nri.plugin import Plugin

        if self.handler is None:
            self.handler = self._make_handler()
        try:
            plugin = Plugin.connect(self.socket, self.handler, PLUGIN_NAME, PLUGIN_INDEX,
                                    timeout=self.register_seconds)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        with self._plugin_lock:
            if self._stop.is_set():
                plugin.close()
                return "stopping"
            self._plugin = plugin
        ended: list[str] = []
        self._ended = ended
        serving = threading.Thread(target=self._serve, args=(plugin, ended), name="nri-plugin", daemon=True)
        serving.start()
        deadline = time.monotonic() + self.register_seconds
        while not plugin.registered.wait(0.05):
            if not serving.is_alive():
                return ended[0] if ended else "the connection ended"
            if time.monotonic() > deadline:
                plugin.close()
                serving.join(timeout=5)
                return f"no registration within {self.register_seconds} s"
        self.connections += 1
        self._serving = serving
        return plugin

    def _serve(self, plugin: Plugin, ended: list[str]) -> None:
        from agent.nri.framing import NRIProtocolError

        try:
            plugin.run()
            ended.append("the runtime closed the connection")
        except (NRIProtocolError, OSError) as exc:
            ended.append(f"{type(exc).__name__}: {exc}")
        finally:
            with self._plugin_lock:
                if self._plugin is plugin:
                    self._plugin = None

    def _first_connection(self) -> str | None:
        connected = self._connect()
        return connected if isinstance(connected, str) else None

    def _start_thread(self, *, connected: bool) -> None:
        self._thread = threading.Thread(target=self._run, args=(connected,), name="nri-route", daemon=True)
        self._thread.start()

    def _run(self, connected: bool) -> None:
        """Keep a registered connection while the agent runs: wait for it to end, connect again."""
        delay = BACKOFF_MIN_SECONDS
        since = time.monotonic()
        failing = False
        while not self._stop.is_set():
            if connected and self._serving is not None:
                self._serving.join()
                if self._stop.is_set():
                    return
                steady = time.monotonic() - since > _STEADY_SECONDS
                delay = BACKOFF_MIN_SECONDS if steady else min(delay * 2, BACKOFF_MAX_SECONDS)
                why = self._ended[0] if self._ended else "ended"
                log.warning("NRI: %s; connecting again in %.1f s", why, delay)
            if self._stop.wait(delay):
                return
            result = self._connect()
            connected = not isinstance(result, str)
            if isinstance(result, str):
                if not failing:
                    log.warning("NRI: cannot register on %s (%s); trying again every %.0f s at most",
                                self.socket, result, BACKOFF_MAX_SECONDS)
                failing = True
                delay = min(delay * 2, BACKOFF_MAX_SECONDS)
            else:
                failing = False
                since = time.monotonic()
                log.info("NRI: registered on %s", self.socket)
