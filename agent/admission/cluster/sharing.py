"""Equal parts of many objects held once: what lets the controller keep 100,000 pods in little memory.

`Sharing()`: `.tree(value)` returns `value` with every string interned (`sys.intern`) and every dict
and list in it replaced by the one equal copy the table already holds (hash-consing), `.held` the count
of parts it holds.  `shared_strings(value)`: the strings alone.  A Job's pods repeat their containers,
resources, owner references and most labels; a Deployment's or a DaemonSet's pods repeat nearly all
of themselves.  Decoded JSON holds each of those as its own dicts (a few KiB a pod); shared, they are
held once.

The contract: what `tree` returns is never changed in place by anyone (the stores' objects are read,
never written: a write builds a new object).  A part is held by the table only while some object
still holds it: the table drops the parts nobody else holds each time it has doubled since it last
looked, so nothing a tenant writes is kept longer than its objects, and the table stays within twice
the parts alive.  Thread-safe (a store's watch and its writers' responses both slim objects).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping
from typing import Any

_encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
Own = Mapping[str, "Own"]  # the paths of an object's own parts, as a tree of keys
_FLOOR = 1024  # the table looks for parts nobody holds once it holds this many


def shared_strings(value: object) -> Any:
    """`value` with every string in it interned: the node names, phases, quantities and label values
    that 100,000 pods repeat are held once.  Interned strings are freed with their last holder."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: shared_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shared_strings(v) for v in value]
    return value


class Sharing:
    """A table of the dicts and lists that stored objects hold, each equal one held once."""

    def __init__(self) -> None:
        self._parts: dict[int, Any] = {}  # hash of a part's contents -> the part (collisions: not shared)
        self._lock = threading.Lock()
        self._look_at = _FLOOR

    @property
    def held(self) -> int:
        return len(self._parts)

    def tree(self, value: object, own: Own | None = None) -> Any:
        """`value`, its strings interned and its dicts and lists the table's equal copies (see the
        module docstring: the result is never to be changed in place).  `own`: the parts that are the
        object's own (a pod's metadata holds its uid), a tree of keys ("*" for a list's items), e.g.
        `{"metadata": {}}`: those are rebuilt, never looked up, where each would only add an entry."""
        with self._lock:
            out = self._walk(value, own) if own is not None else self._part(value)
            if len(self._parts) >= self._look_at:
                self._drop_unheld()
            return out

    def _walk(self, value: object, own: Own) -> Any:
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                below = own.get(k)
                out[sys.intern(k) if isinstance(k, str) else k] = (
                    sys.intern(v) if isinstance(v, str) else self._walk(v, below) if below is not None
                    else self._part(v))
            return out
        if isinstance(value, list):
            below = own.get("*")
            return [self._walk(v, below) if below is not None else self._part(v) for v in value]
        return shared_strings(value)

    def _part(self, value: object) -> Any:
        if not isinstance(value, (dict, list)):
            return shared_strings(value)
        try:  # the JSON text names the contents (true apart from 1) and is made in C
            key = hash(_encode(value))
        except (TypeError, ValueError):  # not JSON (a test's object): held as it is
            return shared_strings(value)
        held = self._parts.get(key)
        if held is not None and held == value:  # (a dict never equals a list)
            return held
        out = shared_strings(value)
        if held is None:  # else a different part with the same hash: this one is not shared
            self._parts[key] = out
        return out

    def _drop_unheld(self) -> None:
        # A part that only the table holds has three references here: the table's, `part`'s and
        # getrefcount's argument.  A part never holds another entry of the table (a part not found is
        # held as its own new copy), so one sweep frees everything nobody holds.
        unheld, part = [], None
        for key in list(self._parts):
            part = self._parts[key]
            if sys.getrefcount(part) <= 3:
                unheld.append(key)
        del part
        for key in unheld:
            del self._parts[key]
        self._look_at = max(_FLOOR, 2 * len(self._parts))
