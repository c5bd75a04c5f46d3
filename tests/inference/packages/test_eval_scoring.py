"""Scoring of tool-call answers (``inference.packages.evaluation.scoring``), on plain data."""

from __future__ import annotations

import json

import pytest

from inference.packages.evaluation.scoring import (
    Answer,
    arguments_match,
    json_equal,
    read_answer,
    read_call_text,
    refused_score,
    score_case,
    summarize,
)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
FLIGHTS = {
    "type": "object",
    "properties": {
        "origin": {"type": "string"},
        "passengers": {"type": "integer"},
        "cabin": {"type": "string", "enum": ["economy", "business"]},
    },
    "required": ["origin", "passengers"],
    "additionalProperties": False,
}
OFFERED = {"get_weather": WEATHER, "search_flights": FLIGHTS}
ZURICH = {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}


def tool_calls_message(name: str, arguments: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def text_message(content: str) -> dict:
    return {"role": "assistant", "content": content}


def score(message: dict, expected: dict | None = ZURICH, optional: tuple[str, ...] = ()):
    return score_case(expected, read_answer(message), offered=OFFERED, optional_args=optional)


# reading answers ---------------------------------------------------------------------------


def test_it_reads_a_call_from_tool_calls():
    answer = read_answer(tool_calls_message("get_weather", '{"city": "Zürich", "unit": "celsius"}'))
    assert answer == Answer(
        True,
        "get_weather",
        {"city": "Zürich", "unit": "celsius"},
        True,
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}</tool_call>',
    )


def test_it_reads_a_call_written_in_the_content():
    text = '\n <tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}\n</tool_call> done'
    answer = read_call_text(text)
    assert (answer.called, answer.name, answer.arguments, answer.parsed) == (
        True,
        "get_weather",
        {"city": "Zürich", "unit": "celsius"},
        True,
    )
    assert answer.text == text


def test_it_reads_text_that_mentions_the_tag_later_as_no_call():
    text = 'To call a tool, answer with <tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    answer = read_call_text(text)
    assert (answer.called, answer.name, answer.parsed, answer.text) == (False, None, False, text)


def test_it_reads_a_call_cut_before_its_closing_tag():
    answer = read_call_text('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert (answer.name, answer.arguments) == ("get_weather", {"city": "Oslo"})


def test_it_takes_arguments_sent_as_a_json_string():
    answer = read_call_text(
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>'
    )
    assert (answer.parsed, answer.arguments) == (True, {"city": "Oslo"})


def test_it_reads_the_name_of_a_call_whose_json_is_broken():
    answer = read_call_text(
        '<tool_call>{"name": "get_weather", "arguments": {"city": Zürich}}</tool_call>'
    )
    assert (answer.called, answer.name, answer.arguments, answer.parsed) == (
        True,
        "get_weather",
        None,
        False,
    )


def test_it_reads_text_without_a_tag_as_no_call_even_when_it_is_json():
    answer = read_answer(text_message('{"name": "get_weather", "arguments": {"city": "Oslo"}}'))
    assert (answer.called, answer.name, answer.parsed) == (False, None, False)


def test_it_reads_an_empty_message_as_no_call():
    assert read_answer({"role": "assistant", "content": None}).called is False


def test_it_does_not_parse_arguments_that_are_not_an_object():
    answer = read_answer(tool_calls_message("get_weather", "[1, 2]"))
    assert (answer.called, answer.parsed, answer.arguments) == (True, False, None)


# one case ----------------------------------------------------------------------------------


def test_it_scores_the_expected_call_as_correct():
    s = score(tool_calls_message("get_weather", '{"unit": "celsius", "city": "Zürich"}'))
    assert (s.correct, s.called, s.parsed, s.schema_valid, s.name_ok, s.args_ok) == (
        True,
        True,
        True,
        True,
        True,
        True,
    )


def test_it_compares_strings_exactly():
    s = score(tool_calls_message("get_weather", '{"city": "Zurich", "unit": "celsius"}'))
    assert (s.correct, s.schema_valid, s.name_ok, s.args_ok) == (False, True, True, False)


def test_it_scores_free_mode_json_that_does_not_parse():
    """Free mode: the model wrote the tag but broken JSON (an unquoted string)."""
    s = score(
        text_message(
            '<tool_call>{"name": "get_weather", "arguments": {"city": Zürich, "unit": "celsius"}}</tool_call>'
        )
    )
    assert (s.correct, s.called, s.parsed, s.schema_valid, s.name_ok, s.args_ok) == (
        False,
        True,
        False,
        False,
        True,
        False,
    )


def test_it_scores_a_call_to_a_tool_not_offered_as_schema_invalid():
    s = score(tool_calls_message("book_taxi", '{"city": "Zürich", "unit": "celsius"}'))
    assert (s.parsed, s.schema_valid, s.name_ok, s.args_ok, s.correct) == (
        True,
        False,
        False,
        False,
        False,
    )


def test_it_scores_arguments_that_break_the_schema_as_invalid():
    s = score(tool_calls_message("get_weather", '{"city": "Zürich", "unit": "kelvin"}'))
    assert (s.parsed, s.schema_valid, s.correct) == (True, False, False)


def test_it_scores_the_right_arguments_to_the_wrong_tool_as_wrong():
    s = score(tool_calls_message("search_flights", '{"city": "Zürich", "unit": "celsius"}'))
    assert (s.name_ok, s.args_ok, s.correct) == (False, False, False)


def test_it_scores_no_answer_call_as_wrong_when_a_call_is_expected():
    s = score(text_message("It is sunny in Zürich."))
    assert (s.correct, s.called, s.parsed, s.schema_valid, s.name_ok, s.args_ok) == (
        False,
        False,
        None,
        None,
        False,
        False,
    )


def test_it_scores_an_abstention_as_correct_when_no_call_is_expected():
    s = score(text_message("Hello! I am fine, thanks."), expected=None)
    assert (s.expects_call, s.correct, s.called, s.parsed, s.name_ok, s.args_ok) == (
        False,
        True,
        False,
        None,
        None,
        None,
    )


def test_it_scores_a_call_as_wrong_when_no_call_is_expected():
    s = score(
        tool_calls_message("get_weather", '{"city": "Paris", "unit": "celsius"}'), expected=None
    )
    assert (s.correct, s.called, s.parsed, s.schema_valid, s.name_ok) == (
        False,
        True,
        True,
        True,
        None,
    )


FLIGHT = {
    "name": "search_flights",
    "arguments": {"origin": "BOS", "passengers": 1, "cabin": "economy"},
}


def test_it_accepts_an_optional_argument_left_out():
    s = score(
        tool_calls_message("search_flights", '{"origin": "BOS", "passengers": 1}'),
        FLIGHT,
        ("cabin",),
    )
    assert s.correct is True


def test_it_accepts_an_optional_argument_given_with_the_expected_value():
    args = '{"origin": "BOS", "passengers": 1, "cabin": "economy"}'
    assert score(tool_calls_message("search_flights", args), FLIGHT, ("cabin",)).correct is True


def test_it_refuses_an_optional_argument_given_with_another_value():
    args = '{"origin": "BOS", "passengers": 1, "cabin": "business"}'
    s = score(tool_calls_message("search_flights", args), FLIGHT, ("cabin",))
    assert (s.schema_valid, s.args_ok) == (True, False)


def test_it_refuses_a_missing_argument_that_is_not_optional():
    s = score(tool_calls_message("search_flights", '{"origin": "BOS", "passengers": 1}'), FLIGHT)
    assert s.args_ok is False


def test_it_refuses_an_argument_the_case_does_not_expect():
    expected = {"name": "search_flights", "arguments": {"origin": "BOS", "passengers": 1}}
    args = '{"origin": "BOS", "passengers": 1, "cabin": "economy"}'
    assert score(tool_calls_message("search_flights", args), expected).args_ok is False


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (19, 19.0, True),
        (21.5, 21.5, True),
        (1, True, False),
        (0, False, False),
        (True, True, True),
        ("São Paulo", "São Paulo", True),
        ("São Paulo", "Sao Paulo", False),
        ("19", 19, False),
        (["a", "b"], ["a", "b"], True),
        (["a", "b"], ["b", "a"], False),
        ({"x": {"y": [1]}}, {"x": {"y": [1.0]}}, True),
        ({"x": 1}, {"x": 1, "z": None}, False),
        (None, None, True),
        (None, "", False),
    ],
)
def test_it_compares_json_values(a, b, equal):
    assert json_equal(a, b) is equal
    assert json_equal(b, a) is equal


