"""Judging a node's answer (inference/sse.py), shape by shape, on bytes."""

from __future__ import annotations

import json
import re

import pytest

from inference.sse import DONE, SSEDecoder, StreamBroken, StreamCheck, check_completion


def event(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def token(text: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


FINISH = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = event({"choices": [], "usage": {"completion_tokens": 2}})
END = event(DONE)


def judge(body: bytes, split_every: int = 7) -> list:
    """Feed ``body`` in pieces of ``split_every`` bytes; returns the payloads seen."""
    decoder, check, seen = SSEDecoder(), StreamCheck(), []
    for i in range(0, len(body), split_every):
        for raw, payload in decoder.feed(body[i : i + split_every]):
            check.see(payload)
            seen.append((raw, payload))
    check.end(decoder.pending)
    return seen


def test_a_complete_answer_passes_with_its_bytes_intact() -> None:
    body = token("Hel") + token("lo") + FINISH + USAGE + END
    for split in (1, 3, 64):
        seen = judge(body, split)
        assert b"".join(raw for raw, _ in seen) == body
        assert seen[-1][1] == DONE


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (token("Hel") + token("lo"), "without a finish reason or [DONE]"),
        (token("Hel") + FINISH + USAGE, "without [DONE]"),
        (token("Hel") + END, "[DONE]) without a finish reason"),
        (b"", "without a finish reason or [DONE]"),
        (
            token("Hel") + b'data: {"choices": [{"delta": {"content": "oo\n\n' + FINISH + END,
            "not JSON",
        ),
        (token("Hel") + b'data: {"choices": [', "in the middle of an event"),
        (token("Hel") + FINISH + END + token("more"), "after [DONE]"),
        (event("[1, 2]") + FINISH + END, "not an object"),
        (b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n" + FINISH + END, "not JSON"),
    ],
)
def test_every_dishonest_end_is_caught(body: bytes, says: str) -> None:
    with pytest.raises(StreamBroken, match=re.escape(says)):
        judge(body)


def test_a_node_that_says_it_failed_has_ended_honestly() -> None:
    error = event({"error": {"message": "engine failed"}})
    assert judge(token("Hel") + error + END)[-1][1] == DONE
    assert judge(token("Hel") + error)[-1][1]["error"]  # its [DONE] is added by the relay


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "empty body"),
        (b'{"choices": [{"message": {"content": "Hel', "not JSON"),
        (b'{"choices": [{"message": {"content": "Hello"}}]}', "without a finished choice"),
        (b'{"choices": []}', "without a finished choice"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    ],
)
def test_a_non_streamed_200_must_be_a_finished_completion(body: bytes, says: str) -> None:
    with pytest.raises(StreamBroken, match=says):
        check_completion(200, body)
    ok = b'{"choices": [{"message": {"content": "Hello"}, "finish_reason": "stop"}]}'
    check_completion(200, ok)
    check_completion(400, b"")  # not a success: passed on as it is
