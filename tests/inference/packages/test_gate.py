"""The package gate (inference/packages/gate.py): pure, on report dicts."""

from __future__ import annotations

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
