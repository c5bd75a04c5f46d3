"""The one request validation the proxy and the node share (inference/chat_request.py)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.chat_request import decode_json, parse_chat_request
from inference.chat_schema import ChatMessage, schema_problem
from inference.errors import BadRequest

POISON = {
    "model": "m",
    "max_tokens": 16,
    "messages": [
        {"role": "user", "content": "Echo hello."},
        {"role": "assistant", "content": None, "tool_calls": "{"},
        {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
        {"role": "user", "content": "Now say goodbye."},
    ],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}


def refused(body) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        parse_chat_request(body)
    return info.value


GOOD = copy.deepcopy(POISON)
GOOD["messages"][1]["tool_calls"] = [
    {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
]


def with_message(index: int, **fields) -> dict:
    body = copy.deepcopy(GOOD)
    body["messages"][index] = {**body["messages"][index], **fields}
    return body


@pytest.mark.parametrize(
    ("body", "field", "phrase"),
    [
        (POISON, "messages[1].tool_calls", "must be a list"),
        (with_message(1, tool_calls="{"), "messages[1].tool_calls", "must be a list"),
        (with_message(1, tool_calls=["{"]), "messages[1].tool_calls[0]", "must be an object"),
        (
            with_message(
                1, tool_calls=[{"id": "c", "type": "function", "function": {"arguments": "{}"}}]
            ),
            "messages[1].tool_calls[0].function.name",
            "is required",
        ),
        (with_message(0, role="wizard"), "messages[0].role", "must be one of"),
        (with_message(0, content=5), "messages[0].content", "must be a string or a list"),
        (
            with_message(0, content=[{"type": "text"}]),
            "messages[0].content[0].text",
            "is required",
        ),
        (with_message(2, tool_call_id=None), "messages[2].tool_call_id", "must be a string"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "is required"),
        ({**GOOD, "messages": "hi"}, "messages", "must be a list"),
        ({**GOOD, "stream": "yes"}, "stream", "must be a boolean"),
        ({**GOOD, "max_tokens": "ten"}, "max_tokens", "must be an integer"),
        ({**GOOD, "tools": [{"type": "function"}]}, "tools[0].function", "is required"),
    ],
)
def test_it_names_the_field_of_every_shape_openai_refuses(body, field, phrase) -> None:
    assert parse_chat_request(GOOD).messages == GOOD["messages"]
    error = refused(body)
    assert error.status == 400
    assert error.param == field
    assert error.message.startswith(f"{field} {phrase}")


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ann"}],
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "4C"}]},
            {"role": "function", "name": "get_weather", "content": "4C"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
        ],
        # a response's message sent back as is: optional fields null
        [
            {"role": "user", "content": "Hi", "name": None},
            {"role": "assistant", "content": "Hello", "tool_calls": None, "refusal": None},
            {"role": "user", "content": "Bye"},
        ],
    ],
)
def test_it_accepts_what_the_openai_api_accepts(messages) -> None:
    chat = parse_chat_request(
        {
            "model": "m",
            "messages": messages,
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "stream": True,
            "stream_options": {"include_usage": True},
            "stop": ["\n\n"],
            "top_k": 20,  # llama.cpp's own field passes
        }
    )
    assert chat.stream and chat.top_k == 20 and chat.tool_mode.choice == "get_weather"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.from_type(ChatMessage), min_size=1, max_size=4))
def test_it_accepts_every_message_shape_the_sdk_types_allow(messages) -> None:
    assert schema_problem({"model": "m", "messages": messages}) is None


def test_it_refuses_what_a_node_cannot_serve_with_a_reason() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    error = refused({"model": "m", "messages": [{"role": "user", "content": [image]}]})
    assert error.code == "unsupported_content" and error.param == "messages[0].content[0]"
    assert refused({"model": "m", "messages": []}).code == "empty_messages"
    assert refused({"model": "m", "messages": POISON["messages"][:1], "n": 3}).param == "n"
    custom = {"type": "custom", "custom": {"name": "grep"}}
    error = refused({"model": "m", "messages": POISON["messages"][:1], "tools": [custom]})
    assert error.param == "tools[0].type"


@pytest.mark.parametrize(
    ("message", "field"),
    [
        # a union's tag ("function", "user") that is also a key of the object
        (
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            "messages[0].tool_calls[0].id",
        ),
        ({"role": "user", "content": 5, "user": {"content": "x"}}, "messages[0].content"),
    ],
)
def test_it_names_the_right_field_when_a_tag_is_also_a_key(message, field) -> None:
    assert refused({"model": "m", "messages": [message]}).param == field


def test_it_names_a_bad_tool_choice_function_name() -> None:
    body = {
        **GOOD,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": 5}},
    }
    assert refused(body).param == "tool_choice.function.name"
    body = {**GOOD, "tools": [{"type": "function", "function": {"name": "a b"}}]}
    assert refused(body).param == "tools[0].function.name"  # OpenAI's name rule
    assert refused({**GOOD, "tool_choice": "required"}).param == "tool_choice"  # no tools


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"model": "m", "x": NaN}', "NaN is not a JSON number"),
        (b'{"model": "m", "x": -Infinity}', "-Infinity is not a JSON number"),
        (b"[" * 5000 + b"]" * 5000, "nests too deeply"),
        (b'{"model": "\\ud800"}', "surrogate"),
        (b"\xff", "not UTF-8"),
    ],
)
def test_it_decodes_only_json_a_node_can_be_sent(raw, says) -> None:
    with pytest.raises(BadRequest, match=says):
        decode_json(raw)


CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CUT = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "It is"}]


def test_continue_final_message_continues_an_assistants_text() -> None:
    chat = parse_chat_request({"model": "m", "messages": CUT, "continue_final_message": True})
    assert chat.continue_final
    assert not parse_chat_request({"model": "m", "messages": CUT}).continue_final


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"continue_final_message": "yes"}, "must be a boolean"),
        ({"messages": CUT[:1]}, "assistant message with text"),
        ({"messages": [*CUT[:1], {"role": "assistant", "tool_calls": [CALL]}]}, "no tool calls"),
        ({"response_format": {"type": "json_object"}}, "grammar"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "grammar"),
    ],
)
def test_continue_final_message_refuses_what_cannot_be_continued(change, names) -> None:
    body = {"model": "m", "messages": CUT, "continue_final_message": True, **change}
    error = refused(body)
    assert names in error.message
