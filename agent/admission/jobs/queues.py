"""The operator's queues, queue order and the admission pass over every queue's pending gangs.

Pure: the engine is passed in.  `parse_queues(flags)` (`--queue NAME=MODE[:NS,...]`; ConfigError on
a bad flag), `QueueConfig`, `DEFAULT_QUEUE`, `queue_refusal`, `Pending`, `queue_order`,
`admission_pass(pending, queues, decide)`.  Order: higher priority, then older, then name, all queues
merged; a StrictFIFO head refused "not-now" blocks its queue, a "never" refusal does not.
agent/admission/jobs/README.md, "Queues".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.admission.engine.model import Gang, Placement, Refusal
from agent.api.validate import is_dns_label, is_label_value
from agent.errors import ConfigError

QUEUE_MODES = ("StrictFIFO", "BestEffortFIFO")
MAX_NAMED = 10  # queues a refusal names as open to the Job's namespace (the Event stays short)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue the operator configured: its mode and the namespaces whose Jobs it takes."""

    name: str
    mode: str
    namespaces: frozenset[str] | None = None  # None: every namespace (the operator's explicit choice)

    def admits(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def describe(self) -> str:
        where = "every namespace" if self.namespaces is None else ", ".join(sorted(self.namespaces))
        return f"{self.name} ({self.mode}; {where})"


DEFAULT_QUEUE = QueueConfig("default", "BestEffortFIFO")


@dataclass(frozen=True, slots=True)
class QueueRefusal:
    """Why a Job may not enter the queue it names: an Event reason and its message."""

    reason: str  # UnknownQueue | QueueNotAllowed
    message: str


def parse_queues(flags: Iterable[str]) -> dict[str, QueueConfig]:
    """The `--queue` flags into the configured queues by name (see README.md beside this module)."""
    queues: dict[str, QueueConfig] = {}
    for flag in flags:
        queue = _parse_queue(flag)
        if queue.name in queues:
            raise ConfigError(f"--queue {queue.name} given twice")
        queues[queue.name] = queue
    return queues or {DEFAULT_QUEUE.name: DEFAULT_QUEUE}


def _parse_queue(flag: str) -> QueueConfig:
    name, sep, rest = flag.partition("=")
    mode, colon, listed = rest.partition(":")
    name, mode = name.strip(), mode.strip()
    if not sep or not name:
        raise ConfigError(f"--queue wants NAME=MODE or NAME=MODE:NAMESPACE,..., got {flag!r}")
    if not is_label_value(name):  # a Job names its queue in a label: any other name matches none
        raise ConfigError(f"--queue {name!r}: a queue name is a label value (letters, digits, '-', '_' "
                          "and '.', starting and ending alphanumeric, at most 63 characters)")
    if mode not in QUEUE_MODES:
        raise ConfigError(f"--queue {name}: mode must be one of {', '.join(QUEUE_MODES)}, got {mode!r}")
    if not colon:
        return QueueConfig(name, mode)
    namespaces: set[str] = set()
    for part in listed.split(","):
        namespace = part.strip()
        if not namespace:
            raise ConfigError(f"--queue {name}: an empty namespace in {listed!r} (leave out ':' and "
                              "the list to open the queue to every namespace)")
        if not is_dns_label(namespace):
            raise ConfigError(f"--queue {name}: {namespace!r} is not a namespace name (a DNS-1123 label: "
                              "lower-case letters, digits and '-', at most 63 characters)")
        if namespace in namespaces:
            raise ConfigError(f"--queue {name}: namespace {namespace} listed twice")
        namespaces.add(namespace)
    return QueueConfig(name, mode, frozenset(namespaces))


def queue_refusal(queues: Mapping[str, QueueConfig], queue: str, namespace: str) -> QueueRefusal | None:
    """Why a Job in `namespace` may not enter `queue`; None when it may."""
    config = queues.get(queue)
    if config is not None and config.admits(namespace):
        return None
    open_to = sorted(name for name, q in queues.items() if q.admits(namespace))
    named = ", ".join(open_to[:MAX_NAMED]) + (f" and {len(open_to) - MAX_NAMED} more"
                                                if len(open_to) > MAX_NAMED else "")
    may_use = (f"namespace {namespace} may use: {named}" if open_to
               else f"no queue takes namespace {namespace}")
    stays = "the Job stays suspended, in no queue, until its topolet.io/queue label names one it may use"
    if config is None:
        return QueueRefusal("UnknownQueue", f"queue {queue!r} is not configured ({may_use}); {stays}")
    return QueueRefusal("QueueNotAllowed",
                        f"queue {queue!r} does not take Jobs from namespace {namespace} ({may_use}); {stays}")


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


def admission_pass(pending: Iterable[Pending], queues: Mapping[str, QueueConfig],
                   decide: Callable[[Gang], Placement | Refusal]) -> list[Outcome]:
    """One decision per pending gang, in queue order (see README.md beside this module)."""
    blocked: dict[str, str] = {}  # StrictFIFO queue -> the head that blocks it
    out: list[Outcome] = []
    for p in sorted(pending, key=queue_order):
        head = blocked.get(p.queue)
        if head is not None:
            out.append(Outcome(p, Blocked(head)))
            continue
        result = decide(p.gang)
        queue = queues.get(p.queue)
        if (isinstance(result, Refusal) and result.kind == "not-now"
                and queue is not None and queue.mode == "StrictFIFO"):
            blocked[p.queue] = p.gang.key
        out.append(Outcome(p, result))
    return out
