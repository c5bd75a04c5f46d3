"""The tool-call evaluation suite (``inference.packages.evaluation.suite``) and its data."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
from jsonschema import Draft202012Validator

from inference.chat_request import ToolMode
from inference.engine.prompt import ChatFormatter, tools_system_block
from inference.packages.evaluation.runner import case_request, messages_with_tools_block
from inference.packages.evaluation.suite import (
    CATEGORIES,
    SUITE_PATH,
    SuiteError,
    check_suite,
    load_suite,
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def suite():
    return load_suite()


@pytest.fixture
def data():
    return json.loads(SUITE_PATH.read_text(encoding="utf-8"))


def test_it_loads_at_least_60_cases_over_at_least_8_tools(suite):
    assert len(suite.cases) >= 60
    assert len(suite.tools) >= 8
    assert len({name for case in suite.cases for name in case.tools}) >= 8


def test_it_has_every_category(suite):
    counts = Counter(case.category for case in suite.cases)
    assert set(counts) == set(CATEGORIES)
    assert min(counts.values()) >= 5


def test_it_has_unique_ids_and_valid_expected_calls(suite):
    assert len({case.id for case in suite.cases}) == len(suite.cases)
    for case in suite.cases:
        assert 2 <= len(case.tools) <= 4, case.id
        if case.expected_call is not None:
            schema = suite.schemas_for(case)[case.expected_call["name"]]
            Draft202012Validator(schema).validate(case.expected_call["arguments"])


def test_it_covers_calls_abstentions_and_follow_ups(suite):
    expected = [case.expected_call for case in suite.cases]
    assert sum(call is None for call in expected) >= 10
    follow_ups = [case for case in suite.cases if case.category.startswith("after_result")]
    assert all(case.messages[-1]["role"] == "tool" for case in follow_ups)
    assert any(call is not None for call in (c.expected_call for c in follow_ups))
    values = json.dumps([call for call in expected if call], ensure_ascii=False)
    for text in ("Zürich", "São Paulo", "今日はいい天気ですね", "🎉"):
        assert text in values


def test_it_loads_the_perplexity_text(suite):
    assert 400 <= len(suite.text_for_perplexity.split()) <= 600


def test_it_takes_a_stable_category_balanced_subset(suite):
    first = suite.subset(6)
    assert [c.id for c in first.cases] == [c.id for c in suite.subset(6).cases]
    assert [c.category for c in first.cases] == list(CATEGORIES[:6])
    counts = Counter(c.category for c in suite.subset(2 * len(CATEGORIES)).cases)
    assert counts == Counter({category: 2 for category in CATEGORIES})
    assert suite.subset(None) is suite
    assert suite.subset(10_000) is suite


def test_it_refuses_a_repeated_case_id(data):
    data["cases"].append(copy.deepcopy(data["cases"][0]))
    with pytest.raises(SuiteError, match=f"case id '{data['cases'][0]['id']}' is used twice"):
        check_suite(data)


def test_it_refuses_an_expected_call_that_breaks_its_schema(data):
    case = next(c for c in data["cases"] if c["id"] == "weather-paris")
    case["expected"]["call"]["arguments"]["unit"] = "kelvin"
    with pytest.raises(
        SuiteError,
        match="case 'weather-paris': the expected arguments do not match get_weather's schema: 'kelvin' is not one of",
    ):
        check_suite(data)


def test_it_refuses_an_expected_call_to_a_tool_not_offered(data):
    case = next(c for c in data["cases"] if c["id"] == "weather-paris")
    case["tools"] = ["convert_currency", "translate_text"]
    with pytest.raises(
        SuiteError, match="expects a call to 'get_weather', which the case does not offer"
    ):
        check_suite(data)


def test_it_refuses_a_required_argument_named_optional(data):
    case = next(c for c in data["cases"] if c["id"] == "weather-paris")
    case["optional_args"] = ["city"]
    with pytest.raises(
        SuiteError, match="optional argument 'city' is required by get_weather's schema"
    ):
        check_suite(data)


def test_free_mode_prompt_is_the_grammar_mode_prompt(suite):
    """The free mode writes the tools into the system message exactly as the node does."""
    formatter = ChatFormatter(CHATML, bos_token="", eos_token="")
    for case in suite.cases:
        tools = suite.tools_for(case)
        grammar = case_request(suite, case, mode="grammar", max_tokens=8)
        free = case_request(suite, case, mode="free", max_tokens=8)
        assert "tools" not in free and "tool_choice" not in free
        node_side = formatter.render(
            grammar["messages"], ToolMode(tools=tuple(tools), choice="auto")
        )
        assert formatter.render(free["messages"]) == node_side, case.id
    block = tools_system_block(suite.tools_for(suite.cases[0]))
    assert messages_with_tools_block([{"role": "user", "content": "hi"}], [])[0]["role"] == "system"
    assert block.startswith("# Tools\n<tools>\n{")
