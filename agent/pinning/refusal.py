"""Why the engine refuses a request: `AllocationRefused`, its reason, and the text that explains it.

A refusal is the node's answer, not an error of ours: too few CPUs (or GPUs) free at all (`CAPACITY`),
a placement the request's policy cannot have (`ALIGNMENT`), or a request that is not valid
(`INVALID`).  The reasons are `agent.metrics.registry.REFUSAL_REASONS`, spelled here rather than
imported: `topolet exec` refuses too and starts without the Prometheus client.  Everything here is
pure: the engine passes in what it holds.
"""

from __future__ import annotations

from agent.alloc.devices import is_held
from agent.alloc.request import Request
from agent.enforce.state import State
from agent.errors import AllocationError
from agent.gpu.model import GPU
from agent.topology.cpuset import CPUSet

CAPACITY, ALIGNMENT, INVALID = "capacity", "alignment", "invalid"


class AllocationRefused(AllocationError):
    """The node cannot or may not satisfy a request (not an error of ours); `reason` says why."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason  # one of agent.metrics.registry.REFUSAL_REASONS


def shortfall(request: Request, state: State, allowed: CPUSet, machine: CPUSet, root: str) -> str:
    """Why too few CPUs are free for `request`, whichever is true: the node's size (one CPU always
    stays in the shared pool), its reservation, or other allocations; "" when none of them.
    `allowed`: the CPUs the engine may use; `machine`: the topology's; `root`: the cpuset root."""
    most = len(allowed) - 1
    if request.cpus > most:
        where = "this machine has" if allowed == machine else f"the cpuset {root} allows"
        return (f"{where} only {len(allowed)} CPUs and one always stays in the shared pool, so at most "
                f"{most} can be exclusive")
    reserved = state.reserved & allowed
    held = state.allocated() & allowed
    others = f"{len(held)} held by other allocations (topolet status lists them)" if held else ""
    if reserved and request.cpus <= len(allowed - held) - 1:  # it would fit with nothing reserved
        are = "CPUs are" if len(reserved) > 1 else "CPU is"
        return (f"{len(reserved)} {are} reserved ({reserved.cpulist()}){' and ' if others else ''}"
                f"{others}; --reserved-cpus changes the reservation")
    return others


def refusal_reason(free: CPUSet, request: Request, state: State, gpus: int,
                   node_gpus: tuple[GPU, ...]) -> str:
    """Why the allocator refused: too few CPUs (or GPUs) free at all, else their placement."""
    if len(free - request.reserved) < request.cpus:
        return CAPACITY
    held = state.held_gpus()
    if gpus > sum(1 for g in node_gpus if not is_held(g, held)):
        return CAPACITY
    return ALIGNMENT
