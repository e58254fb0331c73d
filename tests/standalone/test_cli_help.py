"""Every option of every `topolet` subcommand says what it does in `--help`."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from agent.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser in the tree with its subcommand path, the top-level one first."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its tree here; there is no public walk
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(build_parser()))


def test_the_walk_finds_every_subcommand() -> None:
    assert {" ".join(p) for p, _ in COMMANDS} >= {
        "", "discover", "alloc", "mig", "mig plan", "agent", "exec", "status", "controller"}


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) or "topolet" for p, _ in COMMANDS])
def test_every_option_has_help(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    bare = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
            if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()]
    assert bare == [], f"topolet {' '.join(path)}: options without help"


def test_exec_help_names_what_each_flag_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["exec", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--cpus", "--numa-policy", "--smt", "--memory-binding", "--gpus", "--state-dir",
                 "--reserved-cpus", "--cgroup-root"):
        line = next(line for line in out.splitlines() if line.strip().startswith(flag))
        rest = out[out.index(line) + len(line):].split("\n  -", 1)[0]
        assert len((line.split(None, 2)[2:] or [""])[0] + rest.strip()) > 10, flag


def test_version_prints_the_installed_distributions_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"topolet {version('topolet')}"
