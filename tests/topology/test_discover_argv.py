"""`topolet discover`'s argparse-free command line: the same values, output and errors as argparse."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.cli import build_parser, main, plain_discover_args
from tests.conftest import topolet_bin

DUMP = "16em64t-4s2c2t"


def argparse_values(words: list[str]) -> dict[str, object] | None:
    """What the full parser makes of `discover WORDS`, or None where it refuses them."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return vars(build_parser().parse_args(["discover", *words]))
    except SystemExit:
        return None


@pytest.mark.parametrize("words", [
    [],
    ["--fsroot", "/x"],
    ["--fsroot=/x"],
    ["--fsroot="],
    ["--fsroot", ""],
    ["--fsroot=-x"],
    ["--fsroot=a b=c"],
    ["--fsroot", "a b", "--format", "json"],
    ["--format=yaml", "--gfd-compat"],
    ["--format", "labels", "--gfd-compat", "--fsroot", "/r", "--fsroot", "/s"],
    ["--gfd-compat", "--gfd-compat", "--format=conformance", "--format", "table"],
])
def test_plain_words_are_read_as_argparse_reads_them(words: list[str]) -> None:
    fast = plain_discover_args(words)
    assert fast is not None, "a plain discover command line should skip argparse"
    assert vars(fast) == argparse_values(words)


@pytest.mark.parametrize("words", [
    ["--help"], ["-h"], ["--fs", "/x"], ["--fsroot"], ["--fsroot", "-x"], ["--fsroot", "-"],
    ["--fsroot", "-5"], ["--format", "xml"], ["--format=json=1"], ["--gfd-compat=1"], ["--", "x"],
    ["stray"], ["--format", "json", "stray"], ["--FORMAT", "json"],
])
def test_anything_else_goes_to_argparse(words: list[str]) -> None:
    assert plain_discover_args(words) is None


WORD = st.sampled_from([
    "--fsroot", "--format", "--gfd-compat", "--fsroot=/a", "--fsroot=", "--format=json", "--format=x",
    "--gfd-compat=", "--fs", "--form", "-h", "--", "-", "-1", "-x", "", "/a", "a b", "json", "table",
    "yaml", "labels", "conformance", "xml", "discover",
])


@given(st.lists(WORD, max_size=6))
def test_the_plain_path_never_accepts_what_argparse_refuses_or_reads_differently(words: list[str]) -> None:
    fast = plain_discover_args(words)
    if fast is not None:
        assert vars(fast) == argparse_values(words)


@pytest.mark.parametrize("fmt", ["table", "json", "yaml", "labels", "conformance"])
def test_output_is_the_same_through_either_parser(dump_root, capsys, fmt: str) -> None:  # type: ignore[no-untyped-def]
    words = ["--fsroot", str(dump_root(DUMP)), "--format", fmt, "--gfd-compat"]
    assert main(["discover", *words]) == 0
    plain = capsys.readouterr()
    args = build_parser().parse_args(["discover", *words])
    assert args.handler(args) == 0
    assert capsys.readouterr() == plain
    assert plain.out


@pytest.mark.parametrize(("words", "code", "says"), [
    (["--format", "xml"], 2, "invalid choice: 'xml'"),
    (["--fsroot"], 2, "expected one argument"),
    (["--fsroot", "-x"], 2, "expected one argument"),
    (["--gfd-compat=1"], 2, "ignored explicit argument '1'"),
    (["stray"], 2, "unrecognized arguments: stray"),
    (["--help"], 0, "--gfd-compat"),
])
def test_bad_flags_keep_argparse_messages_and_exit_codes(words: list[str], code: int, says: str) -> None:
    p = subprocess.run([topolet_bin(), "discover", *words], capture_output=True, text=True, timeout=60)
    assert p.returncode == code
    assert says in (p.stdout if code == 0 else p.stderr)
    assert "Traceback" not in p.stderr


def test_a_plain_discover_does_not_import_argparse(dump_root) -> None:  # type: ignore[no-untyped-def]
    code = ("import sys; before = set(sys.modules); from agent.cli import main; "
            f"rc = main(['discover', '--fsroot', {str(dump_root(DUMP))!r}, '--format', 'json']); "
            "sys.exit(rc or (3 if 'argparse' in set(sys.modules) - before else 0))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


ENTRIES = {
    "main": "import sys; from agent.cli import main; sys.exit(main())",
    "run": "from agent.cli import run; run()",  # the console script's entry
}


def entry(name: str, words: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", ENTRIES[name], *words], timeout=60, check=False,
                          **kw)  # type: ignore[call-overload,no-any-return]


@pytest.mark.parametrize("words", [
    ["discover", "--format", "json"],
    ["discover", "--format", "labels", "--gfd-compat"],
    ["discover", "--format", "table", "--fsroot", "/nonexistent-root"],
    ["discover", "--format", "xml"],
    ["discover", "--help"],
    ["status", "--format", "xml"],
])
def test_the_console_entry_prints_and_exits_as_main_does(dump_root, words: list[str]) -> None:  # type: ignore[no-untyped-def]
    if "--fsroot" not in words and words[0] == "discover":
        words += ["--fsroot", str(dump_root(DUMP))]
    ran, mained = (entry(n, words, capture_output=True) for n in ("run", "main"))
    assert (ran.returncode, ran.stdout, ran.stderr) == (mained.returncode, mained.stdout, mained.stderr)
    assert ran.stdout or ran.stderr


def test_a_closed_stdout_ends_both_entries_alike(dump_root) -> None:  # type: ignore[no-untyped-def]
    words = ["discover", "--fsroot", str(dump_root("256ppc-8n8s4t")), "--format", "json"]
    codes = []
    for name in ("run", "main"):
        r, w = os.pipe()
        os.close(r)  # the reader is gone before the command writes a byte
        try:
            codes.append(entry(name, words, stdout=w, stderr=subprocess.DEVNULL).returncode)
        finally:
            os.close(w)
    assert codes[0] == codes[1] != 0
