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
