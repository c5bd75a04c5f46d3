"""The tool-call evaluation suite: ``suite.json`` loaded, checked and subset.

``suite.json`` holds ``version``, ``tools`` (OpenAI ``tools`` entries, each a function with a
JSON-schema ``parameters``) and ``cases``. A case is ``id``, ``category`` (one of
``CATEGORIES``), ``tools`` (2 to 4 names from the suite's tools, offered together so choosing
matters), ``messages`` (OpenAI chat messages; follow-up cases end with an assistant
``tool_calls`` message and its ``tool`` result), ``expected`` (``{"call": {"name",
"arguments"}}`` or ``{"call": null}`` when no call is right) and an optional ``optional_args``
(argument names of the expected call that the model may leave out: their value is what the
tool takes as its default).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

SUITE_PATH = Path(__file__).with_name("suite.json")
PERPLEXITY_TEXT_PATH = Path(__file__).with_name("perplexity.txt")

# The order in which ``Suite.subset`` takes one case of each category in turn: a small subset
# already mixes single calls, abstentions and follow-ups.
CATEGORIES = (
    "single",  # one call; string and enum arguments
    "no_call",  # chit-chat, a question answerable without tools, a tool that does not exist
    "multi_turn",  # an earlier call, its result and answer are in; a new request needs a call
    "after_result_call",  # a tool result is in; a second call is right
    "nested",  # nested objects and arrays
    "after_result_answer",  # a tool result is in; a text answer is right
    "unicode",  # non-ASCII values: accents, Cyrillic, Japanese, emoji
    "typed",  # integers, numbers, enums
    "optional",  # optional arguments given, or left out
)
FOLLOW_UP = ("after_result_call", "after_result_answer")
MIN_TOOLS, MAX_TOOLS = 2, 4


class SuiteError(ValueError):
    """``suite.json`` breaks a rule; the message names the case (or tool) and the rule."""


@dataclass(frozen=True)
class Case:
    """One test case. ``expected_call``: ``{"name", "arguments"}`` or None when no call is
    right; ``optional_args``: names in its arguments that may be absent."""

    id: str
    category: str
    tools: tuple[str, ...]
    messages: list[dict[str, Any]]
    expected_call: dict[str, Any] | None
    optional_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Suite:
    """The loaded suite: ``tools`` by name (OpenAI ``tools`` entries) and its ``cases``."""

    version: int
    tools: dict[str, dict[str, Any]]
    cases: tuple[Case, ...]
    text_for_perplexity: str = field(default="", repr=False)

    def tools_for(self, case: Case) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` entries offered in ``case``, in the case's order."""
        return [self.tools[name] for name in case.tools]

    def schemas_for(self, case: Case) -> dict[str, dict[str, Any]]:
        """Tool name -> JSON schema of its parameters, for the tools offered in ``case``."""
        return {name: parameters_of(self.tools[name]) for name in case.tools}

    def subset(self, n: int | None) -> Suite:
        """A stable subset of ``n`` cases balanced over categories: one case of each category
        in ``CATEGORIES`` order, then a second of each, ..., each category's cases in file
        order. ``n`` None or at least the suite's size: the whole suite."""
        if n is None or n >= len(self.cases):
            return self
        queues = {c: [case for case in self.cases if case.category == c] for c in CATEGORIES}
        picked: list[Case] = []
        depth = 0
        while len(picked) < n:
            for category in CATEGORIES:
                if depth < len(queues[category]) and len(picked) < n:
                    picked.append(queues[category][depth])
            depth += 1
        return Suite(self.version, self.tools, tuple(picked), self.text_for_perplexity)


