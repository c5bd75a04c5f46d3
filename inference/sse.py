"""Reading a node's SSE answer event by event, and judging whether it ended honestly.

An OpenAI stream is a success only when a choice carried a ``finish_reason`` and the stream
ended with ``data: [DONE]``. ``StreamCheck`` follows the events of one answer and raises
``StreamBroken`` the moment that can no longer be true: an event that is not JSON, ``[DONE]``
before any finish reason, or the body ending without ``[DONE]``. An in-band ``{"error": ...}``
event from the node is an honest end too (a failed request, said so), relayed as it is.
Pure: no I/O, so every truncation shape is unit-tested on bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"


class StreamBroken(Exception):
    """The answer cannot end as a success; the message says how it broke (for the client),
    ``detail`` what the node sent (for the log only)."""

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def error_body(message: str, *, code: str = "upstream_error") -> dict[str, Any]:
    """The in-band error event's payload (the node protocol's shape)."""
    return {"error": {"message": message, "type": "upstream_error", "code": code}}


def sse_error_event(message: str, *, code: str = "upstream_error") -> bytes:
    """An in-band SSE error event followed by ``[DONE]``."""
    return f"data: {json.dumps(error_body(message, code=code))}\n\ndata: {DONE}\n\n".encode()


@dataclass
class SSEDecoder:
    """Incremental SSE decoder: feed bytes, get ``(raw, payload)`` for each complete event.

    ``raw`` is the event's bytes with its blank-line terminator (``\\n\\n``), ready to relay;
    ``payload`` the decoded JSON of its ``data:`` lines, or ``DONE``. Events without data
    (comments, keep-alives) are skipped. Raises ``StreamBroken`` for data that is not JSON.
    """

    _buffer: bytes = b""

    def feed(self, chunk: bytes) -> list[tuple[bytes, Any]]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        events: list[tuple[bytes, Any]] = []
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            data = "\n".join(
                line[5:].lstrip()
                for line in raw.decode("utf-8", "replace").split("\n")
                if line.startswith("data:")
            )
            if not data:
                continue
            events.append((raw + b"\n\n", _decode(data)))
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated."""
        return self._buffer


def _decode(data: str) -> Any:
    if data.strip() == DONE:
        return DONE
    try:
        return json.loads(data)
    except (ValueError, RecursionError):  # nested past the parser's depth: not JSON we read
        raise StreamBroken("sent an event that is not JSON", detail=data[:200]) from None


@dataclass
class StreamCheck:
    """Follows one answer's events (``see``) and its end (``end``)."""

    finish_reasons: list[str] = field(default_factory=list)
    errored: bool = False
    error_type: str = ""  # the node's in-band error "type": "server_error", ...
    done: bool = False

    def see(self, payload: Any) -> None:
        """Note one decoded event; raises ``StreamBroken`` for ``[DONE]`` that ends an answer
        without a finish reason or an error, and for events after ``[DONE]``."""
        if self.done:
            raise StreamBroken("sent events after [DONE]")
        if payload == DONE:
            self.done = True
            if not self.finish_reasons and not self.errored:
                raise StreamBroken("ended the stream ([DONE]) without a finish reason")
            return
        if not isinstance(payload, dict):
            raise StreamBroken("sent an event that is not an object", detail=str(payload)[:200])
        if "error" in payload:
            self.errored = True
            error = payload["error"]
            self.error_type = str(error.get("type") or "") if isinstance(error, dict) else ""
            return
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.finish_reasons.append(str(choice["finish_reason"]))

    def end(self, pending: bytes = b"") -> None:
        """The body ended; raises ``StreamBroken`` unless the answer was complete."""
        if self.done and not pending.strip():
            return
        if pending.strip():
            raise StreamBroken("ended the body in the middle of an event")
        if self.errored:
            return  # the node said it failed; only its [DONE] is missing
        if self.finish_reasons:
            raise StreamBroken("ended the body without [DONE]")
        raise StreamBroken("ended the body without a finish reason or [DONE]")


def check_completion(status: int, body: bytes) -> None:
    """A non-streamed 200 must be a JSON ``chat.completion`` with a choice that has a finish
    reason; raises ``StreamBroken`` otherwise (empty, cut short, not JSON)."""
    if status != 200:
        return
    if not body.strip():
        raise StreamBroken("answered 200 with an empty body")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise StreamBroken("answered 200 with a body that is not JSON (cut short?)") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not all(isinstance(c, dict) and c.get("finish_reason") for c in choices):
        raise StreamBroken("answered 200 without a finished choice")
