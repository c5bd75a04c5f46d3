"""Every field rule of ``parse_chat_request`` and ``decode_json``: the value a node gets, the
bounds it accepts and, for each refusal, the exact message, ``param`` and ``code`` a client
reads (the error names the problem; ``make mutation`` measures that these tests notice a
changed bound, default or message)."""

from __future__ import annotations

import pytest

from inference.chat_request import MAX_STOP_STRINGS, decode_json, parse_chat_request
from inference.errors import BadRequest

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def chat(**fields):
    return parse_chat_request({"model": "m", "messages": HI, **fields})


def said(body) -> tuple[str, str | None, str]:
    """(message, param, code) of the refusal of ``body``."""
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(body)
    return caught.value.message, caught.value.param, caught.value.code


def said_of(**fields) -> tuple[str, str | None, str]:
    return said({"model": "m", "messages": HI, **fields})


def test_defaults_are_llama_servers() -> None:
    c = chat()
    assert (c.model, c.messages, c.stream, c.max_tokens, c.seed) == ("m", HI, False, None, None)
    assert (c.temperature, c.top_p, c.top_k, c.min_p) == (0.8, 0.95, 40, 0.05)
    assert (c.repeat_penalty, c.frequency_penalty, c.presence_penalty) == (1.0, 0.0, 0.0)
    assert (c.stop, c.response_format, c.tool_mode) == ((), None, None)
    assert chat(stream=True).stream is True


NUMBERS = [  # field, lowest, highest
    ("temperature", 0.0, 2.0),
    ("top_p", 0.0, 1.0),
    ("min_p", 0.0, 1.0),
    ("repeat_penalty", 0.0, 10.0),
    ("frequency_penalty", -2.0, 2.0),
    ("presence_penalty", -2.0, 2.0),
]


@pytest.mark.parametrize(("field", "lo", "hi"), NUMBERS)
def test_a_number_is_taken_within_its_bounds_and_refused_past_them(field, lo, hi) -> None:
    assert getattr(chat(**{field: lo}), field) == lo
    assert getattr(chat(**{field: hi}), field) == hi
    assert isinstance(getattr(chat(**{field: int(hi)}), field), float)
    for value in (lo - 0.01, hi + 0.01):
        assert said_of(**{field: value}) == (
            f"{field} must be between {lo:g} and {hi:g}, got {value}.",
            field,
            "invalid_request",
        )


@pytest.mark.parametrize("field", ["min_p", "repeat_penalty"])  # not OpenAI's: checked here
@pytest.mark.parametrize("value", ["0.5", True, [1]])
def test_a_number_that_is_not_one_is_refused(field, value) -> None:
    assert said_of(**{field: value}) == (f"{field} must be a number.", field, "invalid_request")


INTEGERS = [  # field, lowest, highest
    ("max_tokens", 1, 1 << 20),
    ("max_completion_tokens", 1, 1 << 20),
    ("top_k", 0, 1 << 20),
    ("seed", -(1 << 63), (1 << 63) - 1),
]


@pytest.mark.parametrize(("field", "lo", "hi"), INTEGERS)
def test_an_integer_is_taken_within_its_bounds_and_refused_past_them(field, lo, hi) -> None:
    name = "max_tokens" if field == "max_completion_tokens" else field
    assert getattr(chat(**{field: lo}), name) == lo
    assert getattr(chat(**{field: hi}), name) == hi
    for value in (lo - 1, hi + 1):
        assert said_of(**{field: value}) == (
            f"{field} must be between {lo} and {hi}, got {value}.",
            field,
            "invalid_request",
        )


@pytest.mark.parametrize("value", [2.5, "3", False])
def test_an_integer_that_is_not_one_is_refused(value) -> None:
    assert said_of(top_k=value) == ("top_k must be an integer.", "top_k", "invalid_request")


def test_max_tokens_wins_over_max_completion_tokens() -> None:
    assert chat(max_completion_tokens=9).max_tokens == 9
    assert chat(max_completion_tokens=9, max_tokens=4).max_tokens == 4


def test_stop_takes_a_string_or_up_to_eight() -> None:
    assert chat(stop="END").stop == ("END",)
    eight = [f"s{i}" for i in range(MAX_STOP_STRINGS)]
    assert chat(stop=eight).stop == tuple(eight)
    assert MAX_STOP_STRINGS == 8
    assert said_of(stop=[*eight, "s8"]) == (
        "stop takes at most 8 strings.",
        "stop",
        "invalid_request",
    )
    assert said_of(stop=["a", ""]) == ("stop strings must not be empty.", "stop", "invalid_request")
    assert said_of(stop="") == ("stop strings must not be empty.", "stop", "invalid_request")


def test_what_a_node_cannot_serve_is_refused_by_name() -> None:
    assert said({"model": " ", "messages": HI}) == (
        "model must be a non-empty string.",
        "model",
        "invalid_request",
    )
    assert said({"model": "m", "messages": []}) == (
        "messages must not be empty.",
        "messages",
        "empty_messages",
    )
    assert said_of(n=2) == ("n must be 1: a node returns one choice.", "n", "invalid_request")
    assert chat(n=1).model == "m"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    parts = [{"type": "text", "text": "look"}, image]
    assert said({"model": "m", "messages": [{"role": "user", "content": parts}]}) == (
        "messages[0].content[1] is a image_url part; this array's models take text only.",
        "messages[0].content[1]",
        "unsupported_content",
    )
    refusal = [{"type": "refusal", "refusal": "no"}]
    assert chat(messages=[*HI, {"role": "assistant", "content": refusal}]).messages[1]


