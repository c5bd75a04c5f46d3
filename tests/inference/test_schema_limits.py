"""Schemas a node's grammar sampler cannot take safely are refused before routing."""

from __future__ import annotations

import pytest

from inference.errors import BadRequest
from inference.schema_limits import check_schema_limits


@pytest.mark.parametrize(
    ("schema", "field", "says"),
    [
        ({"type": "string", "maxLength": 100_000_000}, "s.maxLength", "at most 256"),
        ({"type": "array", "minItems": 1000}, "s.minItems", "at most 256"),
        ({"enum": []}, "s.enum", "non-empty list"),
        ({"anyOf": []}, "s.anyOf", "non-empty list"),
        ({"enum": list(range(300))}, "s.enum", "at most 256"),
        ({"type": "string", "pattern": "^((a{0,8}){0,8})$"}, "s.pattern", "repeated group"),
        ({"type": "string", "pattern": "^(a+)+$"}, "s.pattern", "repeated group"),
        ({"type": "string", "pattern": "^(a{0,2}){0,2}b{2,1}$"}, "s.pattern", "not a regular"),
        (
            {"type": "object", "properties": {"x": {"type": "string", "maxLength": 5000}}},
            "s.properties.x.maxLength",
            "at most 256",
        ),
    ],
)
def test_it_refuses_a_schema_that_would_hurt_the_sampler(schema, field, says) -> None:
    with pytest.raises(BadRequest) as info:
        check_schema_limits(schema, "s")
    assert info.value.param == field and says in info.value.message
    assert info.value.code == "unsupported_schema"


def test_it_passes_ordinary_agent_schemas() -> None:
    check_schema_limits(
        {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string",
                    "maxLength": 80,
                    "pattern": "^[A-Z][a-z]+( [A-Z][a-z]+)*$",
                },
                "days": {"type": "integer", "enum": [1, 2, 3]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
            },
            "required": ["city"],
        },
        "s",
    )


def refusal(schema) -> tuple[str, str | None]:
    with pytest.raises(BadRequest) as info:
        check_schema_limits(schema, "s")
    return info.value.message, info.value.param


def test_the_limits_are_inclusive_and_messages_exact() -> None:
    check_schema_limits({"maxLength": 256, "enum": list(range(256))}, "s")
    assert refusal({"maxLength": 257}) == (
        "s.maxLength must be at most 256 for a constrained answer.",
        "s.maxLength",
    )
    assert refusal({"oneOf": [{}] * 257}) == ("s.oneOf may hold at most 256 values.", "s.oneOf")
    assert refusal({"allOf": {}}) == ("s.allOf must be a non-empty list.", "s.allOf")
    assert refusal({"pattern": "(a*)*"}) == (
        "s.pattern repeats a repeated group, which makes constrained sampling exponential.",
        "s.pattern",
    )


def test_a_count_that_is_not_a_number_is_left_to_the_schema() -> None:
    check_schema_limits({"maxLength": True, "minItems": "9999"}, "s")


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_schemas_nest_at_most_32_deep_through_objects_and_lists() -> None:
    check_schema_limits(nested(32), "s")  # 32 levels below the top: at the limit
    message, param = refusal(nested(33))
    assert message == f"{param} nests schemas more than 32 deep."
    assert param == "s" + ".items" * 33
    lists: dict = {"type": "string"}
    for _ in range(16):
        lists = {"anyOf": [lists]}  # two levels each: the list and its item
    check_schema_limits(lists, "s")
    message, param = refusal({"anyOf": [lists]})
    assert param == "s" + ".anyOf[0]" * 16 + ".anyOf" and "more than 32 deep" in message


def test_an_enum_s_values_are_data_not_schemas() -> None:
    check_schema_limits({"enum": [{"maxLength": 9999}, [{"pattern": "(a*)*"}]]}, "s")
    assert refusal({"const": {"maxLength": 9999}})[1] == "s.const.maxLength"


@pytest.mark.parametrize(
    "pattern",
    [
        "(a*)*",
        "(?:a{2,}){3}",
        "x|(b+)+",  # in a branch
        "((c+))+",  # through a group
        "(d|(e+)+)",  # a branch inside a group
        "f(g*)+?",  # lazy outer repeat
        "(b(a*)*)+",  # inside a repeat with more in it
    ],
)
def test_a_repeat_of_only_a_repeat_is_refused(pattern) -> None:
    assert refusal({"pattern": pattern})[1] == "s.pattern"


@pytest.mark.parametrize(
    "pattern",
    ["(a?)+", "(a{1})*", "(ab+)+", "(a+)?", "(a|b)+", "[a-z]+( [a-z]+)*", "x|y", "(a+){1}"],
)
def test_a_repeat_that_splits_one_way_only_passes(pattern) -> None:
    check_schema_limits({"pattern": pattern}, "s")
