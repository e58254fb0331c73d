"""`topolet discover --format labels`: the node labels this machine (or a dump) gets, one `key=value` a line.

Public API: `run_discover_labels(args)`.
"""

from __future__ import annotations

import sys

from agent.labels import build_labels, render_labels
from agent.topology.report import discover_and_warn

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time, and `discover` is timed as a whole process
    import argparse


def run_discover_labels(args: argparse.Namespace) -> int:
    """Entry point of `topolet discover --format labels`: the labels on stdout, the scan's warnings
    on stderr."""
    topo = discover_and_warn(args.fsroot)
    sys.stdout.write(render_labels(build_labels(topo, gfd_compat=args.gfd_compat)))
    return 0
