"""Queue order and the admission pass over every queue's pending gangs.  Pure: the engine is passed in.

Public API:

- `QUEUE_MODES` ("StrictFIFO", "BestEffortFIFO"); `DEFAULT_MODE` = "BestEffortFIFO".
- `parse_queue_modes(flags) -> dict[str, str]`: `NAME=MODE` strings (the `--queue` flags) into a
  map; ConfigError on a malformed flag, a name no `topolet.io/queue` label value can hold, an unknown
  mode or a queue named twice.
- `Pending(gang, queue, created, name)`: one gang waiting in `queue` (created: RFC 3339 creation time).
- `queue_order(p)`: the sort key: higher priority first, then older, then name.
- `admission_pass(pending, modes, decide) -> list[Outcome]`: walk every pending gang in queue order
  (all queues merged, so a higher-priority gang goes first whichever queue it is in) and ask
  `decide(gang)` for a Placement or a Refusal.  The caller's `decide` counts an admitted gang's
  capacity before it returns, so later gangs see it.  In a StrictFIFO queue, a head that is refused
  "not-now" blocks the gangs behind it (they are not tried: `Blocked`); a "never" refusal does not
  block (that gang is rejected and leaves the queue).  In a BestEffortFIFO queue later gangs may pass
  a head that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.admission.engine.model import Gang, Placement, Refusal
from agent.errors import ConfigError
from agent.labels.validate import is_label_value

QUEUE_MODES = ("StrictFIFO", "BestEffortFIFO")
DEFAULT_MODE = "BestEffortFIFO"


def parse_queue_modes(flags: Iterable[str]) -> dict[str, str]:
    """`NAME=MODE` flags into {queue: mode}; a queue not named gets DEFAULT_MODE."""
    modes: dict[str, str] = {}
    for flag in flags:
        name, sep, mode = flag.partition("=")
        name, mode = name.strip(), mode.strip()
        if not sep or not name:
            raise ConfigError(f"--queue wants NAME=MODE, got {flag!r}")
        if not is_label_value(name):  # a Job names its queue in a label: any other name matches none
            raise ConfigError(f"--queue {name!r}: a queue name is a label value (letters, digits, '-', '_' "
                              "and '.', starting and ending alphanumeric, at most 63 characters)")
        if mode not in QUEUE_MODES:
            raise ConfigError(f"--queue {name}: mode must be one of {', '.join(QUEUE_MODES)}, got {mode!r}")
        if name in modes:
            raise ConfigError(f"--queue {name} given twice")
        modes[name] = mode
    return modes


@dataclass(frozen=True, slots=True)
class Pending:
    """A gang waiting in a queue; `created` is the Job's creationTimestamp (RFC 3339 sorts as text)."""

    gang: Gang
    queue: str
    created: str
    name: str


@dataclass(frozen=True, slots=True)
class Blocked:
    """Not tried: the StrictFIFO queue's head `head` (a gang key) does not fit yet."""

    head: str


@dataclass(frozen=True, slots=True)
class Outcome:
    pending: Pending
    result: Placement | Refusal | Blocked


def queue_order(p: Pending) -> tuple[int, str, str]:
    """Priority (higher first), then creation time (older first), then name."""
    return (-p.gang.priority, p.created, p.name)


def admission_pass(pending: Iterable[Pending], modes: Mapping[str, str],
                   decide: Callable[[Gang], Placement | Refusal]) -> list[Outcome]:
    """One decision per pending gang, in queue order (see the module docstring)."""
    blocked: dict[str, str] = {}  # StrictFIFO queue -> the head that blocks it
    out: list[Outcome] = []
    for p in sorted(pending, key=queue_order):
        head = blocked.get(p.queue)
        if head is not None:
            out.append(Outcome(p, Blocked(head)))
            continue
        result = decide(p.gang)
        if (isinstance(result, Refusal) and result.kind == "not-now"
                and modes.get(p.queue, DEFAULT_MODE) == "StrictFIFO"):
            blocked[p.queue] = p.gang.key
        out.append(Outcome(p, result))
    return out
