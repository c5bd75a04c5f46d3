"""Cached answers for stateless chat requests: what ``POST /v1/chat/completions`` asks the
semantic cache before routing, and what it gives the cache after a node answered.

A request is looked up when it opts in (``X-Phalanx-Cache: use``, or an API token with
``cache_answers``), does not opt out (``X-Phalanx-Cache: bypass``), is stateless (its messages
hold no assistant or tool message: no session yet, or a session's first turn) and samples at
a ``temperature`` of at most ``MAX_TEMPERATURE`` (absent means the node's default, 0.8). The
namespace is ``answers:<model>``; the partition is a digest of everything but the user's
words that shapes the answer (system and developer messages, tools, response format, limits);
the text compared is the user messages (within the array's encoder's partitions:
``service.the_cache``). The answer is stored when it ended well
(``finish_reason`` ``stop``, ``tool_calls`` or ``length``).

Response headers: ``X-Phalanx-Cache`` ``hit`` (with ``X-Phalanx-Cache-Similarity``,
``X-Phalanx-Cache-Age`` in seconds and ``X-Phalanx-Cache-Id``, the id a false-hit report
names), ``miss``, ``bypass`` or ``skip`` (opted in, but not cacheable:
``X-Phalanx-Cache-Reason`` says why).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from console.lib.bare_http import db_thread
from inference.errors import ProxyError
from inference.semcache import service
from inference.semcache.cache import Hit, Miss
from inference.semcache.store import Entry

HEADER = "X-Phalanx-Cache"
MAX_TEMPERATURE = 0.5
DEFAULT_TEMPERATURE = 0.8  # inference.chat_request's default when a request sets none
# an answer cut at max_tokens is still the answer to that request: max_tokens is in the partition
ENDED_WELL = ("stop", "tool_calls", "length")
# what never changes the answer to the same words (the rest goes into the partition)
NOT_PARTITIONED = ("messages", "stream", "stream_options", "user", "temperature", "seed", "model")


@dataclass
class Asked:
    """The cache's part in one request: ``header`` is what ``HEADER`` answers; ``hit`` the
    entry served; ``miss`` the lookup that missed (its vector stores the answer)."""

    header: str
    reason: str = ""
    namespace: str = ""
    partition: str = ""
    text: str = ""
    hit: Hit | None = None
    miss: Miss | None = None
    started: float = field(default_factory=time.monotonic)

    def headers(self) -> dict[str, str]:
        if not self.header:
            return {}
        out = {HEADER: self.header}
        if self.reason:
            out[HEADER + "-Reason"] = self.reason[:200]
        if self.hit is not None:
            out[HEADER + "-Similarity"] = f"{self.hit.similarity:.4f}"
            out[HEADER + "-Age"] = f"{self.hit.age_s():.1f}"
            out[HEADER + "-Id"] = str(self.hit.entry.id)
        return out


def opted(header_value: str | None, token_opted_in: bool) -> str:
    """``use``, ``bypass`` or ``off`` from the request's ``HEADER`` and its token.
    ``ValueError`` naming the header for any other value."""
    value = (header_value or "").strip().lower()
    if value in ("use", "bypass"):
        return value
    if value:
        raise ValueError(f"{HEADER} must be 'use' or 'bypass', not {value[:40]!r}.")
    return "use" if token_opted_in else "off"


def not_cacheable(body: dict[str, Any]) -> str:
    """Why ``body`` cannot be answered from the cache ("" when it can)."""
    roles = {m.get("role") for m in body.get("messages", []) if isinstance(m, dict)}
    if roles & {"assistant", "tool", "function"}:
        return "not stateless: the conversation has earlier answers"
    temperature = body.get("temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else float(temperature)
    if temperature > MAX_TEMPERATURE:
        return f"temperature {temperature:g} is above {MAX_TEMPERATURE:g}"
    if int(body.get("n") or 1) != 1:
        return "n is not 1"
    return ""


def question(body: dict[str, Any], model: str) -> tuple[str, str, str]:
    """``(namespace, partition, text)`` of a cacheable ``body`` for client-facing ``model``."""
    said, shape_of_messages = [], []
    for message in body["messages"]:
        if message.get("role") == "user":  # where the user spoke stays in the partition
            said.append(_text(message.get("content")))
            shape_of_messages.append({"role": "user", "content": len(said)})
        else:
            shape_of_messages.append(message)
    shape = {k: v for k, v in body.items() if k not in NOT_PARTITIONED}
    shape["messages"] = shape_of_messages
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode())
    return f"{service.ANSWERS}{model}", digest.hexdigest()[:32], "\n".join(said)


def _text(content: Any) -> str:
    """A message's text as the node reads it (``inference.engine.prompt``: parts joined
    with nothing between them)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


async def ask(body: dict[str, Any], model: str, choice: str) -> Asked:
    """What the cache says about this request (``choice`` from ``opted``)."""
    if choice == "off":
        return Asked("")
    if choice == "bypass":
        return Asked("bypass")
    reason = not_cacheable(body)
    if reason:
        return Asked("skip", reason)
    namespace, partition, text = question(body, model)
    return await db_thread(_looked_up)(Asked("miss", "", namespace, partition, text))


