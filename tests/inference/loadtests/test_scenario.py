"""Scenarios: parsing, the errors a user reads, YAML round trip, the seeded plan."""

from __future__ import annotations

import pytest

from inference.loadtests.plan import plan_sessions
from inference.loadtests.scenario import (
    BUILTIN,
    BadScenario,
    Range,
    parse_scenario,
    scenario_from_yaml,
    scenario_to_yaml,
)


def test_it_reads_an_agent_sessions_scenario_with_its_defaults():
    s = parse_scenario({"name": "a", "kind": "agent_sessions", "steps": [1, 2], "turns": 6})
    assert s.steps == (1, 2) and s.conversation == "agent" and s.turns == Range(6, 6)
    assert s.tool_call_fraction == 0.5 and s.target_p95_s == 0.3 and not s.timed


def test_it_reads_a_steady_scenario_as_one_step():
    s = parse_scenario({"name": "s", "kind": "steady", "concurrency": 3, "hold_s": 20})
    assert s.steps == (3,) and s.timed and s.conversation == "chat"


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"kind": "ramp", "steps": [1]}, "name", "give the scenario a name"),
        ({"name": "x", "kind": "burst", "steps": [1]}, "kind", "ramp, steady, agent_sessions"),
        ({"name": "x", "steps": [1, 0]}, "steps[1]", "between 1 and 1024"),
        ({"name": "x", "steps": []}, "steps", "a list of concurrency levels"),
        ({"name": "x", "kind": "steady"}, "concurrency", "number of concurrent sessions"),
        ({"name": "x", "steps": [1], "max_s": 7200}, "max_s", "between 1 and 3600"),
        ({"name": "x", "steps": [1], "turns": {"min": 5, "max": 2}}, "turns", "above max"),
        ({"name": "x", "steps": [1], "turns": 2.5}, "turns", "whole number"),
        ({"name": "x", "steps": [1], "tool_call_fraction": 0.5}, "tool_call_fraction", "agent"),
        ({"name": "x", "steps": [1], "speed": 3}, "speed", "unknown field"),
        ({"name": "x", "steps": [True]}, "steps[0]", "must be a number"),
        ({"name": "bad name!", "steps": [1]}, "name", "letters, digits"),
    ],
)
def test_it_names_the_wrong_field(spec, field, words):
    with pytest.raises(BadScenario) as caught:
        parse_scenario(spec)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_it_round_trips_through_yaml():
    for spec in BUILTIN.values():
        scenario = parse_scenario(spec)
        assert scenario_from_yaml(scenario_to_yaml(scenario)) == scenario


def test_it_says_where_yaml_is_broken():
    with pytest.raises(BadScenario) as caught:
        scenario_from_yaml("name: x\nsteps: [1, 2\n")
    assert caught.value.field == "yaml" and "line" in str(caught.value)


def test_it_plans_the_same_sessions_every_time():
    s = parse_scenario(
        {
            "name": "a",
            "kind": "agent_sessions",
            "steps": [4],
            "turns": {"min": 2, "max": 6},
            "think_time_s": {"min": 0.1, "max": 1},
        }
    )
    first = plan_sessions(s, run_tag="r", step=0, count=4)
    assert first == plan_sessions(s, run_tag="r", step=0, count=4)
    assert all(2 <= len(p.turns) <= 6 for p in first)
    assert first[0].session_id == "lt-r-s0-0" and first[0].turns[0].think_s == 0.0
    assert all(0.1 <= t.think_s <= 1 for p in first for t in p.turns[1:])


def test_it_requires_tool_calls_on_about_the_asked_fraction_of_turns():
    s = parse_scenario(
        {
            "name": "a",
            "kind": "agent_sessions",
            "steps": [50],
            "turns": 8,
            "tool_call_fraction": 0.25,
        }
    )
    turns = [t for p in plan_sessions(s, run_tag="r", step=0, count=50) for t in p.turns]
    share = sum(t.tool_required for t in turns) / len(turns)
    assert 0.18 < share < 0.32


