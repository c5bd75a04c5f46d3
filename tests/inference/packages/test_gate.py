"""The package gate (inference/packages/gate.py): pure, on report dicts."""

from __future__ import annotations

import pytest

from inference.packages.gate import Policy, gate_check


def report(accuracy=0.8, schema=1.0, perplexity=20.0, smoke=True, error=""):
    return {
        "smoke": {"passed": smoke, "error": error, "steps": []},
        "modes": {"grammar": {"tool_accuracy": accuracy, "schema_valid_rate": schema}},
        "perplexity": perplexity,
    }


def test_it_passes_a_version_meeting_every_limit_with_no_baseline():
    result = gate_check(report(), Policy(min_tool_accuracy=0.5))
    assert result.passed and result.summary() == "passed"
    assert {c.name for c in result.criteria} == {
        "smoke",
        "tool_accuracy",
        "schema_valid",
        "regression",
        "perplexity",
    }


def test_a_failed_smoke_test_fails_at_that_criterion_with_its_error():
    result = gate_check(report(smoke=False, error="chat template does not load: x"), Policy())
    assert not result.passed
    assert result.summary() == "failed: smoke test failed: chat template does not load: x"


def test_it_names_each_failed_limit_with_the_value():
    result = gate_check(report(accuracy=0.31, schema=0.9), Policy(min_tool_accuracy=0.5))
    assert [c.name for c in result.failed] == ["tool_accuracy", "schema_valid"]
    assert "tool_accuracy 0.31 < 0.50" in result.summary()


def test_it_compares_against_the_approved_version():
    base = report(accuracy=0.8, perplexity=20.0)
    ok = gate_check(
        report(accuracy=0.76, perplexity=21.9), Policy(min_tool_accuracy=0.5), base, "m:1"
    )
    assert ok.passed and ok.baseline == "m:1"
    worse = gate_check(
        report(accuracy=0.7, perplexity=23.0), Policy(min_tool_accuracy=0.5), base, "m:1"
    )
    assert [c.name for c in worse.failed] == ["regression", "perplexity"]
    assert "+15.0%" in worse.summary() and "0.70 against the approved 0.80" in worse.summary()


def test_the_whole_result_of_a_pass_with_no_baseline():
    result = gate_check(report(accuracy=0.5, schema=1.0), Policy(min_tool_accuracy=0.5))
    assert result.as_dict() == {
        "passed": True,
        "baseline": "",
        "summary": "passed",
        "criteria": [
            {
                "name": "smoke",
                "passed": True,
                "detail": "smoke test passed",
                "value": None,
                "limit": None,
            },
            {
                "name": "tool_accuracy",
                "passed": True,
                "detail": "tool_accuracy 0.50 >= 0.50",
                "value": 0.5,
                "limit": 0.5,
            },
            {
                "name": "schema_valid",
                "passed": True,
                "detail": "schema_valid 1.00 >= 1.00",
                "value": 1.0,
                "limit": 1.0,
            },
            {
                "name": "regression",
                "passed": True,
                "detail": "no approved version to compare",
                "value": None,
                "limit": None,
            },
            {
                "name": "perplexity",
                "passed": True,
                "detail": "no approved version to compare",
                "value": None,
                "limit": None,
            },
        ],
    }


def test_a_failed_smoke_test_is_the_only_criterion_and_says_when_it_did_not_run():
    result = gate_check({"smoke": {"passed": False}}, Policy(), report(), "m:1")
    assert result.as_dict() == {
        "passed": False,
        "baseline": "",
        "summary": "failed: smoke test failed: the smoke test did not run",
        "criteria": [
            {
                "name": "smoke",
                "passed": False,
                "detail": "smoke test failed: the smoke test did not run",
                "value": None,
                "limit": None,
            }
        ],
    }
    assert not gate_check({}, Policy()).passed


def test_figures_that_were_not_measured_fail_their_limit():
    result = gate_check(
        {"smoke": {"passed": True}}, Policy(min_tool_accuracy=0.4, min_schema_valid=0.9)
    )
    by_name = {c.name: c for c in result.criteria}
    assert by_name["tool_accuracy"].detail == "tool_accuracy was not measured"
    assert by_name["tool_accuracy"].limit == 0.4 and by_name["tool_accuracy"].value is None
    assert by_name["schema_valid"].detail == "schema_valid was not measured"
    assert by_name["schema_valid"].limit == 0.9
    assert (
        result.summary() == "failed: tool_accuracy was not measured; schema_valid was not measured"
    )


