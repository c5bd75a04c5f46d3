"""The control loop: probe every node at the policy's interval and keep its state true.

All state lives in the database, so the loop can restart at any time. Each ``tick`` is one
round of probes; tests call it directly. The policy it follows (interval, thresholds,
timeouts) comes from the source the inference app registers (``nodes.health_policy``: the
lower app imports no feature); the control loop's other work (step jobs, periodic work such as
idle-route release) runs on threads of its own (``console.lib.steps``).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import close_old_connections
from django.utils import timezone

from nodes import client as node_client
from nodes import services
from nodes.device_validation import validation_note_probe
from nodes.external import probe_external
from nodes.health_policy import HealthPolicy, health_interval_s, health_policy
from nodes.models import Node, NodeEvent


def canary_due(node: Node, policy: HealthPolicy) -> bool:
    """True when ``node`` is down (it comes back only after a real completion, not on a green
    ``/health`` alone: a node can answer that and fail every request) or has seen neither
    traffic nor a canary for ``policy.canary_idle_s``."""
    if node.state == Node.State.DOWN:
        return True
    if policy.canary_idle_s <= 0 or node.state == Node.State.DRAINING:
        return False
    if node.validation == Node.Validation.VALIDATING:  # benchmarking: a canary would skew both
        return False
    stamps = [t for t in (node.last_active_at, node.last_canary_at) if t is not None]
    since = max(stamps) if stamps else node.created_at
    return (timezone.now() - since).total_seconds() >= policy.canary_idle_s


log = logging.getLogger(__name__)
FIRST_LOAD = "loading its model (not up yet): not counted as a failed probe"


def _note_first_load(node_id: str) -> None:
    """A node that has not been up since it was registered or (re)started (``unknown``) and
    answers 503 "loading" is starting, not failing: its probe is recorded without counting
    towards ``failure_threshold``, so a normal boot never says "went down". A node that was
    ``up`` and then loads again (an agent restarted under it) counts as before."""
    Node.objects.filter(node_id=node_id, state=Node.State.UNKNOWN).update(
        last_probe_at=timezone.now(), last_probe_error=FIRST_LOAD, last_seen_load=None
    )


@dataclass(frozen=True)
class TickReport:
    """What one tick saw: ``{node_id: probe status}`` and the events it caused."""

    statuses: dict[str, str]
    events: list[NodeEvent]


class ControlLoop:
    """Health checks (``/health`` + ``/metrics``, plus a one-token canary completion after
    ``canary_idle_s`` without traffic) for every node, every ``health_interval_s``.

    ``failure_threshold`` consecutive failed probes mark a node down; a down node that answers
    is marked up. A probe times out after ``probe_timeout_s`` (2 s by default), so a hung or
    stopped process counts as failed, not only a refused connection. Probes run in parallel.
    """

    def __init__(self, *, max_workers: int = 16) -> None:
        self.stop_event = threading.Event()
        self.max_workers = max_workers

    def tick(self) -> TickReport:
        """Probe every node once and apply the results; returns what happened."""
        policy = health_policy()
        nodes = list(
            Node.objects.select_related("package").only(
                "node_id",
                "kind",
                "address",
                "state",
                "package",
                "package__name",
                "served_name",
                "validation",
                "last_active_at",
                "last_canary_at",
                "created_at",
            )
        )
        if not nodes:
            return TickReport({}, [])
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(nodes))) as pool:
            results = list(pool.map(lambda n: self.check(n, policy), nodes))
        statuses: dict[str, str] = {}
        events: list[NodeEvent] = []
        for node, (result, canary_ran) in zip(nodes, results, strict=True):
            statuses[node.node_id] = result.status
            if result.status == "loading" and node.state == Node.State.UNKNOWN:
                _note_first_load(node.node_id)
                continue
            try:
                event = services.node_record_probe(
                    node_id=node.node_id,
                    result=result,
                    failure_threshold=policy.failure_threshold,
                    recovery_threshold=policy.recovery_threshold,
                    canary_ran=canary_ran,
                )
            except Node.DoesNotExist:
                continue  # removed while we probed
            if result.ok:
                validation_note_probe(node_id=node.node_id, device=result.device)
            if event is not None:
                log.info("%s: %s (%s)", node.node_id, event.get_kind_display(), event.message)
                events.append(event)
        return TickReport(statuses, events)

    @staticmethod
    def check(node: Node, policy: HealthPolicy) -> tuple[node_client.ProbeResult, bool]:
        """``/health`` + ``/metrics``, then a canary completion when the node is healthy, not
        draining and has been idle for ``canary_idle_s``; returns ``(result, canary_ran)``."""
        probe = probe_external if node.kind == Node.Kind.EXTERNAL else node_client.probe
        result = probe(node.address, node_id=node.node_id, timeout=policy.probe_timeout_s)
        if not result.ok or not canary_due(node, policy):
            return result, False
        canary = node_client.canary(
            node.address,
            node_id=node.node_id,
            model=node.model_name,
            timeout=policy.canary_timeout_s,
        )
        return (result if canary.ok else canary), True

    def run(self) -> None:
        """Tick until ``stop()``; the interval is re-read every tick, so policy edits apply."""
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # keep the loop alive through a bad tick (e.g. database locked)
                log.exception("control loop tick failed")
            finally:
                close_old_connections()
            elapsed = time.monotonic() - started
            self.stop_event.wait(max(0.0, health_interval_s() - elapsed))

    def stop(self) -> None:
        self.stop_event.set()
