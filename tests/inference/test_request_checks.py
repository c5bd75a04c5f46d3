"""What the proxy checks before routing (pure): session keys, websocket turns, JSON bodies."""

from __future__ import annotations

import pytest

from inference.errors import BadRequest
from inference.request_checks import (
    MAX_SESSION_ID,
    check_chat_body,
    check_session_id,
    parse_json_object,
    parse_ws_message,
    session_key,
)


class Headers(dict):
    """Case-insensitive, as Django's ``request.headers``."""

    def get(self, name, default=None):
        for key, value in self.items():
            if key.lower() == name.lower():
                return value
        return default


def refusal(fn, *args, **kwargs) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        fn(*args, **kwargs)
    return caught.value


def test_the_policy_header_wins_over_the_aliases() -> None:
    headers = Headers({"x-session-id": "alias", "X-Agent": "mine"})
    assert session_key(headers, header="X-Agent") == "mine"
    assert session_key(Headers({"x-session-id": "alias"}), header="X-Agent") == "alias"


@pytest.mark.parametrize(
    "alias", ["X-Session-Id", "X-Session-Affinity", "X-Dynamo-Session-ID", "X-SMG-Routing-Key"]
)
def test_each_common_alias_names_the_session(alias) -> None:
    assert session_key(Headers({alias: "  s-1 "}), header="X-Agent") == "s-1"


def test_no_or_blank_header_is_no_session() -> None:
    assert session_key(Headers({}), header="X-Session-Id") is None
    assert session_key(Headers({"X-Session-Id": "   "}), header="X-Session-Id") is None
    headers = Headers({"X-Agent": " ", "X-Session-Id": "next"})
    assert session_key(headers, header="X-Agent") == "next"


def said(error: BadRequest) -> tuple[str, str | None, str]:
    return error.message, error.param, error.code


PRINTABLE = "must be printable ASCII (no control or non-ASCII characters)."


def test_a_bad_header_is_refused_naming_the_header() -> None:
    error = refusal(session_key, Headers({"X-Agent": "a\x01b"}), header="X-Agent")
    assert said(error) == (f"Session key in X-Agent {PRINTABLE}", None, "invalid_session_id")


def test_session_ids_are_1_to_200_printable_ascii_characters() -> None:
    assert check_session_id("a") == "a"
    assert check_session_id("a b~!") == "a b~!"
    longest = "x" * MAX_SESSION_ID
    assert check_session_id(longest) == longest
    error = refusal(check_session_id, longest + "x", where="X-Session-Id")
    assert said(error) == (
        "Session key in X-Session-Id is longer than 200 characters.",
        None,
        "invalid_session_id",
    )
    for bad in ["", " ", " a", "a ", "a\tb", "caf\u00e9", "a\x7fb", "a\nb"]:
        error = refusal(check_session_id, bad)
        assert said(error) == (
            f"Session key in the session id {PRINTABLE}",
            None,
            "invalid_session_id",
        ), bad


def test_a_user_turn_with_options_and_tools() -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    turn = parse_ws_message(
        {
            "type": "user",
            "content": "hi",
            "model": "m",
            "max_tokens": 5,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 3,
            "stop": ["x"],
            "tools": [tool],
            "tool_choice": "auto",
            "ignored": 1,
        }
    )
    assert turn.message == {"role": "user", "content": "hi"} and turn.model == "m"
    assert turn.options == {
        "max_tokens": 5,
        "temperature": 0,
        "top_p": 0.5,
        "seed": 3,
        "stop": ["x"],
    }
    assert turn.tools == {"tools": [tool], "tool_choice": "auto"}


def test_a_bare_message_is_a_user_turn_without_options() -> None:
    turn = parse_ws_message({"message": "hello", "seed": None})
    assert turn.message == {"role": "user", "content": "hello"}
    assert (turn.model, turn.options, turn.tools) == (None, {}, {})
    assert parse_ws_message({"content": "c", "message": "m"}).message["content"] == "c"


def test_a_tool_result_answers_a_call() -> None:
    turn = parse_ws_message({"type": "tool", "tool_call_id": "call_1", "content": ""})
    assert turn.message == {"role": "tool", "content": "", "tool_call_id": "call_1"}
    for bad in [{}, {"tool_call_id": ""}, {"tool_call_id": 7}]:
        error = refusal(parse_ws_message, {"type": "tool", "content": "r", **bad})
        assert said(error) == (
            "tool_call_id must name the tool call this result answers.",
            "tool_call_id",
            "invalid_type",
        )


UNKNOWN_TYPE = (
    'Unknown message type \'system\'; send {"type": "user", "content": "..."} or '
    '{"type": "tool", "tool_call_id": "...", "content": "..."}.'
)


@pytest.mark.parametrize(
    "data, message, param, code",
    [
        ({"type": "system", "content": "x"}, UNKNOWN_TYPE, "type", "invalid_type"),
        ({"type": "user"}, "content must be a string.", "content", "invalid_type"),
        ({"content": 5}, "content must be a string.", "content", "invalid_type"),
        ({"content": "  "}, "content must not be empty.", "content", "empty_content"),
        (
            {"content": "x", "model": ""},
            "model must be a non-empty string.",
            "model",
            "invalid_type",
        ),
        (
            {"content": "x", "model": 3},
            "model must be a non-empty string.",
            "model",
            "invalid_type",
        ),
    ],
)
def test_a_bad_turn_names_its_field(data, message, param, code) -> None:
    assert said(refusal(parse_ws_message, data)) == (message, param, code)


def test_a_turn_must_be_an_object() -> None:
    error = refusal(parse_ws_message, ["hi"])
    assert said(error) == ("Message must be a JSON object.", None, "invalid_json")


def test_a_body_must_be_a_json_object() -> None:
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    error = refusal(parse_json_object, b"[1]")
    assert said(error) == ("Request body must be a JSON object.", None, "invalid_json")


def test_a_chat_body_passes_through_unchanged_or_is_refused() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra": 1}
    assert check_chat_body(body) is body
    assert refusal(check_chat_body, {"model": "m", "messages": []}).param == "messages"
