"""Which agent a chat request belongs to: the fingerprint of what every session of one agent
opens with (its leading system messages and its tool schemas), the same on the control plane
and on the node. A node publishes the fingerprints of the agents whose prefix KV it holds
(``phalanx_node_agent_prefix``), and routing places a new session of that agent there unless
the node is loaded (``inference.routing``: prefix-aware placement). No Django here.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

LEADING_ROLES = ("system", "developer")
MAX_PUBLISHED = 32  # fingerprints a node publishes (the most recently served)


def agent_fingerprint(messages: Any, tools: Any = None) -> str | None:
    """16 hex digits naming the request's leading system/developer messages and its tools
    (canonical JSON, SHA-256), or None when it has neither (nothing an agent shares)."""
    lead = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict) or message.get("role") not in LEADING_ROLES:
            break
        lead.append([message.get("role"), message.get("content")])
    if not lead and not tools:
        return None
    text = json.dumps([lead, tools or []], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RecentAgents:
    """The fingerprints of the agents a node served last, newest last, at most ``limit``:
    their prefix is in its KV (a sequence, host RAM or the shelf) while they keep coming."""

    def __init__(self, limit: int = MAX_PUBLISHED) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, None] = OrderedDict()

    def note(self, fingerprint: str | None) -> None:
        if not fingerprint:
            return
        self._seen[fingerprint] = None
        self._seen.move_to_end(fingerprint)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def published(self) -> list[str]:
        return list(self._seen)