def parameters_of(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a tool's arguments (an object with no properties when it has none)."""
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def load_suite(path: Path | str = SUITE_PATH) -> Suite:
    """The suite in ``path`` (default: the bundled ``suite.json``), checked by ``check_suite``,
    with the bundled perplexity text. Raises ``SuiteError`` (or ``OSError`` /
    ``json.JSONDecodeError`` for a missing or broken file)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    suite = check_suite(data)
    text = PERPLEXITY_TEXT_PATH.read_text(encoding="utf-8")
    return Suite(suite.version, suite.tools, suite.cases, text)


def check_suite(data: dict[str, Any]) -> Suite:
    """A ``Suite`` from parsed ``suite.json`` data. Raises ``SuiteError`` when a tool's schema
    is not a valid JSON schema, a tool name repeats, a case id repeats, a case's category is
    unknown, a case offers fewer than 2 or more than 4 tools or one the suite lacks, has no
    messages or no user message, a follow-up case has no ``tool`` message, an expected call
    names a tool the case does not offer or its arguments do not validate against that tool's
    schema (``jsonschema``), or an optional argument is missing from the expected call or
    required by the schema."""
    tools = _check_tools(data.get("tools") or [])
    cases: list[Case] = []
    seen: set[str] = set()
    for raw in data.get("cases") or []:
        case = _check_case(raw, tools)
        if case.id in seen:
            raise SuiteError(f"case id {case.id!r} is used twice")
        seen.add(case.id)
        cases.append(case)
    if not cases:
        raise SuiteError("the suite has no cases")
    return Suite(version=int(data.get("version", 0)), tools=tools, cases=tuple(cases))


def _check_tools(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = entry.get("function", {}).get("name")
        if entry.get("type") != "function" or not name:
            raise SuiteError(f"tool {entry!r:.80} is not a named function tool")
        if name in tools:
            raise SuiteError(f"tool {name!r} is defined twice")
        try:
            Draft202012Validator.check_schema(parameters_of(entry))
        except SchemaError as exc:
            raise SuiteError(
                f"tool {name!r}: its parameters are not a JSON schema: {exc.message}"
            ) from exc
        tools[name] = entry
    return tools


def _check_case(raw: dict[str, Any], tools: dict[str, dict[str, Any]]) -> Case:
    cid = raw.get("id") or ""
    if not cid:
        raise SuiteError(f"a case has no id: {raw!r:.80}")

    def fail(problem: str) -> SuiteError:
        return SuiteError(f"case {cid!r}: {problem}")

    if raw.get("category") not in CATEGORIES:
        raise fail(f"unknown category {raw.get('category')!r} (one of {', '.join(CATEGORIES)})")
    offered = tuple(raw.get("tools") or ())
    if not MIN_TOOLS <= len(offered) <= MAX_TOOLS:
        raise fail(f"offers {len(offered)} tools (from {MIN_TOOLS} to {MAX_TOOLS})")
    unknown = [name for name in offered if name not in tools]
    if unknown:
        raise fail(f"offers tools the suite lacks: {', '.join(unknown)}")
    messages = raw.get("messages") or []
    roles = [m.get("role") for m in messages]
    if "user" not in roles:
        raise fail("has no user message")
    if raw["category"] in FOLLOW_UP and "tool" not in roles:
        raise fail("is a follow-up but has no tool message")
    if "expected" not in raw or "call" not in raw["expected"]:
        raise fail('has no "expected": {"call": ...}')
    call = raw["expected"]["call"]
    optional = tuple(raw.get("optional_args") or ())
    if call is not None:
        _check_call(call, offered, tools, optional, fail)
    elif optional:
        raise fail("expects no call but lists optional_args")
    return Case(
        id=cid,
        category=raw["category"],
        tools=offered,
        messages=messages,
        expected_call=call,
        optional_args=optional,
    )


def _check_call(
    call: dict[str, Any],
    offered: tuple[str, ...],
    tools: dict[str, dict[str, Any]],
    optional: tuple[str, ...],
    fail: Callable[[str], SuiteError],
) -> None:
    name, arguments = call.get("name"), call.get("arguments")
    if name not in offered:
        raise fail(f"expects a call to {name!r}, which the case does not offer")
    schema = parameters_of(tools[name])
    errors = sorted(Draft202012Validator(schema).iter_errors(arguments), key=str)
    if errors:
        raise fail(f"the expected arguments do not match {name}'s schema: {errors[0].message}")
    required = set(schema.get("required") or ())
    for arg in optional:
        if arg not in arguments:
            raise fail(f"optional argument {arg!r} is not in the expected call")
        if arg in required:
            raise fail(f"optional argument {arg!r} is required by {name}'s schema")