def test_the_builtin_scenarios_are_bounded():
    for name in ("ramp-quick", "agent-sessions-quick"):
        assert parse_scenario(BUILTIN[name]).max_s <= 180
    assert parse_scenario(BUILTIN["agent-sessions"]).steps == (1, 2, 4, 8, 16, 32)
    assert parse_scenario(BUILTIN["agent-sessions"]).max_s <= 600


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: x\nsteps: [1]\nmax_tokens: .inf\n", "max_tokens"),
        ("name: x\nsteps: [.nan]\n", "steps[0]"),
        ("name: x\nsteps: [1]\n1: x\nzzz: y\n", "1"),
        ("name: x\nsteps: [4, 2]\n", "steps"),
        ("name: ..\nsteps: [1]\n", "name"),
        ("- a list\n", "scenario"),
    ],
)
def test_it_refuses_yaml_that_is_not_a_scenario_with_a_message(text, field):
    with pytest.raises(BadScenario) as caught:
        scenario_from_yaml(text)
    assert caught.value.field == field


def test_it_keeps_error_messages_short_whatever_the_yaml_expands_to():
    a = "&a [" + ", ".join(["xxxxxxxx"] * 10) + "]"
    b = "&b [" + ", ".join(["*a"] * 10) + "]"
    c = "&c [" + ", ".join(["*b"] * 10) + "]"
    d = "[" + ", ".join(["*c"] * 10) + "]"
    with pytest.raises(BadScenario) as caught:
        scenario_from_yaml(f"name: x\nsteps: [1]\nkind: [{a}, {b}, {c}, {d}]\n")
    assert caught.value.field == "kind"
    assert len(str(caught.value)) < 200


def test_session_lengths_are_drawn_uniformly():
    s = parse_scenario(
        {"name": "a", "kind": "agent_sessions", "steps": [400], "turns": {"min": 2, "max": 4}}
    )
    lengths = [len(p.turns) for p in plan_sessions(s, run_tag="r", step=0, count=400)]
    shares = [lengths.count(n) / 400 for n in (2, 3, 4)]
    assert all(0.25 < share < 0.42 for share in shares), shares


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: d\nsteps: [1]\nturns: " + "[" * 3000 + "]" * 3000, "nested more than 8 levels"),
        (
            "name: d\nsteps: [1]\nx: " + "{a: " * 3000 + "1" + "}" * 3000,
            "nested more than 8 levels",
        ),
        ("# padding\n" * 7000, "at most 64,000 characters"),
    ],
    ids=["deep-list", "deep-map", "long"],
)
def test_it_refuses_unbounded_yaml_naming_the_field(text, words):
    with pytest.raises(BadScenario) as caught:
        scenario_from_yaml(text)
    assert caught.value.field == "yaml" and words in str(caught.value)


# --- every field's error, as a user reads it in a 422 ------------------------------------------

RAMP = {"name": "x", "steps": [1]}
KNOWN = (
    "concurrency, conversation, description, hold_s, kind, max_requests, max_s, max_tokens, "
    "model, name, seed, steps, target_p95_s, think_time_s, tool_call_fraction, "
    "tool_max_tokens, turns"
)
NAME_RULE = "1 to 64 letters, digits, '-', '_' or '.' (not first)"


def refusal(spec):
    """``(field, message)`` of the ``BadScenario`` that ``spec`` raises."""
    with pytest.raises(BadScenario) as caught:
        parse_scenario(spec)
    return caught.value.field, str(caught.value)


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"hold_s": 0.5}, "hold_s", "must be between 1 and 3600, not 0.5"),
        ({"hold_s": 3600.5}, "hold_s", "must be between 1 and 3600, not 3600.5"),
        ({"turns": 0}, "turns", "must be between 1 and 64, not 0"),
        ({"turns": 65}, "turns", "must be between 1 and 64, not 65"),
        ({"think_time_s": -0.1}, "think_time_s", "must be between 0 and 600, not -0.1"),
        ({"think_time_s": 601}, "think_time_s", "must be between 0 and 600, not 601"),
        ({"max_tokens": 0}, "max_tokens", "must be between 1 and 1024, not 0"),
        ({"max_tokens": 1025}, "max_tokens", "must be between 1 and 1024, not 1025"),
        ({"tool_max_tokens": 15}, "tool_max_tokens", "must be between 16 and 1024, not 15"),
        ({"tool_max_tokens": 1025}, "tool_max_tokens", "must be between 16 and 1024, not 1025"),
        ({"target_p95_s": 0.0009}, "target_p95_s", "must be between 0.001 and 600, not 0.0009"),
        ({"target_p95_s": 600.5}, "target_p95_s", "must be between 0.001 and 600, not 600.5"),
        ({"max_s": 0.5}, "max_s", "must be between 1 and 3600, not 0.5"),
        ({"max_s": 3601}, "max_s", "must be between 1 and 3600, not 3601"),
        ({"max_requests": 0}, "max_requests", "must be between 1 and 100000, not 0"),
        ({"max_requests": 100_001}, "max_requests", "must be between 1 and 100000, not 100001"),
        ({"seed": -1}, "seed", "must be between 0 and 2.14748e+09, not -1"),
        ({"seed": 2**31 + 1}, "seed", "must be between 0 and 2.14748e+09, not 2147483649"),
        ({"steps": [1, 1025]}, "steps[1]", "must be between 1 and 1024, not 1025"),
        ({"steps": [0]}, "steps[0]", "must be between 1 and 1024, not 0"),
    ],
)
def test_it_tells_the_range_of_each_number_it_refuses(extra, field, message):
    assert refusal({**RAMP, **extra}) == (field, f"{field}: {message}")