def test_the_body_must_be_an_object() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request([])
    assert (caught.value.message, caught.value.code) == (
        "The request body must be a JSON object.",
        "invalid_json",
    )


def test_tools_set_the_tool_mode() -> None:
    mode = chat(tools=[TOOL]).tool_mode
    assert mode.tools == (TOOL,) and mode.choice == "auto"
    assert mode.allows_call and not mode.forces_call
    none = chat(tools=[TOOL], tool_choice="none").tool_mode
    assert none.choice == "none" and not none.allows_call and not none.forces_call
    required = chat(tools=[TOOL], tool_choice="required").tool_mode
    assert required.forces_call and required.allows_call
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert chat(tools=[TOOL], tool_choice=named).tool_mode.choice == "get_weather"
    assert chat(tools=[TOOL], tool_choice=named).tool_mode.forces_call
    assert chat(tool_choice="none").tool_mode is None
    assert chat(tool_choice="auto", tools=[]).tool_mode is None


def test_bad_tools_are_refused_by_name() -> None:
    assert said_of(tool_choice="required") == (
        "tool_choice names or requires a tool, but tools is empty.",
        "tool_choice",
        "invalid_request",
    )
    unknown = {"type": "function", "function": {"name": "other"}}
    assert said_of(tools=[TOOL], tool_choice=unknown) == (
        "tool_choice names unknown tool 'other'.",
        "tool_choice",
        "invalid_request",
    )
    custom = {"type": "custom", "custom": {"name": "grep"}}
    assert said_of(tools=[TOOL, custom]) == (
        "tools[1] is a custom tool; nodes call function tools only.",
        "tools[1].type",
        "invalid_request",
    )
    bad_name = {"type": "function", "function": {"name": "a" * 65}}
    assert said_of(tools=[TOOL, bad_name]) == (
        "tools[1].function.name must be 1 to 64 letters, digits, _ or - (OpenAI's rule).",
        "tools[1].function.name",
        "invalid_request",
    )
    ok = {"type": "function", "function": {"name": "A-z_09" + "a" * 58}}
    assert chat(tools=[ok]).tool_mode.tools == (ok,)
    deep = {"type": "function", "function": {"name": "f", "parameters": {"maxLength": 9999}}}
    message, param, _ = said_of(tools=[TOOL, deep])
    assert param.startswith("tools[1].function.parameters") and "maxLength" in message


def test_a_tool_choice_of_another_type_is_refused() -> None:
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}
    message, param, _ = said_of(tools=[TOOL], tool_choice=allowed)
    assert param == "tool_choice.type"
    assert message == "tool_choice of type allowed_tools is not supported; name a function."


def test_response_formats() -> None:
    assert chat(response_format={"type": "json_object"}).response_format == {"type": "json_object"}
    schema = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}
    assert chat(response_format=schema).response_format == schema
    text = {"type": "text"}
    assert chat(tools=[TOOL], response_format=text).tool_mode.choice == "auto"
    assert said_of(tools=[TOOL], response_format={"type": "json_object"}) == (
        "'tools' and a JSON 'response_format' cannot be combined.",
        "response_format",
        "invalid_request",
    )
    no_schema = {"type": "json_schema", "json_schema": {"name": "s"}}
    assert said_of(response_format=no_schema) == (
        "response_format.json_schema.schema must be an object.",
        "response_format.json_schema.schema",
        "invalid_request",
    )
    wide = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"maxItems": 9999}}}
    message, param, _ = said_of(response_format=wide)
    assert param.startswith("response_format.json_schema.schema") and "maxItems" in message


def decode_refusal(raw) -> tuple[str, str]:
    with pytest.raises(BadRequest) as caught:
        decode_json(raw)
    return caught.value.message, caught.value.code


def test_decode_json_takes_bytes_or_text() -> None:
    assert decode_json(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    assert decode_json('{"a": "é"}') == {"a": "é"}
    assert decode_json("1e308") == 1e308


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "The body is not valid JSON: Expecting value: line 1 column 1 (char 0)."),
        ("", "The body is not valid JSON: Expecting value: line 1 column 1 (char 0)."),
        (b"{", "The body is not valid JSON: Expecting property name enclosed in double quotes"),
        (b"\xff", "The body is not UTF-8: 'utf-8' codec can't decode byte 0xff in position 0"),
        (b"[" * 5000 + b"]" * 5000, "The JSON nests too deeply."),
        (
            b'{"a": "\\ud800"}',
            "The JSON holds an unpaired UTF-16 surrogate (e.g. \\ud800); it is not valid text.",
        ),
        (b'{"a": NaN}', "The body is not valid JSON: NaN is not a JSON number."),
        (b'{"a": 1e309}', "The body is not valid JSON: 1e309 is too large for a number."),
        (
            b'{"a": -1' + b"0" * 400 + b".5}",
            "The body is not valid JSON: -1" + "0" * 38 + " is too large for a number.",
        ),
        (
            "{}".encode("utf-16"),  # JSON itself allows UTF-16; this API takes UTF-8 only
            "The body is not UTF-8: 'utf-8' codec can't decode byte 0xff in position 0",
        ),
    ],
)
def test_decode_json_refuses_with_a_message_that_names_the_problem(raw, message) -> None:
    said, code = decode_refusal(raw)
    assert said.startswith(message) and code == "invalid_json"
