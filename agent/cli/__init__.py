"""`topolet` subcommands: `parser.py` (options), `values.py` (their checks), `commands.py` (what each
runs), `mode.py` (the agent's mode), `logging_setup.py`.  Nothing heavy is imported at module level.

This module turns every error into one line on stderr and a non-zero exit: a TopoletError (2), an
OSError no boundary named (1), never a traceback; a path denied to `agent`, `exec` or `cleanup` run
as another user says they need root.  A plainly spelled `topolet discover` command line is read
without argparse (it is timed as a whole process against `lstopo`, and argparse costs about as much
as the scan); anything else goes through the full parser.
"""

from __future__ import annotations

import errno
import os
import sys

from agent.cli import commands
from agent.cli.parser import DISCOVER_FORMATS, build_parser
from agent.errors import ConfigError, KubeAPIError, TopoletError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and argparse cost start-up time, and `discover` is timed as a whole process
    import argparse
    from argparse import Namespace as _Args
    from collections.abc import Callable, Sequence
    from typing import NoReturn

    Handler = Callable[[argparse.Namespace], int]
else:

    class _Args:
        """The parsed command line of the argparse-free `discover` path, read as argparse.Namespace."""

        def __init__(self, **values: object) -> None:
            self.__dict__.update(values)

__all__ = ["DISCOVER_FORMATS", "build_parser", "main", "plain_discover_args", "run"]

# The commands that write this node's cgroups, state folder or features.d file.
ROOT_COMMANDS = ("agent", "exec", "cleanup")


def plain_discover_args(words: Sequence[str]) -> argparse.Namespace | None:
    """`discover`'s options from its words when each is spelled in full and valid, else None.

    None sends the words to argparse, which parses them the same way or words the error, so this
    path accepts only what argparse would accept, with the same values.
    """
    values: dict[str, object] = {"fsroot": "/", "format": "table", "gfd_compat": False, "output": None,
                                 "log_level": None}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--gfd-compat":
            values["gfd_compat"] = True
            continue
        name, eq, value = word.partition("=")
        if name not in ("--fsroot", "--format"):
            return None  # help, abbreviations, `--`, strays: argparse's own handling and messages
        if not eq:
            if i == len(words) or words[i].startswith("-"):
                return None  # argparse reads a leading "-" as an option, or a negative number
            value = words[i]
            i += 1
        if name == "--format" and value not in DISCOVER_FORMATS:
            return None
        values[name[2:]] = value
    return _Args(command="discover", handler=commands.discover, **values)


def _root_hint(command: str, exc: BaseException) -> str:
    """The words "; topolet CMD needs root (or write access to PATH)" for a path denied to a non-root
    run of a command that writes the node's cgroups and state, else ""."""
    # A kubeconfig it may not read is the user's own file, not a reason to run as root.
    if command not in ROOT_COMMANDS or os.geteuid() == 0 or isinstance(exc, ConfigError | KubeAPIError):
        return ""
    cause: BaseException | None = exc
    while not (isinstance(cause, OSError) and cause.errno in (errno.EACCES, errno.EPERM)):
        if cause is None:
            return ""
        cause = cause.__cause__
    path = cause.filename or getattr(exc, "path", None)
    if isinstance(path, str) and not os.path.lexists(path):
        path = os.path.dirname(path)  # a file it was to create: the folder is what it may not write
    access = f" (or write access to {path})" if isinstance(path, str) and path else ""
    return f"; topolet {command} needs root{access}"


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = plain_discover_args(words[1:]) if words[:1] == ["discover"] else None
    if args is None:
        args = build_parser().parse_args(words)
    handler: Handler = args.handler
    level = getattr(args, "log_level", None)
    if level:
        from agent.cli.logging_setup import setup_logging

        setup_logging(level)
    try:
        return handler(args)
    except TopoletError as exc:
        print(f"topolet {args.command}: {exc}{_root_hint(args.command, exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # no boundary named it (a folder that is a file, a full disk): still one line
        if isinstance(exc, BrokenPipeError):
            return 1
        where = f": {exc.filename}" if exc.filename else ""
        print(f"topolet {args.command}: {exc.strerror or exc}{where}{_root_hint(args.command, exc)}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run() -> NoReturn:
    """The `topolet` console script: `main()` on the command line, then exit with its status.

    `discover` then leaves without the interpreter's teardown (freeing every module and the whole
    model, a few ms of a command timed against lstopo) when nothing is left to run at exit: no exit
    handler registered and no threading loaded (the labels' logging registers one).  A flush that
    fails takes the ordinary exit, which reports it as before.
    """
    import atexit  # built in: no import cost

    status = main()
    if sys.argv[1:2] == ["discover"] and not atexit._ncallbacks() and "threading" not in sys.modules:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            sys.exit(status)
        os._exit(status)
    sys.exit(status)