@pytest.mark.parametrize(
    "extra",
    [
        {"hold_s": 1, "max_s": 1, "max_requests": 1, "seed": 0},
        {"hold_s": 3600, "max_s": 3600, "max_requests": 100_000, "seed": 2**31},
        {"turns": 1, "think_time_s": 0, "max_tokens": 1, "tool_max_tokens": 16},
        {"turns": 64, "think_time_s": 600, "max_tokens": 1024, "tool_max_tokens": 1024},
        {"target_p95_s": 0.001, "steps": [1024]},
        {"target_p95_s": 600, "steps": list(range(1, 33))},
        {"conversation": "agent", "tool_call_fraction": 0.0},
        {"conversation": "agent", "tool_call_fraction": 1},
        {"model": "m" * 128, "description": "d" * 500, "name": "n" * 64},
    ],
)
def test_it_accepts_each_limit_itself(extra):
    spec = {**RAMP, **extra}
    got = parse_scenario(spec).as_spec()
    assert {k: got.get(k) for k in extra} == {
        k: v if k != "steps" else list(v) for k, v in extra.items()
    }


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"hold_s": "30"}, "hold_s", "must be a number, not '30'"),
        ({"hold_s": True}, "hold_s", "must be a number, not True"),
        ({"max_s": None}, "max_s", "must be a number, not None"),
        ({"max_s": float("inf")}, "max_s", "must be a finite number, not inf"),
        ({"target_p95_s": float("nan")}, "target_p95_s", "must be a finite number, not nan"),
        ({"turns": 2.5}, "turns", "must be a whole number, not 2.5"),
        ({"max_tokens": 2.5}, "max_tokens", "must be a whole number, not 2.5"),
        ({"tool_max_tokens": 20.5}, "tool_max_tokens", "must be a whole number, not 20.5"),
        ({"max_requests": 2.5}, "max_requests", "must be a whole number, not 2.5"),
        ({"seed": 2.5}, "seed", "must be a whole number, not 2.5"),
        ({"steps": [1, 2.5]}, "steps[1]", "must be a whole number, not 2.5"),
        ({"steps": [1, [2]]}, "steps[1]", "must be a number, not a list"),
        ({"tool_call_fraction": 1.5}, "tool_call_fraction", "must be between 0 and 1, not 1.5"),
        ({"model": 5}, "model", "must be text"),
        ({"model": "m" * 129}, "model", "at most 128 characters"),
        ({"description": ["d"]}, "description", "must be text"),
        ({"description": "d" * 501}, "description", "at most 500 characters"),
    ],
)
def test_it_says_what_kind_of_value_a_field_takes(extra, field, message):
    assert refusal({**RAMP, **extra}) == (field, f"{field}: {message}")


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ([RAMP], "scenario", "must be a mapping of fields"),
        ({**RAMP, "zeta": 1, "alpha": 2}, "alpha", f"unknown field (known: {KNOWN})"),
        ({**RAMP, "Xtra": 1}, "Xtra", f"unknown field (known: {KNOWN})"),
        ({**RAMP, "u" * 70: 1}, "u" * 58 + "…", f"unknown field (known: {KNOWN})"),
        ({"steps": [1]}, "name", "give the scenario a name"),
        ({**RAMP, "name": 7}, "name", "give the scenario a name"),
        ({**RAMP, "name": "   "}, "name", "give the scenario a name"),
        ({**RAMP, "name": "n" * 65}, "name", NAME_RULE),
        ({**RAMP, "name": ".hidden"}, "name", NAME_RULE),
        ({**RAMP, "name": "two words"}, "name", NAME_RULE),
        ({**RAMP, "name": "café"}, "name", NAME_RULE),
        (
            {**RAMP, "kind": "burst"},
            "kind",
            "must be one of ramp, steady, agent_sessions, not 'burst'",
        ),
        ({**RAMP, "kind": None}, "kind", "must be one of ramp, steady, agent_sessions, not None"),
        (
            {**RAMP, "kind": {"a": 1}},
            "kind",
            "must be one of ramp, steady, agent_sessions, not a dict",
        ),
        ({**RAMP, "conversation": "voice"}, "conversation", "must be chat or agent, not 'voice'"),
        (
            {**RAMP, "tool_call_fraction": 0.1},
            "tool_call_fraction",
            "needs conversation: agent (chat has no tools)",
        ),
    ],
)
def test_it_names_the_field_and_the_rule_it_broke(spec, field, message):
    assert refusal(spec) == (field, f"{field}: {message}")


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            {"name": "x", "kind": "steady", "steps": [1], "concurrency": 2},
            "steps",
            "a steady scenario has one concurrency: give concurrency",
        ),
        ({"name": "x", "kind": "steady"}, "concurrency", "give the number of concurrent sessions"),
        (
            {"name": "x", "kind": "steady", "concurrency": None},
            "concurrency",
            "must be a number, not None",
        ),
        (
            {"name": "x", "kind": "steady", "concurrency": 1025},
            "concurrency",
            "must be between 1 and 1024, not 1025",
        ),
        (
            {"name": "x", "kind": "steady", "concurrency": 1.5},
            "concurrency",
            "must be a whole number, not 1.5",
        ),
        ({**RAMP, "concurrency": 2}, "concurrency", "a ramp scenario takes steps: [1, 2, 4, ...]"),
        (
            {"name": "x", "kind": "agent_sessions", "concurrency": 2},
            "concurrency",
            "a agent_sessions scenario takes steps: [1, 2, 4, ...]",
        ),
        ({"name": "x"}, "steps", "a list of concurrency levels, e.g. [1, 2, 4, 8]"),
        ({"name": "x", "steps": 4}, "steps", "a list of concurrency levels, e.g. [1, 2, 4, 8]"),
        ({"name": "x", "steps": list(range(1, 34))}, "steps", "at most 32 steps"),
        (
            {"name": "x", "steps": [1, 2, 2]},
            "steps",
            "concurrency must rise from step to step, e.g. [1, 2, 4, 8]",
        ),
    ],
)
def test_it_says_how_a_kind_takes_its_concurrency(spec, field, message):
    assert refusal(spec) == (field, f"{field}: {message}")


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ({"min": 2}, "turns", "a number or {min: a, max: b}"),
        ({"max": 2}, "turns", "a number or {min: a, max: b}"),
        ({"min": 2, "max": 3, "mean": 2}, "turns", "a number or {min: a, max: b}"),
        ({"min": 0, "max": 3}, "turns.min", "must be between 1 and 64, not 0"),
        ({"min": 1, "max": 65}, "turns.max", "must be between 1 and 64, not 65"),
        ({"min": 1.5, "max": 3}, "turns.min", "must be a whole number, not 1.5"),
        ({"min": 1, "max": 3.5}, "turns.max", "must be a whole number, not 3.5"),
        ({"min": 5, "max": 2}, "turns", "min 5 is above max 2"),
    ],
)
def test_it_names_the_end_of_a_range_that_is_wrong(value, field, message):
    assert refusal({**RAMP, "turns": value}) == (field, f"{field}: {message}")


