"""A small Python client of the array's tool-result cache for agent runtimes (httpx; no
Django, runs anywhere):

    cache = ToolCache("http://127.0.0.1:8000", token)
    result = cache.call("search_web", {"query": q}, search_web)

``call`` looks the call up (``POST /v1/cache/tools/lookup``), returns the cached result on a
hit, else calls ``tool(**arguments)`` and stores what it returned (``POST /v1/cache/tools``).
The cache never stands in the way: a lookup or store the array refuses or cannot answer (the
tool not enabled, the control plane down) just runs the tool. ``last`` says what happened to
the latest call. ``report_false_hit`` tells the array a served result was wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Outcome:
    hit: bool
    reason: str = ""  # why a miss missed
    entry_id: int | None = None
    similarity: float | None = None


class ToolCache:
    """The tool-result cache of the array at ``base_url`` (the control plane), with an API
    token; ``timeout_s`` bounds each cache request."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 2.0) -> None:
        self.http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )
        self.last = Outcome(False, "no call yet")

    def call(self, tool: str, arguments: dict[str, Any], run: Callable[..., Any]) -> Any:
        """The cached result of ``tool`` with ``arguments``, or ``run(**arguments)`` (stored)."""
        found = self.lookup(tool, arguments)
        if self.last.hit:  # a cached None is a hit too
            return found
        result = run(**arguments)
        self.store(tool, arguments, result)
        return result

    def lookup(self, tool: str, arguments: dict[str, Any]) -> Any | None:
        """The cached result, or None on a miss (``last`` says why)."""
        try:
            response = self.http.post(
                "/v1/cache/tools/lookup", json={"tool": tool, "arguments": arguments}
            )
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.last = Outcome(False, f"cache unreachable: {exc}")
            return None
        if response.status_code != 200 or not body.get("hit"):
            reason = body.get("reason") or (body.get("error") or {}).get("message", "")
            self.last = Outcome(False, reason)
            return None
        self.last = Outcome(True, "", body["id"], body["similarity"])
        return body["result"]

    def store(
        self, tool: str, arguments: dict[str, Any], result: Any, ttl_s: float | None = None
    ) -> bool:
        """Store ``result`` (JSON); False when it was not stored: the tool not enabled, the
        result too big or not JSON-serialisable, the array unreachable."""
        body: dict[str, Any] = {"tool": tool, "arguments": arguments, "result": result}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        try:
            return self.http.post("/v1/cache/tools", json=body).status_code == 201
        except (httpx.HTTPError, TypeError, ValueError):  # TypeError: a result JSON cannot hold
            return False

    def report_false_hit(self, entry_id: int, query: str = "", note: str = "") -> bool:
        """Tell the array that entry ``entry_id`` was served wrongly (it is removed)."""
        response = self.http.post(
            "/v1/cache/false-hits", json={"id": entry_id, "query": query, "note": note}
        )
        return response.status_code == 201
