"""Scoring tool-call answers: one case's outcome in one mode, and a mode's figures. Pure.

A case expects either one call (``{"name", "arguments"}``) or no call. The model's answer is
read from its OpenAI assistant message by ``read_answer``: the first of its ``tool_calls`` when
it has any (grammar mode: the node parsed the call), else a
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` that its content starts with
(leading whitespace aside; free mode, where nothing constrains the text; also a grammar-mode
call that ran out of tokens, which the node returns as content). A call must open the answer,
as the node's protocol writes it (``inference.engine.prompt.parse_tool_call``): text that
mentions the tag later, or holds call-shaped JSON without it, is no call.

Per mode, over the cases run (``summarize``; every figure is a fraction 0..1, or None when its
denominator is 0):

- ``tool_accuracy``: cases fully right / all cases. A case expecting a call is right when the
  answer calls the expected tool with exactly the expected arguments (``args_exact`` below); a
  case expecting no call is right when the answer makes none.
- ``json_parse_rate``: answers whose call's arguments parsed as a JSON object / answers that
  attempted a call (wrote ``<tool_call>`` or came back as ``tool_calls``). In free mode the
  whole ``{"name", "arguments"}`` object must parse (JSON after it, before ``</tool_call>``, is
  ignored); ``arguments`` given as a string holding a JSON object counts as parsed.
- ``schema_valid_rate``: attempted calls that name a tool offered in the case and whose parsed
  arguments validate against that tool's JSON schema (``jsonschema``, draft 2020-12) /
  attempted calls. A call that did not parse is not valid.
- ``name_accuracy``: cases expecting a call whose answer calls the expected tool (its name read
  even when the rest of the JSON is broken) / cases expecting a call.
- ``args_exact``: cases expecting a call whose answer calls the expected tool with arguments
  JSON-equal to the expected ones / cases expecting a call. JSON-equal: the same keys, strings
  compared exactly, numbers by value (``19`` equals ``19.0``, JSON does not tell them apart),
  booleans only equal booleans, arrays in order. An argument named in the case's
  ``optional_args`` that the answer leaves out is dropped from the expected arguments first;
  one it gives must equal the expected value. An argument the answer adds is a mismatch.
- ``abstention_accuracy``: cases expecting no call whose answer makes no call / cases expecting
  no call.

A request the node refused (an HTTP error: ``refused_score``) is a wrong case with no call: it
counts in ``tool_accuracy``, ``name_accuracy`` and ``args_exact`` as wrong, and is not an
abstention.
- ``calls``: how many answers attempted a call (the denominator of the two rates).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from inference.engine.prompt import TOOL_CLOSE, TOOL_OPEN

MODES = ("grammar", "free")

_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Answer:
    """A model's answer as read by ``read_answer``. ``called``: it attempted a tool call;
    ``name``: the called tool's name (None when unreadable or no call); ``arguments``: the
    call's arguments object when they parsed, else None; ``parsed``: they did; ``text``: the
    answer as text (the content, or the call written back as ``<tool_call>...``)."""

    called: bool
    name: str | None
    arguments: dict[str, Any] | None
    parsed: bool
    text: str


@dataclass(frozen=True)
class CaseScore:
    """One case's outcome in one mode. ``parsed`` and ``schema_valid`` are None when no call
    was attempted; ``name_ok`` and ``args_ok`` are None when the case expects no call."""

    expects_call: bool
    correct: bool
    called: bool
    parsed: bool | None
    schema_valid: bool | None
    name_ok: bool | None
    args_ok: bool | None


def read_answer(message: Mapping[str, Any]) -> Answer:
    """The ``Answer`` in an OpenAI assistant message (``content`` and optional
    ``tool_calls``); see the module docstring for how a call is found."""
    calls = message.get("tool_calls") or []
    if calls:
        function = calls[0].get("function") or {}
        name, raw = function.get("name"), function.get("arguments")
        arguments = _arguments_object(raw)
        raw_text = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
        text = f'{TOOL_OPEN}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {raw_text}}}{TOOL_CLOSE}'
        return Answer(
            True, name if isinstance(name, str) else None, arguments, arguments is not None, text
        )
    return read_call_text(message.get("content") or "")


def read_call_text(text: str) -> Answer:
    """The ``Answer`` in plain text: a call when the text starts with ``<tool_call>``
    (after whitespace), read from the JSON object that follows (up to ``</tool_call>`` or the
    end of the text)."""
    opened = text.lstrip()
    if not opened.startswith(TOOL_OPEN):
        return Answer(False, None, None, False, text)
    body = opened[len(TOOL_OPEN) :]
    end = body.find(TOOL_CLOSE)
    body = body[:end] if end >= 0 else body
    try:
        call, _ = json.JSONDecoder().raw_decode(body.strip())
    except (ValueError, RecursionError):
        call = None
    if not isinstance(call, dict):
        return Answer(True, _name_in(body), None, False, text)
    name = call.get("name") if isinstance(call.get("name"), str) else None
    arguments = _arguments_object(call.get("arguments"))
    return Answer(True, name, arguments, arguments is not None, text)


def _arguments_object(raw: Any) -> dict[str, Any] | None:
    """``raw`` as an arguments object: a dict, or a string holding a JSON object; else None."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return None
    return raw if isinstance(raw, dict) else None


