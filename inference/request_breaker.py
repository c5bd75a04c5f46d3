"""When a node's failed requests are the node's fault, and when they are the request's.

A node that answers one request with a 5xx may be sick, or the request may be a "query of
death" that would fail anywhere. The proxy returns such an answer to its client without
retrying it elsewhere, and counts it against the node only through this breaker: the node trips
when, within ``window_s``, at least ``min_distinct`` different requests (by body fingerprint)
failed on it, failures are at least ``min_failure_share`` of what it answered, and none of those
requests also failed on another node (a body that fails everywhere is the request's fault). One
bad body resent a thousand times is one fingerprint, so it can never trip a node.

Pure state over plain data; the proxy keeps one instance per process (``request_breaker``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any


def request_fingerprint(payload: dict[str, Any]) -> str:
    """A stable digest of a request body (keys sorted; ``model`` left out, since the proxy
    rewrites it per node): equal bodies give equal fingerprints."""
    body = {k: v for k, v in payload.items() if k != "model"}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]


@dataclass(frozen=True)
class Trip:
    """The evidence for taking a node out: distinct failed requests and answers in the window."""

    node_id: str
    distinct_failures: int
    successes: int
    window_s: float
    last_error: str

    def describe(self) -> str:
        return (
            f"{self.distinct_failures} different requests failed on it in the last "
            f"{self.window_s:g} s while {self.successes} succeeded; last: {self.last_error}"
        )


@dataclass
class _NodeRecord:
    failures: deque[tuple[float, str, str]] = field(default_factory=deque)  # t, print, error
    successes: deque[float] = field(default_factory=deque)


@dataclass
class RequestBreaker:
    """Per-node record of recent request outcomes; ``failure`` says when a node trips.

    Times are ``time.monotonic()`` seconds; every method takes ``now`` for tests.
    """

    window_s: float = 60.0
    min_distinct: int = 3
    min_failure_share: float = 0.5
    nodes: dict[str, _NodeRecord] = field(default_factory=dict)
    failed_on: dict[str, set[str]] = field(default_factory=dict)  # fingerprint -> node ids

    def nodes_failed(self, fingerprint: str, *, now: float | None = None) -> set[str]:
        """The nodes this body failed on within the window."""
        if fingerprint not in self.failed_on:
            return set()
        horizon = (time.monotonic() if now is None else now) - self.window_s
        nodes = {
            node_id
            for node_id, record in self.nodes.items()
            if any(p == fingerprint and t >= horizon for t, p, _ in record.failures)
        }
        if not nodes:
            self.failed_on.pop(fingerprint, None)
        return nodes

    def clear(self) -> None:
        """Forget every outcome (tests; a control-plane restart does the same)."""
        self.nodes.clear()
        self.failed_on.clear()

    def success(self, node_id: str, *, now: float | None = None) -> None:
        """A request the node answered without a 5xx."""
        record = self.nodes.setdefault(node_id, _NodeRecord())
        record.successes.append(time.monotonic() if now is None else now)
        self._expire(record, now)

    def failure(
        self, node_id: str, fingerprint: str, error: str, *, now: float | None = None
    ) -> Trip | None:
        """A request the node answered with a 5xx; returns a ``Trip`` when the node should be
        taken out (its record then starts afresh), else None."""
        now = time.monotonic() if now is None else now
        record = self.nodes.setdefault(node_id, _NodeRecord())
        record.failures.append((now, fingerprint, error))
        self.failed_on.setdefault(fingerprint, set()).add(node_id)
        self._expire(record, now)
        own = {p for _, p, _ in record.failures if self.failed_on.get(p) == {node_id}}
        answered = len(record.failures) + len(record.successes)
        if len(own) < self.min_distinct or len(record.failures) < self.min_failure_share * answered:
            return None
        trip = Trip(node_id, len(own), len(record.successes), self.window_s, error)
        self.nodes[node_id] = _NodeRecord()
        for _, fingerprint, _ in record.failures:
            self._forget(fingerprint)
        return trip

    def _expire(self, record: _NodeRecord, now: float | None) -> None:
        horizon = (time.monotonic() if now is None else now) - self.window_s
        while record.successes and record.successes[0] < horizon:
            record.successes.popleft()
        while record.failures and record.failures[0][0] < horizon:
            _, fingerprint, _ = record.failures.popleft()
            self._forget(fingerprint)

    def _forget(self, fingerprint: str) -> None:
        still = {
            n for n, r in self.nodes.items() if any(p == fingerprint for _, p, _ in r.failures)
        }
        if still:
            self.failed_on[fingerprint] = still
        else:
            self.failed_on.pop(fingerprint, None)


request_breaker = RequestBreaker()
