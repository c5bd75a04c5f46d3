"""What one node answer used, read from what the node sent (pure, no Django).

A Phalanx node ends every answer with ``usage`` (prompt, cached and completion tokens) and
``timings``, whose ``prefill_node_ms`` and ``decode_node_ms`` are the turn's share of the
node's engine steps (each step's wall time split by the tokens each sequence put into it:
``inference.engine.decode_step``), so the node-seconds of concurrent turns add up to the time
the engine was busy. An external server's ``timings`` (llama-server: ``prompt_ms``,
``predicted_ms``) are taken as its node time; one that sends no usage is counted by its
content deltas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Meter:
    """Fed every payload of one answer (``see``) or its whole body (``see_body``)."""

    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    deltas: int = 0
    tool_calls: int = 0
    errored: bool = False

    def see(self, payload: Any) -> None:
        """One decoded SSE payload (a chunk dict, ``[DONE]``, or anything else)."""
        if not isinstance(payload, dict):
            return
        if "error" in payload:
            self.errored = True
        self._note(payload)
        for choice in payload.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if delta.get("content"):
                self.deltas += 1
            for piece in delta.get("tool_calls") or ():
                if isinstance(piece, dict) and piece.get("id"):
                    self.tool_calls += 1

    def see_body(self, body: bytes) -> None:
        """A whole (non-streamed) completion's JSON body."""
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):
            return
        if not isinstance(payload, dict):
            return
        self._note(payload)
        for choice in payload.get("choices") or ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                self.tool_calls += len(message.get("tool_calls") or ())

    def _note(self, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        if isinstance(payload.get("timings"), dict):
            self.timings = payload["timings"]

    def figures(self) -> dict[str, Any]:
        """``{prompt_tokens, cached_tokens, completion_tokens, tool_calls, prefill_s,
        decode_s}`` (tokens whole numbers, node time in seconds)."""
        usage, timings = self.usage, self.timings
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None:
            cached = timings.get("cached_tokens") or timings.get("cache_n")
        completion = usage.get("completion_tokens")
        return {
            "prompt_tokens": _whole(usage.get("prompt_tokens")),
            "cached_tokens": _whole(cached),
            "completion_tokens": _whole(completion) if completion is not None else self.deltas,
            "tool_calls": self.tool_calls,
            "prefill_s": _seconds(timings, "prefill_node_ms", "prompt_ms"),
            "decode_s": _seconds(timings, "decode_node_ms", "predicted_ms"),
        }


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))


def _seconds(timings: dict[str, Any], own: str, external: str) -> float:
    for name in (own, external):
        value = timings.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return float(value) / 1000
    return 0.0
