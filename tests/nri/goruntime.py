"""The Go side of NRI for tests and bench: `tests/nri/runtime/` (NRI's own pkg/adaptation, as containerd
embeds it, and a reference plugin on NRI's Go stub), built once by its build.sh and run as a process."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"


def go_available() -> bool:
    """Whether `go` is on PATH (the runtime is built from the Go module proxy)."""
    return shutil.which("go") is not None


def build_runtime() -> str:
    """The nri-runtime binary's path, built and cached by tests/nri/runtime/build.sh."""
    done = subprocess.run([str(RUNTIME_DIR / "build.sh")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tests/nri/runtime/build.sh failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip().splitlines()[-1]


class GoRuntime:
    """NRI's runtime side listening on `socket`; its stdout JSON lines as dicts, in order."""

    def __init__(self, binary: str, socket: Path, *args: str, stdin: int | None = None) -> None:
        self.socket = socket
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._proc = subprocess.Popen(
            [binary, "-socket", str(socket), *args],
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self._stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    @property
    def log(self) -> str:
        """The runtime's own log (NRI's logrus lines), for failure messages."""
        return "".join(self._stderr[-60:])

    def next_event(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next JSON line; AssertionError on exit, an "error" line or a timeout."""
        try:
            event = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nri-runtime printed nothing for {timeout} s\n{self.log}") from None
        if event is None:
            raise AssertionError(f"nri-runtime exited early ({self._proc.wait()})\n{self.log}")
        if event.get("event") == "error":
            raise AssertionError(f"nri-runtime: {event['error']}\n{self.log}")
        return event

    def wait_listening(self, timeout: float = 30.0) -> None:
        """Return once the runtime's socket accepts plugins."""
        event = self.next_event(timeout)
        assert event["event"] == "listening", event

    def events_until_done(self, timeout: float = 120.0) -> dict[str, dict[str, Any]]:
        """The remaining lines up to "done", by event name; waits for the process to exit."""
        deadline = time.monotonic() + timeout
        out: dict[str, dict[str, Any]] = {}
        while True:
            event = self.next_event(max(0.1, deadline - time.monotonic()))
            if event["event"] == "done":
                break
            out[event["event"]] = event
        self._proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        return out

    def close(self) -> None:
        """Stop the process if it still runs."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


class ScriptedRuntime(GoRuntime):
    """NRI's runtime side driven one command at a time (main.go's -script mode).

    `request(op, ...)` sends a command (pods and containers as api_pb2 messages) and returns its
    reply; lines printed meanwhile (a plugin's Synchronize, its UpdateContainers) are kept for
    `wait_event`.
    """

    def __init__(self, binary: str, socket: Path) -> None:
        super().__init__(binary, socket, "-script", stdin=subprocess.PIPE)
        self._seq = 0
        self._kept: list[dict[str, Any]] = []

    def request(self, op: str, *, pod: Any = None, container: Any = None, resources: Any = None,
                pods: Sequence[Any] = (), containers: Sequence[Any] = (),
                timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and return its reply ({"response": ..., "error": ..., "us": ...})."""
        self._seq += 1
        command: dict[str, Any] = {"seq": self._seq, "op": op,
                                   "pods": [_as_json(p) for p in pods],
                                   "containers": [_as_json(c) for c in containers]}
        for key, message in (("pod", pod), ("container", container), ("resources", resources)):
            if message is not None:
                command[key] = _as_json(message)
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(max(0.1, deadline - time.monotonic()))
            if event["event"] == "reply" and event["seq"] == self._seq:
                return event
            self._kept.append(event)

    def wait_event(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first line named `name` not yet taken, waiting up to `timeout` seconds for it."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self._kept):
                if event["event"] == name:
                    return self._kept.pop(i)
            self._kept.append(self.next_event(max(0.1, deadline - time.monotonic())))

    def close(self) -> None:
        """End the script (stdin closed) and the process."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        super().close()


def _as_json(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return dict(MessageToDict(message, preserving_proto_field_name=True))


def start_reference_plugin(binary: str, socket: Path) -> subprocess.Popen[bytes]:
    """NRI's Go stub as a plugin (same adjustment as the tests' handler) connected to `socket`."""
    return subprocess.Popen([binary, "-plugin", "-socket", str(socket)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