def test_it_matches_nested_arguments():
    expected = {
        "table": "orders",
        "filters": {"column": "status", "operator": "equals", "value": "shipped"},
    }
    actual = json.loads(json.dumps(expected))
    assert arguments_match(expected, actual)
    actual["filters"]["value"] = "Shipped"
    assert not arguments_match(expected, actual)


# a mode's figures --------------------------------------------------------------------------


def test_it_summarizes_a_mode():
    scores = [
        score(tool_calls_message("get_weather", '{"city": "Zürich", "unit": "celsius"}')),  # right
        score(tool_calls_message("get_weather", '{"city": "Zurich", "unit": "celsius"}')),  # args
        score(text_message('<tool_call>{"name": "get_weather", "arguments": {city}}</tool_call>')),
        score(text_message("It is sunny.")),  # no call, one expected
        score(text_message("Hi!"), expected=None),  # abstained
        score(tool_calls_message("get_weather", '{"city": "X", "unit": "x"}'), expected=None),
    ]
    assert summarize(scores) == {
        "cases": 6,
        "tool_accuracy": 2 / 6,
        "json_parse_rate": 3 / 4,
        "schema_valid_rate": 2 / 4,
        "name_accuracy": 3 / 4,
        "args_exact": 1 / 4,
        "abstention_accuracy": 1 / 2,
        "calls": 4,
    }


def test_it_reports_none_for_a_figure_without_cases():
    s = summarize([score(text_message("Hi!"), expected=None)])
    assert s == {
        "cases": 1,
        "tool_accuracy": 1.0,
        "json_parse_rate": None,
        "schema_valid_rate": None,
        "name_accuracy": None,
        "args_exact": None,
        "abstention_accuracy": 1.0,
        "calls": 0,
    }
    assert summarize([])["tool_accuracy"] is None


def test_it_counts_a_refused_request_as_wrong_and_not_as_an_abstention():
    s = summarize([refused_score(False), refused_score(True)])
    assert (s["tool_accuracy"], s["abstention_accuracy"], s["name_accuracy"], s["calls"]) == (
        0.0,
        0.0,
        0.0,
        0,
    )
