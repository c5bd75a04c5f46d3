"""Request migration's pure parts (inference/migration.py): what the continuation asks for and
how its chunks join the cut answer. The streams themselves are tested against fake nodes
(test_stream_integrity.py) and real ones (test_faults.py)."""

from __future__ import annotations

import json

from inference.migration import Relayed, continuation_body, from_continuation

TURN = {
    "model": "m",
    "stream": True,
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "Weather in Oslo?"}],
}
MOVED = {"from": "node-01", "to": "node-02"}


def relayed(*deltas: dict, finish: str | None = None) -> Relayed:
    seen = Relayed()
    for delta in deltas:
        seen.see({"id": "chatcmpl-1", "created": 7, "choices": [{"delta": delta}]})
    if finish:
        seen.see({"id": "chatcmpl-1", "choices": [{"delta": {}, "finish_reason": finish}]})
    return seen


def test_text_relayed_is_the_start_of_the_continued_answer() -> None:
    body = continuation_body(TURN, relayed({"content": "It is"}, {"content": " sunny"}))
    assert body is not None and body["continue_final_message"] is True
    assert body["messages"] == [*TURN["messages"], {"role": "assistant", "content": "It is sunny"}]
    assert body["max_tokens"] == 8  # two tokens already written


def test_nothing_relayed_sends_the_turn_again_so_a_held_tool_call_restarts() -> None:
    # a node holds a tool call back until it is whole: cut mid-call, the client saw nothing
    turn = {**TURN, "tools": [{"type": "function", "function": {"name": "weather"}}]}
    body = continuation_body(turn, relayed({"role": "assistant", "content": ""}))
    assert body == turn


def test_a_relayed_call_or_finish_is_never_continued() -> None:
    call = {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "weather"}}]}
    assert continuation_body(TURN, relayed(call)) is None
    assert continuation_body(TURN, relayed({"content": "Hi"}, finish="stop")) is None


def test_text_under_a_json_format_is_not_continued_as_free_text() -> None:
    turn = {**TURN, "response_format": {"type": "json_object"}}
    assert continuation_body(turn, relayed({"content": '{"a": '})) is None
    assert continuation_body(turn, relayed()) == turn  # nothing relayed: the turn again


def test_a_client_continuing_its_own_message_gets_it_continued_further() -> None:
    turn = {
        **TURN,
        "continue_final_message": True,
        "messages": [*TURN["messages"], {"role": "assistant", "content": "It is"}],
    }
    body = continuation_body(turn, relayed({"content": " sunny"}))
    assert body is not None
    assert body["messages"][-1] == {"role": "assistant", "content": "It is sunny"}
    assert len(body["messages"]) == 2


def test_continuation_chunks_join_the_cut_answer() -> None:
    seen = relayed({"content": "It is"})
    raw, token = from_continuation(
        b"x",
        {"id": "other", "created": 9, "choices": [{"delta": {"content": " sunny"}}]},
        seen,
        MOVED,
    )
    assert token["id"] == "chatcmpl-1" and token["created"] == 7 and "migrated" not in token
    assert json.loads(raw.decode().removeprefix("data: ")) == token
    usage = {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}
    _, last = from_continuation(b"x", {"id": "other", "choices": [], "usage": usage}, seen, MOVED)
    assert last["migrated"] == MOVED
    assert last["usage"] == {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}
    assert from_continuation(b"data: [DONE]\n\n", "[DONE]", seen, MOVED)[1] == "[DONE]"


def test_an_answer_cut_after_its_last_allowed_token_ends_there() -> None:
    from inference.migration import _at_limit, _ended_at_limit

    seen = relayed({"content": "a"}, {"content": "b"})
    assert _at_limit({**TURN, "max_tokens": 2}, seen)
    assert not _at_limit({**TURN, "max_tokens": 3}, seen) and not _at_limit(
        TURN | {"max_tokens": None}, seen
    )
    (_, finish), (_, done) = _ended_at_limit(seen)
    assert finish["id"] == "chatcmpl-1" and finish["choices"][0]["finish_reason"] == "length"
    assert done == "[DONE]"
