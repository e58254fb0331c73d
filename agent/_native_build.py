"""Builds the cffi extension `agent._native` from csrc/ (cffi out-of-line API mode)."""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

_ROOT = Path(__file__).resolve().parent.parent
_CSRC = _ROOT / "csrc"


def _sources() -> list[str]:
    """The C sources, as csrc/Makefile lists them (its one `SRCS :=` line): one list for both builds."""
    lines = [line for line in (_CSRC / "Makefile").read_text().splitlines() if line.startswith("SRCS :=")]
    if len(lines) != 1:
        raise RuntimeError(f"csrc/Makefile: expected one 'SRCS :=' line, found {len(lines)}")
    sources = lines[0].removeprefix("SRCS :=").split()
    if not sources or not all(s.endswith(".c") and (_CSRC / s).is_file() for s in sources):
        raise RuntimeError(f"csrc/Makefile: SRCS names a missing or non-C file: {sources}")
    return sources


def _src(name: str) -> str:
    """A source path relative to the working directory when possible (setuptools prefers it)."""
    path = _CSRC / name
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


ffibuilder = FFI()
ffibuilder.cdef((_CSRC / "topolet_api.h").read_text())
ffibuilder.set_source(
    "agent._native",
    # cffi's generated glue follows this preamble; its unused parameters are not ours to fix
    '#include "topolet.h"\n'
    "#pragma GCC diagnostic ignored \"-Wunused-parameter\"\n",
    sources=[_src(s) for s in _sources()],
    include_dirs=[_src("")],
    # the scan splits many CPU folders between POSIX threads
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"],
    extra_link_args=["-pthread"],
)
