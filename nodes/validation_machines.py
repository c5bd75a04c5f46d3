"""Which validation runs may measure at the same time: the rule the control loop's validation
step schedules by (``nodes.device_validation.validation_step``). Pure functions over plain
data; see docs/validation.md, "Decisions".

Two runs on different machines never disturb each other. Two runs on one machine (every
loopback address is this machine) may run together when both nodes are pinned to CPU sets
that are known and disjoint (``Node.cpu_set``, the list ``up`` pins each local agent to), and
run one after the other otherwise: a node with no CPU set may run anywhere on its machine, so
it always runs alone there. ``$PHALANX_VALIDATIONS_TOGETHER=0`` (``TOGETHER``) makes every run
on one machine wait for the others. Measured with ``bench/validation.py --compare`` (figures
in docs/validation.md): on a quiet machine two runs at once, each on its own CPU, took half
the wall time and moved each figure by 2 to 5 %, less than decode's own spread between runs;
on a machine busy with other work they disturbed each other by a third or more.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

TOGETHER = os.environ.get("PHALANX_VALIDATIONS_TOGETHER", "1").lower() not in ("0", "false", "no")


def host_key(address: str) -> str:
    """Which machine an address (``host:port``) is on: every loopback address (127.0.0.0/8,
    localhost, ::1) is ``"loopback"``, this machine; any other host is its own name,
    lower-cased."""
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    return "loopback" if host.startswith("127.") or host in ("localhost", "::1") else host


def cpu_set_of(text: str) -> frozenset[int] | None:
    """The CPUs of a CPU list such as ``"0"``, ``"0-3"`` or ``"0,2-3"``; None when the list is
    empty or not one (the node may run on any CPU of its machine)."""
    cpus: set[int] = set()
    for part in (text or "").split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus) or None


@dataclass(frozen=True)
class Placement:
    """Where a node measures: its machine (``host_key``) and its CPUs (None: any of them)."""

    host: str
    cpus: frozenset[int] | None

    @classmethod
    def of(cls, *, address: str, cpu_set: str) -> Placement:
        """The placement of a node at ``address`` pinned to ``cpu_set`` (``Node`` fields)."""
        return cls(host_key(address), cpu_set_of(cpu_set))

    def disturbs(self, other: Placement, *, together: bool) -> bool:
        """True when a run here and a run at ``other`` would measure each other: the same
        machine, unless ``together`` allows runs on CPU sets that are known and disjoint."""
        if self.host != other.host:
            return False
        if not together or self.cpus is None or other.cpus is None:
            return True
        return bool(self.cpus & other.cpus)


def may_start(
    candidate: Placement, running: Iterable[Placement], *, together: bool | None = None
) -> bool:
    """True when a run at ``candidate`` may start beside the runs ``running`` now;
    ``together``: whether runs on disjoint CPUs of one machine may overlap (None: ``TOGETHER``,
    read at each call)."""
    together = TOGETHER if together is None else together
    return not any(candidate.disturbs(other, together=together) for other in running)