def test_just_under_a_limit_fails_and_names_both_figures():
    result = gate_check(report(accuracy=0.49, schema=0.99), Policy(min_tool_accuracy=0.5))
    tool, schema = result.failed
    assert (tool.detail, tool.value, tool.limit) == ("tool_accuracy 0.49 < 0.50", 0.49, 0.5)
    assert (schema.detail, schema.value, schema.limit) == ("schema_valid 0.99 < 1.00", 0.99, 1.0)


def test_the_regression_and_perplexity_limits_hold_at_their_edges():
    policy = Policy(min_tool_accuracy=0.1, max_regression=0.05, max_perplexity_increase=0.10)
    base = report(accuracy=0.8, perplexity=20.0)
    edge = gate_check(report(accuracy=0.75, perplexity=22.0), policy, base, "m:1")
    assert edge.passed, edge.summary()
    regression, perplexity = edge.criteria[3], edge.criteria[4]
    assert regression.detail == (
        "tool accuracy 0.75 against the approved 0.80 (within the allowed drop of 0.05)"
    )
    assert regression.value == pytest.approx(-0.05) and regression.limit == -0.05
    assert (
        perplexity.detail == "perplexity 22.00 is +10.0% against the approved 20.00 (at most +10%)"
    )
    assert perplexity.value == pytest.approx(0.10) and perplexity.limit == 0.10
    past = gate_check(report(accuracy=0.7499, perplexity=22.01), policy, base, "m:1")
    assert [c.name for c in past.failed] == ["regression", "perplexity"]
    assert past.criteria[3].detail.endswith("(more than the allowed drop of 0.05)")
    better = gate_check(report(accuracy=0.9, perplexity=15.0), policy, base, "m:1")
    assert better.passed and better.criteria[4].detail.startswith("perplexity 15.00 is -25.0%")


def test_a_baseline_without_figures_compares_nothing():
    policy = Policy(min_tool_accuracy=0.1)
    bare = {"smoke": {"passed": True}, "modes": {"grammar": {}}, "perplexity": None}
    result = gate_check(report(accuracy=0.2, perplexity=50.0), policy, bare, "m:1")
    assert result.passed and result.baseline == "m:1"
    assert [c.detail for c in result.criteria[3:]] == [
        "no tool accuracy to compare",
        "no perplexity to compare",
    ]
    no_ppl = gate_check(report(accuracy=0.2, perplexity=0), policy, report(), "m:1")
    assert no_ppl.criteria[4].detail == "no perplexity to compare"


def test_the_summary_joins_every_failure_in_order():
    result = gate_check(
        report(accuracy=0.2, schema=0.5, perplexity=40.0),
        Policy(min_tool_accuracy=0.5),
        report(accuracy=0.9, perplexity=20.0),
        "m:3",
    )
    assert result.summary() == (
        "failed: tool_accuracy 0.20 < 0.50; schema_valid 0.50 < 1.00; tool accuracy 0.20 "
        "against the approved 0.90 (more than the allowed drop of 0.05); perplexity 40.00 is "
        "+100.0% against the approved 20.00 (at most +10%)"
    )
    assert result.as_dict()["baseline"] == "m:3" and result.as_dict()["passed"] is False


def test_a_replacement_is_held_to_the_replaced_version_not_to_a_floor_it_fails_itself():
    """The serving type's gate: the bundled version scores below the family's floor; a faster
    type of the same model passes when no worse than it (within the allowed drop)."""
    policy = Policy(min_tool_accuracy=0.5, min_schema_valid=1.0, max_regression=0.05)
    serving = report(accuracy=0.25, schema=0.9, perplexity=30.0)
    close = report(accuracy=0.21, schema=0.86, perplexity=31.0)
    result = gate_check(close, policy, serving, "m-q4_1:1", replacing=True)
    assert result.passed, result.summary()
    assert result.criteria[1].limit == 0.2 and result.criteria[2].limit == 0.85
    # without `replacing` the same figures fail the family's floors
    assert [c.name for c in gate_check(close, policy, serving, "m-q4_1:1").failed] == [
        "tool_accuracy",
        "schema_valid",
    ]
    worse = report(accuracy=0.19, schema=0.84, perplexity=31.0)
    failed = gate_check(worse, policy, serving, "m-q4_1:1", replacing=True).failed
    assert [c.name for c in failed] == ["tool_accuracy", "schema_valid", "regression"]
    # a floor the replaced version meets stays where the policy puts it
    strong = report(accuracy=0.8, schema=1.0, perplexity=20.0)
    held = gate_check(report(accuracy=0.45, schema=1.0), policy, strong, "m:1", replacing=True)
    assert held.criteria[1].limit == 0.5 and not held.passed
