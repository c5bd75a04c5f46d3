"""A turn's usage from admission to its end: the proxy admits it (``open_ticket``), the relay
feeds its ``Meter`` and calls ``ended`` once when the node's answer ends (or the upstream
closes), which queues the record and settles the rate limits (tokens, lease).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from console.lib.bare_http import db_thread
from inference.usage import limits
from inference.usage.limits import Admission
from inference.usage.meter import Meter
from inference.usage.priority import gate
from inference.usage.quotas import Caller
from inference.usage.recorder import Turn, recorder


@dataclass
class Ticket:
    """Whom a turn counts against and its admission (None: no counted limit).
    ``continuation``: a cut answer going on on another node: its tokens count, the request
    does not count twice."""

    caller: Caller
    admission: Admission | None = None
    continuation: bool = False
    meter: Meter = field(default_factory=Meter)
    ended: bool = False
    gated: bool = False  # holds a slot of the priority gate (``inference.usage.priority``)

    def leave_gate(self) -> None:
        if self.gated:
            self.gated = False
            gate.leave()

    def carried_on(self) -> Ticket:
        """The ticket of the continuation of this (cut) answer: its tokens count in the same
        windows; the lease went back when the cut answer ended."""
        admission = self.admission
        carried = Admission(admission.caller, admission.windows) if admission else None
        return Ticket(self.caller, carried, continuation=True)


async def open_ticket(caller: Caller, policy: Any = None) -> Ticket | None:
    """Admit a turn of ``caller`` (``limits.aadmit``: raises ``OverLimit``, 429), then, with
    the routing ``policy``, take a slot of the priority gate (its ``max_inflight`` and
    ``queue_wait_s``; raises ``ArrayFull``, 429, when refused). None when usage accounting
    is off (``PHALANX_USAGE_ACCOUNTING=0``): nothing counted, limited or queued."""
    if not settings.USAGE_ACCOUNTING:
        return None
    ticket = Ticket(caller, await limits.aadmit(caller))
    if policy is None:
        return ticket
    try:
        ticket.gated = await gate.enter(
            priority=caller.limits.priority,
            capacity=policy.max_inflight,
            wait_s=policy.queue_wait_s,
        )
    except BaseException:
        await release(ticket)
        raise
    return ticket


async def release(ticket: Ticket | None) -> None:
    """A turn that reached no node: its lease back, nothing counted but the refusal."""
    if ticket is not None and not ticket.ended:
        ticket.ended = True
        ticket.leave_gate()
        await _settle(ticket.admission, 0)


async def _settle(admission: Admission | None, tokens: int) -> None:
    if admission is None or admission.settled:
        return
    if limits.settles_on_loop(admission):
        limits.settle(admission, tokens)
    else:
        await db_thread(limits.settle)(admission, tokens)


async def ended(
    ticket: Ticket | None,
    *,
    model: str,
    package: str,
    node_id: str,
    session_id: str | None,
    request_id: str | None,
    failed: bool,
) -> None:
    """Count the turn (once) and settle its limits; ``failed``: the node refused or broke
    the answer."""
    if ticket is None or ticket.ended:
        return
    ticket.ended = True
    ticket.leave_gate()
    figures = ticket.meter.figures()
    recorder.record(
        Turn(
            caller=ticket.caller.key,
            caller_name=ticket.caller.name,
            model=model,
            package=package,
            node_id=node_id,
            session_id=session_id or "",
            request_id=request_id or "",
            requests=0 if ticket.continuation else 1,
            errors=1 if failed or ticket.meter.errored else 0,
            **figures,
        )
    )
    await _settle(ticket.admission, figures["prompt_tokens"] + figures["completion_tokens"])