def _name_in(body: str) -> str | None:
    """The first ``"name": "..."`` in a call whose JSON is broken."""
    match = _NAME.search(body)
    if match is None:
        return None
    try:
        return json.loads(f'"{match.group(1)}"')
    except ValueError:
        return None


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: same types up to int/float (compared by value), strings exactly, booleans
    only with booleans, arrays in order, objects with the same keys."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return a is None and b is None


def arguments_match(
    expected: Mapping[str, Any], actual: Mapping[str, Any], optional_args: Sequence[str] = ()
) -> bool:
    """``actual`` JSON-equals ``expected`` once the optional arguments ``actual`` leaves out
    are dropped from ``expected``."""
    wanted = {k: v for k, v in expected.items() if k in actual or k not in optional_args}
    return json_equal(wanted, dict(actual))


def schema_valid(answer: Answer, offered: Mapping[str, Mapping[str, Any]]) -> bool:
    """The answer's call parsed, names a tool in ``offered`` (name -> parameters schema) and
    its arguments validate against that schema."""
    if not answer.called or answer.arguments is None or answer.name not in offered:
        return False
    return Draft202012Validator(dict(offered[answer.name])).is_valid(answer.arguments)


def score_case(
    expected_call: Mapping[str, Any] | None,
    answer: Answer,
    *,
    offered: Mapping[str, Mapping[str, Any]],
    optional_args: Sequence[str] = (),
) -> CaseScore:
    """Score one answer. ``expected_call``: ``{"name", "arguments"}`` or None when no call is
    right; ``offered``: the case's tools, name -> parameters JSON schema."""
    parsed = answer.parsed if answer.called else None
    valid = schema_valid(answer, offered) if answer.called else None
    if expected_call is None:
        return CaseScore(False, not answer.called, answer.called, parsed, valid, None, None)
    name_ok = answer.called and answer.name == expected_call["name"]
    args_ok = (
        name_ok
        and answer.arguments is not None
        and arguments_match(expected_call["arguments"], answer.arguments, optional_args)
    )
    return CaseScore(True, args_ok, answer.called, parsed, valid, name_ok, args_ok)


def refused_score(expects_call: bool) -> CaseScore:
    """The score of a case whose request the node refused: wrong, with no call."""
    wrong = False if expects_call else None
    return CaseScore(expects_call, False, False, None, None, wrong, wrong)


def fraction(hits: int, total: int) -> float | None:
    """``hits / total``, None when ``total`` is 0."""
    return hits / total if total else None


def summarize(scores: Sequence[CaseScore]) -> dict[str, Any]:
    """A mode's figures over its case scores (definitions: the module docstring):
    ``{"cases": n, "tool_accuracy", "json_parse_rate", "schema_valid_rate", "name_accuracy",
    "args_exact", "abstention_accuracy": fraction or None, "calls": n attempted}``."""
    attempted = [s for s in scores if s.called]
    expecting = [s for s in scores if s.expects_call]
    abstaining = [s for s in scores if not s.expects_call]
    return {
        "cases": len(scores),
        "tool_accuracy": fraction(sum(s.correct for s in scores), len(scores)),
        "json_parse_rate": fraction(sum(bool(s.parsed) for s in attempted), len(attempted)),
        "schema_valid_rate": fraction(sum(bool(s.schema_valid) for s in attempted), len(attempted)),
        "name_accuracy": fraction(sum(bool(s.name_ok) for s in expecting), len(expecting)),
        "args_exact": fraction(sum(bool(s.args_ok) for s in expecting), len(expecting)),
        "abstention_accuracy": fraction(sum(s.correct for s in abstaining), len(abstaining)),
        "calls": len(attempted),
    }