def test_it_reads_ranges_of_equal_ends_and_of_fractional_think_times():
    s = parse_scenario(
        {**RAMP, "turns": {"min": 3, "max": 3}, "think_time_s": {"min": 0.25, "max": 1.5}}
    )
    assert s.turns == Range(3, 3) and s.think_time_s == Range(0.25, 1.5)
    assert s.as_spec()["turns"] == 3
    assert s.as_spec()["think_time_s"] == {"min": 0.25, "max": 1.5}
    assert parse_scenario({**RAMP, "think_time_s": 0.5, "hold_s": 1.5}).hold_s == 1.5


@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        ("k" * 58, repr("k" * 58)),
        ("k" * 59, "'" + "k" * 58 + "…"),
        (3, "3"),
        (1.5, "1.5"),
        (True, "True"),
        (["a"], "a list"),
    ],
)
def test_it_quotes_a_wrong_value_whole_up_to_sixty_characters(kind, shown):
    field, message = refusal({**RAMP, "kind": kind})
    assert message == f"kind: must be one of ramp, steady, agent_sessions, not {shown}"


def test_it_fills_every_default_of_a_ramp():
    assert parse_scenario({"name": " x ", "steps": [1]}).as_spec() == {
        "name": "x",
        "kind": "ramp",
        "steps": [1],
        "hold_s": 30.0,
        "conversation": "chat",
        "turns": 4,
        "think_time_s": 0.0,
        "tool_call_fraction": 0.0,
        "max_tokens": 32,
        "tool_max_tokens": 96,
        "target_p95_s": 0.3,
        "max_s": 600.0,
        "max_requests": 10_000,
        "seed": 1,
    }


