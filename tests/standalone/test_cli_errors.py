"""What a new user's mistakes look like: each is one line on stderr and a non-zero exit, never a traceback.

Every test runs the real `topolet` command.  The API server cases use a kubeconfig whose server is a
closed local port (unreachable) or a real HTTP server that answers 403 to everything (no RBAC).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import build_parser
from agent.cli.logging_setup import LOG_LEVELS
from agent.cli.mode import agent_mode
from agent.errors import ConfigError
from tests.conftest import require, topolet_bin
from tests.standalone.conftest import Node
from tests.standalone.test_cli_help import COMMANDS

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a machine outside any cluster, with no kubeconfig of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**env, "HOME": str(tmp_path), **extra}


def topolet(tmp_path: Path, *words: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [topolet_bin(), *words]
    if words[:1] in (("agent",), ("controller",)) and not any(w.startswith("--listen") for w in words):
        argv += ["--listen", "127.0.0.1:0"]  # any free port: never a default another test's process holds
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(tmp_path), cwd=tmp_path, check=False)


def the_error(p: subprocess.CompletedProcess[str], command: str) -> str:
    """The one line a failed command said (its log lines aside); fails on anything more."""
    assert p.returncode != 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    said = [line for line in p.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(said) == 1, p.stderr
    assert said[0].startswith(f"topolet {command}: "), said
    return said[0]


def kubeconfig(tmp_path: Path, server: str, name: str = "kubeconfig") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port_in_use() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.fixture
def forbidding_server() -> Iterator[str]:
    """An HTTP server that refuses every request as the API server refuses an identity without RBAC."""

    class Forbid(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                               "reason": "Forbidden", "message": f'{self.path.split("?")[0]} is forbidden: '
                               'User "system:anonymous" cannot get this'}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forbid)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- kubeconfig -------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["controller"], ["agent", "--node-name", "n1"]])
def test_a_malformed_kubeconfig_is_one_line(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "bad").write_text("clusters: [\n")
    line = the_error(topolet(tmp_path, *command, "--kubeconfig", str(tmp_path / "bad")), command[0])
    assert f"cannot load Kubernetes client configuration from {tmp_path / 'bad'}" in line


def test_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    line = the_error(topolet(tmp_path, "controller", "--kubeconfig", str(tmp_path / "absent")), "controller")
    assert "kubeconfig not found" in line


@pytest.mark.parametrize("how", ["--kubeconfig", "$KUBECONFIG", "$KUBECONFIG with several files"])
def test_an_unreachable_api_server_stops_the_controller_with_a_line_that_says_so(
        tmp_path: Path, closed_port: int, how: str) -> None:
    config = kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port}")
    if how == "--kubeconfig":
        p = topolet(tmp_path, "controller", "--kubeconfig", str(config))
    else:
        files = str(config)
        if how != "$KUBECONFIG":
            files = os.pathsep.join([str(tmp_path / "absent"), files])
        p = topolet(tmp_path, "controller", env=clean_env(tmp_path, KUBECONFIG=files))
    line = the_error(p, "controller")
    assert p.returncode == 2
    assert f"API server http://127.0.0.1:{closed_port} unreachable: Connection refused" in line
    assert "Kueue" not in line
    assert "urllib3" not in p.stderr  # no connection-retry chatter


def test_a_queue_given_twice_stops_the_controller_before_the_api(tmp_path: Path, closed_port: int) -> None:
    config = kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port}")
    p = topolet(tmp_path, "controller", "--kubeconfig", str(config),
                "--queue", "q=StrictFIFO:team-a", "--queue", "q=BestEffortFIFO")
    assert p.returncode == 2
    assert "--queue q given twice" in the_error(p, "controller")


def test_no_configuration_at_all_says_where_it_looked(tmp_path: Path) -> None:
    line = the_error(topolet(tmp_path, "controller"), "controller")
    assert "no --kubeconfig, $KUBECONFIG unset" in line and "~/.kube/config" in line


def test_a_403_is_said_as_missing_rbac_not_blamed_on_kueue(tmp_path: Path, forbidding_server: str) -> None:
    p = topolet(tmp_path, "controller", "--kubeconfig", str(kubeconfig(tmp_path, forbidding_server)))
    line = the_error(p, "controller")
    assert "HTTP 403" in line and "RBAC" in line
    assert "Kueue" not in line


def test_the_agent_reads_kubeconfig_from_the_environment(  # type: ignore[no-untyped-def]
        tmp_path: Path, closed_port: int, dump_root) -> None:
    config = kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port}")
    p = topolet(tmp_path, "agent", "--once", "--enforcement", "off", "--node-name", "n1",
                "--fsroot", str(dump_root("16em64t-4s2c2t")), "--state-dir", str(tmp_path / "state"),
                "--features-dir", str(tmp_path / "features.d"), "--label-sink", "none",
                env=clean_env(tmp_path, KUBECONFIG=str(config)))
    line = the_error(p, "agent")
    assert "kubernetes mode: --mode auto with $KUBECONFIG set" in p.stderr
    assert f"list pods on n1: API server http://127.0.0.1:{closed_port} unreachable" in line


# -- listening --------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["controller"], ["agent", "--mode", "standalone"]])
@pytest.mark.parametrize("listen", ["bogus", "127.0.0.1:99999", "::1:9470", "host:"])
def test_a_bad_listen_address_is_one_line(tmp_path: Path, command: list[str], listen: str) -> None:
    p = topolet(tmp_path, *command, f"--listen={listen}")
    assert p.returncode == 2
    assert "argument --listen" in the_error(p, command[0]).replace(f"topolet {command[0]}: error: ", "")


def test_a_port_in_use_stops_the_controller_before_it_asks_the_api(
        tmp_path: Path, port_in_use: int, closed_port: int) -> None:
    p = topolet(tmp_path, "controller", "--listen", f"127.0.0.1:{port_in_use}",
                "--kubeconfig", str(kubeconfig(tmp_path, f"http://127.0.0.1:{closed_port}")))
    assert the_error(p, "controller") == (
        f"topolet controller: cannot serve /metrics on 127.0.0.1:{port_in_use}: Address already in use")


def test_a_port_in_use_stops_the_standalone_agent(tmp_path: Path, port_in_use: int) -> None:
    p = topolet(tmp_path, "agent", "--mode", "standalone", "--listen", f"127.0.0.1:{port_in_use}",
                "--cgroup-root", str(tmp_path / "no-cgroups"), "--state-dir", str(tmp_path / "state"),
                "--features-dir", str(tmp_path / "features.d"))
    assert "Address already in use" in the_error(p, "agent")


# -- values -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("words", "says"), [
    (["controller", "--resync-seconds=-1"], "argument --resync-seconds: must be more than 0 seconds"),
    (["controller", "--resync-seconds=0"], "must be more than 0 seconds"),
    (["controller", "--resync-seconds=nan"], "must be more than 0 seconds"),
    (["controller", "--resync-seconds=soon"], "'soon' is not a number of seconds"),
    (["controller", "--ledger-timeout-seconds=-5"], "argument --ledger-timeout-seconds"),
    (["controller", "--lease-duration=0"], "argument --lease-duration"),
    (["controller", "--queue", "Bad_Name!=StrictFIFO"], "a queue name is a label value"),
    (["controller", "--queue", "=StrictFIFO"], "wants NAME=MODE"),
    (["controller", "--queue", "q=Fastest"], "mode must be one of StrictFIFO, BestEffortFIFO"),
    (["controller", "--queue", f"{'q' * 64}=StrictFIFO"], "a queue name is a label value"),
    (["controller", "--queue", "q=StrictFIFO:Team-A"], "'Team-A' is not a namespace name"),
    (["controller", "--queue", "q=StrictFIFO:"], "an empty namespace"),
    (["controller", "--queue", "q=StrictFIFO:a,a"], "namespace a listed twice"),
    (["controller", "--queue", "q=StrictFIFO:a.b"], "'a.b' is not a namespace name"),
    (["controller", "--namespace", "Topolet.System"], "not a namespace name"),
    (["agent", "--reconcile-seconds=-1"], "argument --reconcile-seconds"),
    (["agent", "--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
    (["agent", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_values_are_refused_in_one_line(tmp_path: Path, words: list[str], says: str) -> None:
    p = topolet(tmp_path, *words)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1, p.stderr  # argparse's usage is a --help away
    assert says in p.stderr and "see topolet" in p.stderr


@pytest.mark.parametrize(("words", "says"), [
    (["exec", "--cpu", "1"], "unrecognized arguments: --cpu (did you mean --cpus?); the following "
                             "arguments are required: --cpus"),
    (["exec", "--cpus", "1", "--cpu", "1"], "unrecognized arguments: --cpu (did you mean --cpus?)"),
    (["exec", "--cpus", "1", "--memory"],
     "unrecognized arguments: --memory (did you mean --memory-binding?)"),
    (["cleanup", "--loc"], "unrecognized arguments: --loc (did you mean --local?)"),
    (["status", "--form", "json"], "unrecognized arguments: --form (did you mean --format?)"),
    (["mig", "plan", "--gpu-mod", "H100-80GB", "--demand", "all-balanced"],
     "unrecognized arguments: --gpu-mod (did you mean --gpu-model?); the following arguments are "
     "required: --gpu-model"),
])
def test_an_abbreviated_option_is_refused_not_guessed(tmp_path: Path, words: list[str], says: str) -> None:
    # Where today's argparse would guess, the run touches only this test's folders.
    where = ["--state-dir", str(tmp_path / "state"), "--cgroup-root", str(tmp_path / "no-cgroups")]
    if words[0] == "cleanup":
        where += ["--features-dir", str(tmp_path / "features.d")]
    tail = ["--", "touch", str(tmp_path / "ran")] if words[0] == "exec" else []
    p = topolet(tmp_path, *words, *(where if words[0] in ("exec", "cleanup") else []), *tail)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    command = " ".join(words[:2] if words[0] == "mig" else words[:1])
    assert p.stderr.startswith(f"topolet {command}: error: {says} (see topolet {command} --help)"), p.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) or "topolet" for p, _ in COMMANDS])
def test_no_parser_takes_abbreviations(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    assert parser.allow_abbrev is False


def test_good_values_still_parse() -> None:
    queue, only = "team-a.gpu_1=StrictFIFO", "research=BestEffortFIFO:team-a,team-b"
    args = build_parser().parse_args(["controller", "--resync-seconds", "0.5", "--queue", queue, "--queue",
                                      only, "--namespace", "topolet-system", "--listen", "[::1]:0"])
    assert (args.resync_seconds, args.queue, args.namespace) == (0.5, [queue, only], "topolet-system")


# -- help and log level -----------------------------------------------------------------------------


def test_the_test_only_crash_flag_works_but_is_not_offered(tmp_path: Path) -> None:
    p = topolet(tmp_path, "controller", "--help")
    assert p.returncode == 0 and "--crash-at" not in p.stdout and "--log-level" in p.stdout
    args = build_parser().parse_args(["controller", "--crash-at", "after-decision"])
    assert args.crash_at == "after-decision"


LEAVES = [(path, parser) for path, parser in COMMANDS
          if path and not any(a.__class__.__name__ == "_SubParsersAction" for a in parser._actions)]


@pytest.mark.parametrize(("path", "parser"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_subcommand_takes_a_log_level(path: tuple[str, ...],
                                            parser: argparse.ArgumentParser) -> None:
    [action] = [a for a in parser._actions if "--log-level" in a.option_strings]
    assert tuple(action.choices or ()) == LOG_LEVELS


# -- the agent's mode -------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "kubeconfig", "environ", "picked", "why"), [
    ("auto", None, {}, "standalone", "--mode auto found no cluster"),
    ("auto", None, {"KUBECONFIG": " "}, "standalone", "found no cluster"),
    ("auto", "kc", {}, "kubernetes", "--mode auto with --kubeconfig"),
    ("auto", None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "kubernetes", "in a pod"),
    ("auto", None, {"KUBECONFIG": "a:b"}, "kubernetes", "with $KUBECONFIG set"),
    ("kubernetes", None, {}, "kubernetes", "--mode kubernetes"),
    ("standalone", None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "standalone", "--mode standalone"),
])
def test_agent_mode(mode: str, kubeconfig: str | None, environ: dict[str, str], picked: str,
                    why: str) -> None:
    got, reason = agent_mode(mode, kubeconfig, environ)
    assert got == picked and why in reason


def test_standalone_with_a_kubeconfig_is_a_contradiction() -> None:
    with pytest.raises(ConfigError, match="--kubeconfig is for the Kubernetes mode"):
        agent_mode("standalone", "kc", {})


def test_a_bare_agent_outside_a_cluster_says_which_mode_and_why(tmp_path: Path) -> None:
    words = ["agent", "--once", "--cgroup-root", str(tmp_path / "no-cgroups"), "--state-dir",
             str(tmp_path / "state"), "--features-dir", str(tmp_path / "features.d")]
    p = topolet(tmp_path, *words)
    assert p.returncode == 0, p.stderr
    assert "INFO topolet.agent: standalone mode: --mode auto found no cluster" in p.stderr
    quiet = topolet(tmp_path, *words, "--log-level", "warning")
    assert quiet.returncode == 0 and "standalone mode" not in quiet.stderr


# -- state ------------------------------------------------------------------------------------------


def test_status_without_a_state_file_says_where_it_looked(tmp_path: Path) -> None:
    p = topolet(tmp_path, "status", "--state-dir", str(tmp_path / "nowhere"))
    assert p.returncode == 0, p.stderr
    assert f"no state file at {tmp_path / 'nowhere' / 'state.json'}" in p.stdout
    assert "allocation(s)" not in p.stdout
    data = json.loads(topolet(tmp_path, "status", "--state-dir", str(tmp_path / "nowhere"),
                              "--format", "json").stdout)
    assert (data["state_found"], data["state_file"]) == (False, str(tmp_path / "nowhere" / "state.json"))


def test_a_state_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    line = the_error(topolet(tmp_path, "status", "--state-dir", str(tmp_path / "file")), "status")
    assert "Not a directory" in line


# -- not root ---------------------------------------------------------------------------------------

NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


@pytest.fixture
def root_only() -> Iterator[Path]:
    """A state folder only root may write, where another user may look (pytest's tmp_path is root's),
    beside a features.d folder everyone may write."""
    require(os.geteuid() == 0, "needs root to run topolet as another user")
    require(shutil.which("setpriv") is not None, "needs setpriv (util-linux)")
    top = Path(tempfile.mkdtemp(prefix="topolet-not-root-"))
    try:
        top.chmod(0o755)
        (top / "state").mkdir(mode=0o755)
        (top / "features.d").mkdir()
        (top / "features.d").chmod(0o777)
        yield top / "state"
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("command", [
    ["exec", "--cpus", "1", "--", "true"],
    ["agent", "--once", "--listen", "127.0.0.1:0", "--features-dir", "{top}/features.d"],
    ["cleanup", "--local", "--features-dir", "{top}/features.d"],
])
def test_a_run_as_another_user_than_root_says_it_needs_root(node: Node, root_only: Path,
                                                             command: list[str]) -> None:
    words = [w.format(top=root_only.parent) for w in command]
    split = words.index("--") if "--" in words else len(words)
    argv = [*NOBODY, topolet_bin(), *words[:split], "--state-dir", str(root_only), "--cgroup-root", node.root,
            *words[split:]]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=node.env(), cwd=root_only.parent,
                       check=False)
    line = the_error(p, command[0])
    assert "Permission denied" in line
    assert line.endswith(f"; topolet {command[0]} needs root (or write access to {root_only})"), line
    assert os.listdir(root_only) == []
