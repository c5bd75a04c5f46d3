"""What the node's chat requests came to, for its metrics: failures, tool calls that did not
parse, the time to first token of the recent ones, and the agents it served last (their
prefixes are in its KV: ``inference.agent_prefix``). A rolling upgrade compares these
between the old and the new package version while it bakes (inference/upgrades)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from inference.agent_prefix import RecentAgents

TTFT_WINDOW = 256  # the P95 is over the last this many requests


class Outcomes:
    """Counters and a TTFT window; safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failed_total = 0
        self.tool_parse_failures_total = 0
        self._ttft_ms: deque[float] = deque(maxlen=TTFT_WINDOW)
        self._agents = RecentAgents()

    def served_agent(self, fingerprint: str | None) -> None:
        """A request of the agent ``fingerprint`` (``agent_fingerprint``) was taken."""
        with self._lock:
            self._agents.note(fingerprint)

    def record(
        self, *, failed: bool = False, ttft_ms: float | None = None, tool_broken: bool = False
    ) -> None:
        with self._lock:
            self.failed_total += int(failed)
            self.tool_parse_failures_total += int(tool_broken)
            if ttft_ms is not None:
                self._ttft_ms.append(float(ttft_ms))

    def snapshot(self) -> dict[str, Any]:
        """``failed_total``, ``tool_parse_failures_total``, ``ttft_p95_seconds`` (None before
        the first request) and ``ttft_samples``."""
        with self._lock:
            window = sorted(self._ttft_ms)
            return {
                "failed_total": self.failed_total,
                "tool_parse_failures_total": self.tool_parse_failures_total,
                "ttft_p95_seconds": percentile(window, 0.95) / 1000 if window else None,
                "ttft_samples": len(window),
                "agents": self._agents.published(),
            }


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted ``ordered`` by the nearest-rank method."""
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]
