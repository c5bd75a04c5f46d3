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
