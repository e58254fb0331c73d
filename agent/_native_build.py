"""Builds the cffi extension `agent._native` from csrc/ (cffi out-of-line API mode)."""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

_ROOT = Path(__file__).resolve().parent.parent
_CSRC = _ROOT / "csrc"
_SOURCES = [
    "cpulist.c", "scan.c", "scan_pool.c", "scan_fs.c", "scan_cpus.c", "scan_numa.c", "scan_pci.c",
    "cpuinfo.c", "cpuid.c", "syscalls.c", "inotify.c",
]


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
    sources=[_src(s) for s in _SOURCES],
    include_dirs=[_src("")],
    # the scan splits many CPU folders between POSIX threads
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"],
    extra_link_args=["-pthread"],
)
