"""The picture commands: `topolet discover --format svg|png`, `topolet status --format svg|png` and
`topolet status --watch` (a live terminal view, redrawn every `--interval` seconds until Ctrl-C).

The drawing is pure (`layout`, `render_svg`, `render_png`, `render_frame`); this module reads the
machine and the state, and writes.  Without a terminal, watch frames are separated by a form feed.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING

from agent.errors import ConfigError, TopoletError
from agent.render.holders import usage_of
from agent.render.layout import Usage, layout
from agent.render.svg import render_svg
from agent.render.terminal import render_frame

if TYPE_CHECKING:  # `discover --format svg` takes the argparse-free path (agent/cli)
    import argparse

    from agent.topology.model import Topology

PICTURE_FORMATS = ("svg", "png")
CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen
FRAME_BREAK = "\f\n"


def _draw(topo: Topology, usage: Usage | None, fmt: str) -> bytes:
    picture = layout(topo, usage)
    if fmt == "png":
        from agent.render.png import render_png

        return render_png(picture)
    return render_svg(picture).encode()


def _write(data: bytes, fmt: str, output: str | None) -> None:
    if output:
        try:
            with open(output, "wb") as f:
                f.write(data)
        except OSError as exc:
            raise ConfigError(f"cannot write {output}: {exc.strerror}") from exc
        return
    if fmt == "png" and sys.stdout.isatty():
        raise ConfigError("PNG bytes would go to the terminal: give --output FILE or redirect stdout")
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def run_discover_picture(args: argparse.Namespace) -> int:
    """`topolet discover --format svg|png`: the machine (or dump) drawn as lstopo draws it."""
    from agent.topology.report import discover_and_warn

    if args.format not in PICTURE_FORMATS:
        raise ConfigError("--output is for the pictures: --format svg or png")
    topo = discover_and_warn(args.fsroot)
    _write(_draw(topo, None, args.format), args.format, getattr(args, "output", None))
    return 0


def run_status_view(args: argparse.Namespace) -> int:
    """`topolet status` with `--watch`, `--format svg|png` or `--output`."""
    if args.watch:
        return run_status_watch(args)
    if args.format not in PICTURE_FORMATS:
        raise ConfigError("--output is for the pictures: --format svg or png")
    return run_status_picture(args)


def run_status_picture(args: argparse.Namespace) -> int:
    """`topolet status --format svg|png`: the machine with each allocation's CPUs coloured."""
    from agent.standalone.launch import status_data
    from agent.topology.discover import discover

    data = status_data(args.state_dir, args.cgroup_root)
    _write(_draw(discover("/"), usage_of(data), args.format), args.format, args.output)
    return 0


def run_status_watch(args: argparse.Namespace) -> int:
    """`topolet status --watch`: a frame every `--interval` seconds until Ctrl-C (then exit 0)."""
    from agent.standalone.launch import status_data

    interval = float(args.interval)
    if not math.isfinite(interval) or interval <= 0:
        raise ConfigError(f"--interval must be a positive number of seconds, not {args.interval}")
    if args.format != "table" or args.output:
        raise ConfigError("--watch draws the terminal view: leave out --format and --output")
    tty = sys.stdout.isatty()
    frames = 0
    try:
        while True:
            clock = time.strftime("%H:%M:%S")
            try:
                frame = render_frame(status_data(args.state_dir, args.cgroup_root), clock, interval)
            except TopoletError as exc:  # a live view outlasts a state file caught mid-repair
                frame = f"topolet status  {clock}\n{exc}\n"
            lead = CLEAR if tty else (FRAME_BREAK if frames else "")
            sys.stdout.write(lead + frame)
            sys.stdout.flush()
            frames += 1
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
