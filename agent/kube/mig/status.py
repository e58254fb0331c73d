"""The MIG layout a Node asks for and how applying it went, shared by the publisher and the enforcer.

MIG follows NVIDIA MIG manager's protocol on the Node: the user's label `topolet.io/mig.config`
names the layout (else `--mig-config`), and the agent answers in `topolet.io/mig.config.state`
(pending, success, failed).  `MigStatus` holds both sides; `MigConfigChanged` is the enforcer's cue
to apply a new layout now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigConfigChanged:
    """The Node asks for another MIG layout: the enforcer applies it now, not at its next reconcile."""


class MigStatus:
    """The MIG layout the Node asks for and how applying it went, shared by the publisher (reads the
    Node, publishes the state) and the enforcer (applies the layout); fields are replaced whole."""

    def __init__(self, fallback: str) -> None:
        self.fallback = fallback  # --mig-config: the layout while the Node carries no label
        self.desired: str | None = None  # None until this run has read the Node
        # The layout the enforcer may apply: `desired` once the publisher has put the state label
        # that goes with it ("pending" for a new layout) on the Node, so no change starts unannounced.
        self.released: str | None = None
        self.result: tuple[str, str | None] = ("", None)  # (layout, state) of the enforcer's last pass
        self.changed_since_start = False
        self.live_state: str | None = None  # the state label the Node carried when first read

    def node_labels(self, labels: Mapping[str, str]) -> bool:
        """Take the layout from the Node's labels; True when it differs from the one known before."""
        from agent.gpu.applier import STATE_LABEL
        from agent.gpu.reconcile import CONFIG_LABEL, STATES

        wanted = str(labels.get(CONFIG_LABEL) or "").strip() or self.fallback
        if self.desired is None:
            live = labels.get(STATE_LABEL)
            self.live_state = live if live in STATES else None
        elif wanted != self.desired:
            self.changed_since_start = True
        changed = wanted != self.desired
        self.desired = wanted
        return changed

    def report(self, layout: str, state: str | None) -> bool:
        """The enforcer's outcome for `layout`; True when it differs from the last one."""
        changed = (layout, state) != self.result
        self.result = (layout, state)
        return changed

    def state(self) -> str | None:
        """The value of `topolet.io/mig.config.state` now (None: no label).

        "pending" from the moment the Node asks for a layout the enforcer has not reported on yet;
        after a restart the Node's own value stands until the first pass, so that an agent restart
        on a node whose layout already holds does not flip it to pending and back.
        """
        if not self.desired:
            return None
        layout, state = self.result
        if layout == self.desired:
            return state
        if self.changed_since_start:
            return "pending"
        return self.live_state or "pending"

    def labels(self) -> dict[str, str]:
        """The state label to publish; never `topolet.io/mig.config` itself (the user's label)."""
        from agent.gpu.applier import STATE_LABEL

        state = self.state()
        return {STATE_LABEL: state} if state else {}
