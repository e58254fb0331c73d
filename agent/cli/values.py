"""argparse `type=` checks for option values: a bad value is one argparse error line and exit 2.

Each raises argparse.ArgumentTypeError with what was wrong; argparse names the option.  Imported
only by `agent.cli.parser.build_parser` (argparse is loaded by then).
"""

from __future__ import annotations

import argparse
import math

from agent.errors import ConfigError


def seconds(text: str) -> float:
    """A duration in seconds, more than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def listen_address(text: str) -> str:
    """`host:port` for the /metrics server (checked here, used as written)."""
    from agent.metrics.listen import parse_listen

    try:
        parse_listen(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def namespace(text: str) -> str:
    """A namespace name: a DNS-1123 label (lower-case letters, digits and '-', at most 63)."""
    from agent.api.validate import is_dns_label

    if not is_dns_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (a DNS-1123 label: lower-case "
                                         "letters, digits and '-', at most 63 characters)")
    return text


def queue(text: str) -> str:
    """One `--queue NAME=MODE[:NAMESPACE,...]` (the name a `topolet.io/queue` label value, the mode a
    known one, the namespaces DNS labels)."""
    from agent.admission.jobs.queues import parse_queues

    try:
        parse_queues([text])
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--queue ")) from None
    return text
