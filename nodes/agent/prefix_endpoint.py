"""The node's shared-prefix endpoint (``POST /prefixes``): the control plane sends the agent
openings operators registered (``inference.prefixes``); the node prefills each into a free
sequence, keeps it on its prefix shelf (so a restart loads it before ``/health`` says ready)
and publishes its agent fingerprint, which prefix-aware placement reads."""

from __future__ import annotations

import asyncio
from typing import Any

from inference.agent_prefix import LEADING_ROLES, agent_fingerprint
from inference.chat_request import decode_json, parse_chat_request
from inference.errors import BadRequest
from nodes.agent.asgi_io import BodyTooLarge, Receive, Send, read_body, send_json
from nodes.agent.completions import OPENING_CUT, ChatService, opening_tokens
from nodes.agent.node_state import JSON_LIMIT, NodeState

MAX_PREFIXES = 8  # openings one request may send (a node keeps warm.MAX_SAVED on its shelf)


class PrefixEndpoint(NodeState):
    """``POST /prefixes``: ``{"prefixes": [{"messages": [system...], "tools": [...]}]}`` (at
    most ``MAX_PREFIXES``) answers ``{"prefixes": [{"agent", "tokens", "state"}]}`` in the
    same order; ``state`` is ``held`` (already in a sequence), ``prefilled``, ``busy`` (every
    sequence was busy: send it again) or ``too_long`` (more than a sequence holds). 400 names
    what is wrong with the body; 503 while the model loads."""

    async def _prefixes(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        try:
            items = _openings(decode_json(await read_body(receive, JSON_LIMIT)))
        except BodyTooLarge as exc:
            return await self._error(send, 413, str(exc), code="body_too_large")
        except BadRequest as exc:
            return await self._error(
                send, 400, exc.message, code="invalid_prefixes", param=exc.param
            )
        service, outcomes = self.service, self.outcomes
        if service is None:
            return await self._error(
                send, 503, "the model is still loading", code="loading", retry=True
            )
        held = []
        for index, (messages, tools) in enumerate(items):
            try:
                held.append(await self._hold(service, messages, tools))
            except BadRequest as exc:
                message = f"prefixes[{index}]: {exc.message}"
                return await self._error(
                    send, 400, message, code="invalid_prefixes", param=exc.param
                )
        for item in held:
            if item["state"] in ("held", "prefilled"):
                outcomes.served_agent(item["agent"])
        return await send_json(send, 200, {"prefixes": held}, self.headers)

    async def _hold(self, service: ChatService, messages: list, tools: list | None) -> dict:
        """Render, tokenize and hold one opening (rendering is slow: off the event loop)."""
        body: dict[str, Any] = {
            "model": self.identity.package,
            "messages": [*messages, {"role": "user", "content": OPENING_CUT}],
        }
        if tools:
            body["tools"] = tools
        chat = parse_chat_request(body)
        tokens = await asyncio.to_thread(opening_tokens, service, chat)
        try:
            state = await asyncio.wrap_future(service.engine.hold_prefix(tokens))
        except ValueError:
            state = "too_long"
        return {"agent": agent_fingerprint(messages, tools), "tokens": len(tokens), "state": state}


def _openings(body: Any) -> list[tuple[list, list | None]]:
    """``(messages, tools)`` of each opening in a decoded body. Raises ``BadRequest``."""
    items = body.get("prefixes") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise BadRequest("'prefixes' must be a non-empty list.", param="prefixes")
    if len(items) > MAX_PREFIXES:
        raise BadRequest(f"at most {MAX_PREFIXES} prefixes at a time.", param="prefixes")
    found = []
    for index, item in enumerate(items):
        messages = item.get("messages") if isinstance(item, dict) else None
        if not isinstance(messages, list) or not messages:
            raise BadRequest(
                f"prefixes[{index}].messages must be a non-empty list.", param="messages"
            )
        if any(not isinstance(m, dict) or m.get("role") not in LEADING_ROLES for m in messages):
            raise BadRequest(
                f"prefixes[{index}].messages may hold only system or developer messages.",
                param="messages",
            )
        tools = item.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest(f"prefixes[{index}].tools must be a list.", param="tools")
        found.append((messages, tools or None))
    return found
