"""The control loop: probe every node at the policy's interval and keep its state true.

All state lives in the database, so the loop can restart at any time. Each ``tick`` is one
round of probes; tests call it directly.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import close_old_connections

from inference.models import RoutingPolicy
from nodes import client as node_client
from nodes import services
from nodes.models import Node, NodeEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TickReport:
    """What one tick saw: ``{node_id: probe status}`` and the events it caused."""

    statuses: dict[str, str]
    events: list[NodeEvent]


class ControlLoop:
    """Health checks (``/health`` + ``/metrics``) for every node, every ``health_interval_s``.

    ``failure_threshold`` consecutive failed probes mark a node down; a down node that answers
    is marked up. A probe times out after ``probe_timeout_s`` (2 s by default), so a hung or
    stopped process counts as failed, not only a refused connection. Probes run in parallel.
    """

    def __init__(self, *, max_workers: int = 16) -> None:
        self.stop_event = threading.Event()
        self.max_workers = max_workers

    def tick(self) -> TickReport:
        """Probe every node once and apply the results; returns what happened."""
        policy = RoutingPolicy.load()
        nodes = list(Node.objects.values_list("node_id", "address"))
        if not nodes:
            return TickReport({}, [])
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(nodes))) as pool:
            results = list(
                pool.map(lambda n: node_client.probe(n[1], timeout=policy.probe_timeout_s), nodes)
            )
        statuses: dict[str, str] = {}
        events: list[NodeEvent] = []
        for (node_id, _), result in zip(nodes, results, strict=True):
            statuses[node_id] = result.status
            try:
                event = services.node_record_probe(
                    node_id=node_id, result=result, failure_threshold=policy.failure_threshold
                )
            except Node.DoesNotExist:
                continue  # removed while we probed
            if event is not None:
                log.info("%s: %s (%s)", node_id, event.get_kind_display(), event.message)
                events.append(event)
        return TickReport(statuses, events)

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
            interval = RoutingPolicy.load().health_interval_s
            self.stop_event.wait(max(0.0, interval - (time.monotonic() - started)))

    def stop(self) -> None:
        self.stop_event.set()
