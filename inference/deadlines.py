"""How long a node may take to send a streamed answer's first byte (pure).

A node that accepts a request and never answers should be left within seconds, but a long
prompt on a slow node legitimately takes a while to prefill before its first token. The
deadline is derived from what the request needs: the prompt tokens the node must prefill (its
whole text, or for a session that stays on its node only what follows the last assistant
message: the rest is in the node's KV cache), estimated at ``CHARS_PER_TOKEN`` characters a
token, at the node's measured prefill speed (``phalanx_node_prefill_speed_tokens_per_second``),
times a margin, and never below a floor. The inter-byte timeout (``request_timeout_s``) applies
after the first byte and to non-streamed answers, whose first byte is their last.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 2.0  # conservative: English runs ~4 a token, numbers and JSON ~2.3 (SmolLM2)
UNMEASURED_PREFILL_SPEED = 50.0  # tokens/s assumed for a node that has not prefilled yet


@dataclass(frozen=True)
class FirstByteDeadline:
    """``seconds`` to wait, and ``why`` in words (for the decision log when it fires)."""

    seconds: float
    why: str


def uncached_prompt_chars(messages: Sequence[Any], *, cached_on_node: bool) -> int:
    """Characters of the messages the node must prefill: all of them, or with
    ``cached_on_node`` (the session stays on its node) those after the last assistant one."""
    start = 0
    if cached_on_node:
        for i, message in enumerate(messages):
            if isinstance(message, dict) and message.get("role") == "assistant":
                start = i + 1
    return sum(_chars(m) for m in messages[start:])


def _chars(message: Any) -> int:
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, list):
        size = sum(len(str(p.get("text") or "")) for p in content if isinstance(p, dict))
    else:
        size = len(content) if isinstance(content, str) else 0
    calls = message.get("tool_calls")
    return size + (len(json.dumps(calls)) if calls else 0)


def first_byte_deadline(
    *,
    uncached_chars: int,
    prefill_speed: float | None,
    floor_s: float,
    margin: float,
    cap_s: float,
) -> FirstByteDeadline:
    """``max(floor_s, margin * tokens / speed)``, at most ``cap_s`` (the inter-byte timeout).

    ``tokens`` = ``uncached_chars / CHARS_PER_TOKEN``; ``speed`` the node's measured prefill
    speed in tokens/s, or ``UNMEASURED_PREFILL_SPEED`` when None or 0.
    """
    tokens = uncached_chars / CHARS_PER_TOKEN
    speed = prefill_speed or UNMEASURED_PREFILL_SPEED
    estimate = tokens / speed
    seconds = min(cap_s, max(floor_s, margin * estimate))
    measured = "measured" if prefill_speed else "assumed"
    why = (
        f"no first byte within {seconds:.1f} s (about {tokens:,.0f} uncached prompt tokens at "
        f"{speed:,.0f} tokens/s {measured}, x{margin:g}, floor {floor_s:g} s)"
    )
    return FirstByteDeadline(seconds, why)
