"""What a JSON schema in a request (``tools[].function.parameters``, ``response_format``) may ask
of a node's grammar-constrained sampler, checked before the request is routed.

A node turns these schemas into GBNF grammars (llama-cpp-python's ``json_schema_to_gbnf``) that
llama.cpp then parses and runs at every sampled token. Some schemas are harmless JSON but
dangerous grammars: a ``maxLength`` of 10^8 makes an 800 MB grammar (and 30,000 crashed the
parser, which recurses once per nested group), a ``pattern`` that repeats a repeated group
(``(a{0,8}){0,8}``) makes the sampler try exponentially many parses per token, and an empty
``enum`` is a grammar llama.cpp refuses. Pure: the proxy and the node both call
``check_schema_limits`` (through ``inference.chat_request``), so such a request is a 400 naming
the field and never reaches a node.
"""

from __future__ import annotations

import re
import re._constants as re_constants  # the stdlib's own regex parser, to inspect patterns
import re._parser as re_parser
from typing import Any

from inference.errors import BadRequest

MAX_COUNT = 256  # maxLength, minItems ...: a grammar nests one group per unit
COUNT_KEYS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties")
MAX_CHOICES = 256  # values of an enum, alternatives of anyOf / oneOf
CHOICE_KEYS = ("enum", "anyOf", "oneOf", "allOf")
MAX_SCHEMA_DEPTH = 32
_REPEATS = (re_constants.MAX_REPEAT, re_constants.MIN_REPEAT, re_constants.POSSESSIVE_REPEAT)


def check_schema_limits(schema: Any, where: str) -> None:
    """Raises ``BadRequest`` (code ``unsupported_schema``, ``param`` the field) for a schema a
    node's grammar sampler cannot take safely (see the module's docstring)."""
    _walk(schema, where, depth=0)


def _refuse(where: str, problem: str) -> None:
    raise BadRequest(f"{where} {problem}.", param=where, code="unsupported_schema")


def _walk(schema: Any, where: str, *, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        _refuse(where, f"nests schemas more than {MAX_SCHEMA_DEPTH} deep")
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            _walk(item, f"{where}[{i}]", depth=depth + 1)
        return
    if not isinstance(schema, dict):
        return
    _check_counts(schema, where)
    _check_choices(schema, where)
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        _check_pattern(pattern, f"{where}.pattern")
    for key, value in schema.items():
        if isinstance(value, dict | list) and key != "enum":
            _walk(value, f"{where}.{key}", depth=depth + 1)


def _check_counts(schema: dict[str, Any], where: str) -> None:
    for key in COUNT_KEYS:
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > MAX_COUNT:
            _refuse(f"{where}.{key}", f"must be at most {MAX_COUNT} for a constrained answer")


def _check_choices(schema: dict[str, Any], where: str) -> None:
    for key in CHOICE_KEYS:
        value = schema.get(key)
        if key in schema and (not isinstance(value, list) or not value):
            _refuse(f"{where}.{key}", "must be a non-empty list")
        if isinstance(value, list) and len(value) > MAX_CHOICES:
            _refuse(f"{where}.{key}", f"may hold at most {MAX_CHOICES} values")


def _check_pattern(pattern: str, where: str) -> None:
    try:
        parsed = re_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        _refuse(where, f"is not a regular expression: {exc}")
    if _has_nested_repeat(parsed):
        _refuse(where, "repeats a repeated group, which makes constrained sampling exponential")


def _has_nested_repeat(items: Any) -> bool:
    """A repeat whose body is itself only a repeat (``(a{0,8}){0,8}``, ``(a+)+``): every way of
    splitting a run between the two is a parse, so there are exponentially many. A repeated
    group with more in it (``( [A-Z][a-z]+)*``) splits one way only and passes."""
    for op, arg in items:
        if op in _REPEATS:
            _low, high, sub = arg
            if high != 1 and _only_a_repeat(sub):
                return True
            if _has_nested_repeat(sub):
                return True
        elif op is re_constants.SUBPATTERN:
            if _has_nested_repeat(arg[-1]):
                return True
        elif op is re_constants.BRANCH:
            if any(_has_nested_repeat(b) for b in arg[1]):
                return True
    return False


def _only_a_repeat(items: Any) -> bool:
    if len(items) != 1:
        return False
    op, arg = items[0]
    if op in _REPEATS:
        return arg[1] != 1
    if op is re_constants.SUBPATTERN:
        return _only_a_repeat(arg[-1])
    return False