def test_it_gives_agent_conversations_tools_by_default_and_no_hold_to_session_steps():
    spec = parse_scenario({"name": "a", "kind": "agent_sessions", "steps": [1, 2]}).as_spec()
    assert "hold_s" not in spec and "model" not in spec and "description" not in spec
    assert (spec["conversation"], spec["tool_call_fraction"]) == ("agent", 0.5)
    ramp = parse_scenario({**RAMP, "conversation": "agent"})
    assert (ramp.kind, ramp.conversation, ramp.tool_call_fraction) == ("ramp", "agent", 0.5)
    assert parse_scenario({**RAMP, "tool_call_fraction": 0}).tool_call_fraction == 0.0


def test_it_writes_a_steady_scenario_as_yaml_in_the_order_an_operator_reads_it():
    s = parse_scenario(
        {
            "name": "x",
            "kind": "steady",
            "concurrency": 2,
            "model": " m ",
            "description": " d ",
            "turns": {"min": 2, "max": 5},
        }
    )
    assert (s.model, s.description, s.steps) == ("m", "d", (2,))
    assert scenario_to_yaml(s) == (
        "name: x\nkind: steady\ndescription: d\nconcurrency: 2\nhold_s: 30.0\n"
        "conversation: chat\nturns:\n  min: 2\n  max: 5\nthink_time_s: 0.0\n"
        "tool_call_fraction: 0.0\nmax_tokens: 32\ntool_max_tokens: 96\ntarget_p95_s: 0.3\n"
        "max_s: 600.0\nmax_requests: 10000\nseed: 1\nmodel: m\n"
    )


def test_a_range_draws_between_its_ends_and_a_fixed_one_draws_nothing():
    import random

    rng = random.Random(7)
    assert Range(3, 3).draw(rng) == 3
    assert rng.random() == random.Random(7).random()  # the fixed range took no draw
    assert Range(1, 2).draw(random.Random(7)) == random.Random(7).uniform(1, 2)
    assert Range(1, 2).as_spec() == {"min": 1, "max": 2} and Range(0.5, 0.5).as_spec() == 0.5
    assert Range(1, 4).mean == 2.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (5, "yaml: must be text"),
        (
            "name: x\nsteps: [1, 2\n",
            "yaml: not valid YAML at line 3: expected ',' or ']', but got '<stream end>'",
        ),
        ("a: b: c", "yaml: not valid YAML at line 1: mapping values are not allowed here"),
        (
            "a: \x00",
            "yaml: not valid YAML: unacceptable character #x0000: special characters are not "
            'allowed\n  in "<unicode string>", position 3',
        ),
        ("#" * 64_001, "yaml: at most 64,000 characters, not 64,001"),
        ("#" * 64_000, "scenario: must be a mapping of fields"),
        (
            "name: d\nsteps: [1]\nturns: " + "[" * 7 + "1" + "]" * 7,
            "turns: must be a number, not a list",
        ),
        (
            "name: d\nsteps: [1]\nturns: " + "[" * 8 + "1" + "]" * 8,
            "yaml: nested more than 8 levels deep (at line 3)",
        ),
        (
            "name: d\nsteps: [1]\nturns: [[1], " + "[" * 7 + "1" + "]" * 7 + "]",
            "yaml: nested more than 8 levels deep (at line 3)",
        ),
        (
            "name: d\nsteps: [1]\n" + "".join(f"a{i}: []\n" for i in range(9)),
            f"a0: unknown field (known: {KNOWN})",
        ),
    ],
    ids=[
        "not-text",
        "unclosed",
        "mapping",
        "nul",
        "long",
        "at-limit",
        "deep-8",
        "deep-9",
        "deep-9-after-a-sibling",
        "siblings",
    ],
)
def test_it_quotes_the_yaml_problem_and_its_line(text, message):
    with pytest.raises(BadScenario) as caught:
        scenario_from_yaml(text)
    assert str(caught.value) == message