def _looked_up(asked: Asked) -> Asked:
    rules = service.rules_for(asked.namespace)
    if rules is None:
        asked.header, asked.reason = "skip", f"{asked.namespace} is turned off"
        return asked
    try:
        cache = service.the_cache()
    except ProxyError as exc:  # no approved embedding package: answer without the cache
        asked.header, asked.reason = "skip", exc.message
        return asked
    found = cache.lookup(asked.namespace, asked.partition, asked.text, rules)
    asked.started = time.monotonic()  # a hit saves what follows: routing and the node's answer
    if isinstance(found, Hit):
        asked.header, asked.hit = "hit", found
    else:
        asked.miss = found
    return asked


async def remember(asked: Asked, completion: dict[str, Any] | None, package: str) -> None:
    """Store a missed request's answer (``completion``: OpenAI's non-streamed shape) when it
    ended well. Never raises: a cache that cannot store must not fail the answer."""
    if asked.miss is None or not completion or not _ended_well(completion):
        return
    seconds = time.monotonic() - asked.started
    try:
        await db_thread(_store)(asked, completion, package, seconds)
    except Exception:  # logged with the request id; the client has its answer
        service.log.exception("could not store an answer in the semantic cache")


def _store(asked: Asked, completion: dict[str, Any], package: str, seconds: float) -> None:
    rules = service.rules_for(asked.namespace)
    if rules is None:
        return
    usage = completion.get("usage") or {}
    entry = Entry(
        asked.namespace, asked.partition, "", asked.text, json.dumps(completion), 0.0, 0.0,
        package=package, tokens=int(usage.get("total_tokens") or 0), seconds=round(seconds, 4),
    )  # fmt: skip
    service.the_cache().put(entry, rules, asked.miss.vector, asked.miss.encoder)


def _ended_well(completion: dict[str, Any]) -> bool:
    choices = completion.get("choices") or []
    return len(choices) == 1 and choices[0].get("finish_reason") in ENDED_WELL


def served_completion(hit: Hit) -> dict[str, Any]:
    """The cached completion as a new answer (its own id and time)."""
    completion = json.loads(hit.entry.value)
    completion.pop("timings", None)  # the node's timings of the original answer, not this one
    completion["id"] = f"chatcmpl-cache-{uuid.uuid4().hex[:24]}"
    completion["created"] = int(time.time())
    return completion


async def replayed(events: list[bytes]) -> AsyncIterator[bytes]:
    """``events`` as the async stream an ASGI response sends."""
    for event in events:
        yield event


def served_events(hit: Hit, include_usage: bool) -> list[bytes]:
    """The cached completion as SSE: one chunk with the whole message, one with the finish
    reason, the usage chunk when asked for, then ``[DONE]``."""
    completion = served_completion(hit)
    choice = completion["choices"][0]
    message = dict(choice.get("message") or {})
    for position, call in enumerate(message.get("tool_calls") or []):
        call.setdefault("index", position)
    head = {k: completion[k] for k in ("id", "created", "model") if k in completion}
    head["object"] = "chat.completion.chunk"
    if "system_fingerprint" in completion:
        head["system_fingerprint"] = completion["system_fingerprint"]
    chunks = [
        {**head, "choices": [{"index": 0, "delta": message, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if include_usage and completion.get("usage"):
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


class Collector:
    """Builds the non-streamed completion from a stream's decoded events (``feed`` each):
    content concatenated, tool calls merged by index, the finish reason and the usage."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.broken = False

    def feed(self, payload: Any) -> None:
        if not isinstance(payload, dict) or "error" in payload:
            self.broken = self.broken or isinstance(payload, dict)
            return
        for key in ("id", "created", "model", "system_fingerprint"):
            if key in payload:
                self.head.setdefault(key, payload[key])
        self.usage = payload.get("usage") or self.usage
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                self._merge(call)
            self.finish = choice.get("finish_reason") or self.finish

    def _merge(self, call: dict[str, Any]) -> None:
        held = self.calls.setdefault(int(call.get("index", 0)), {"function": {}})
        for key in ("id", "type"):
            if call.get(key):
                held[key] = call[key]
        function = call.get("function") or {}
        if function.get("name"):
            held["function"]["name"] = function["name"]
        if "arguments" in function:
            held["function"]["arguments"] = held["function"].get("arguments", "") + (
                function["arguments"] or ""
            )

    def completion(self) -> dict[str, Any] | None:
        """The answer as OpenAI's non-streamed completion, None when it did not end well."""
        if self.broken or self.finish not in ENDED_WELL:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        completion = {**self.head, "object": "chat.completion"}
        completion["choices"] = [{"index": 0, "message": message, "finish_reason": self.finish}]
        if self.usage:
            completion["usage"] = self.usage
        return completion


async def teed(events: AsyncIterator[tuple[bytes, Any]], asked: Asked, package: str):
    """Relay ``events`` (``(raw, payload)`` of a node's stream) as bytes and, when the stream
    ended well, store the answer it built."""
    collector = Collector()
    async for raw, payload in events:
        collector.feed(payload)
        yield raw
    await remember(asked, collector.completion(), package)
