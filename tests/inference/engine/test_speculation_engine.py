"""Prompt-lookup drafting in the engine (real model): the same text as without it."""

from __future__ import annotations

import pytest

from inference.engine.scheduler import DRAFT_MAX_STEP_COST, Engine
from tests.inference.engine.conftest import EngineDriver, make_engine

pytestmark = pytest.mark.model

ECHO = (
    'Repeat this JSON exactly, twice: {"name": "get_weather", "arguments": '
    '{"city": "Lisbon", "unit": "celsius", "days": 5}}'
)
PROMPTS = [
    [{"role": "user", "content": ECHO}],
    [{"role": "user", "content": "Count from 1 to 40, separated by commas."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
]


@pytest.fixture(scope="module")
def engines():
    plain, drafting = make_engine(speculate="off"), make_engine(speculate="on")
    yield EngineDriver(plain), EngineDriver(drafting)
    plain.stop()
    drafting.stop()


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.9, "seed": 11}])
def test_drafting_changes_no_token(engines, params) -> None:
    plain, drafting = engines
    drafted = accepted = 0
    for messages in PROMPTS:
        runs = [d.submit(messages, max_tokens=64, **params) for d in (plain, drafting)]
        (_, without), (_, with_drafts) = (r.wait() for r in runs)
        assert with_drafts.text == without.text
        assert with_drafts.completion_tokens == without.completion_tokens
        assert without.timings["draft_tokens"] == 0
        assert with_drafts.timings["draft_accepted"] <= with_drafts.timings["draft_tokens"]
        drafted += with_drafts.timings["draft_tokens"]
        accepted += with_drafts.timings["draft_accepted"]
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    snap = drafting.engine.snapshot()
    assert snap["draft_tokens_total"] >= drafted and snap["draft_accepted_total"] >= accepted
    assert snap["drafting"] and not plain.engine.snapshot()["drafting"]


@pytest.mark.parametrize(
    ("step_cost", "repeatable", "drafts"),
    [
        (DRAFT_MAX_STEP_COST, False, True),
        (DRAFT_MAX_STEP_COST + 0.01, False, False),
        (DRAFT_MAX_STEP_COST, True, False),  # a repeatable node never drafts under auto
    ],
)
def test_auto_drafts_only_where_the_step_cost_says_drafts_pay(
    monkeypatch, step_cost: float, repeatable: bool, drafts: bool
) -> None:
    """The decision from a given step cost (what the load measures is a benchmark's figure:
    ``bench/speculation.py`` prints it), seen in the snapshot and in a request's timings."""
    monkeypatch.setattr(Engine, "_measure_draft_step_cost", lambda self: step_cost)
    engine = make_engine(speculate="auto", sequences=2, repeatable=repeatable)
    try:
        snap = engine.snapshot()
        assert snap["draft_step_cost"] == step_cost
        assert snap["drafting"] is drafts
        done = EngineDriver(engine).chat(PROMPTS[0], max_tokens=48)
        assert (done.timings["draft_tokens"] > 0) is drafts, done.timings
    finally:
        engine.stop()


def test_a_session_s_kv_after_drafting_is_exactly_its_tokens(engines) -> None:
    """Rejected drafts leave no cells behind: the next turn reuses the whole history."""
    _, drafting = engines
    first = [{"role": "user", "content": ECHO}]
    done = drafting.chat(first, session="spec-kv", max_tokens=48)
    second = [
        *first,
        {"role": "assistant", "content": done.text},
        {"role": "user", "content": "Again."},
    ]
    again = drafting.chat(second, session="spec-kv", max_tokens=8)
    turn_one = len(drafting.tokens(first))
    assert again.cached_tokens >= turn_one + done.completion_tokens - 2
