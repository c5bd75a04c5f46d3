"""The package gate: does an evaluated version meet its family's policy? Pure functions.

Criteria, each with the measured value, the limit and a sentence a person can act on:

1. ``smoke``: the smoke test passed (a streamed chat with an emoji, a tool call, a second turn);
2. ``tool_accuracy``: grammar-mode tool accuracy >= ``min_tool_accuracy``;
3. ``schema_valid``: grammar-mode schema-valid share of tool calls >= ``min_schema_valid``;
4. ``regression``: tool accuracy >= the approved version's minus ``max_regression``;
5. ``perplexity``: perplexity <= the approved version's x (1 + ``max_perplexity_increase``).

4 and 5 pass, marked "no approved version to compare", when the family has none yet.

A version built to **replace** another of the same model (``replacing``: the serving type the
array chose, ``inference.packages.serving_default``) is compared with that version instead of
the approved one, and a floor of 2 or 3 that the replaced version itself does not reach is
lowered to its figure less ``max_regression``: the question is "no worse than what the nodes
serve now, within the allowed drop", and a floor the serving version fails would refuse every
replacement, the faster ones included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Policy:
    """Limits (fractions 0..1, ``max_perplexity_increase`` relative: 0.10 = +10 %)."""

    min_tool_accuracy: float = 0.5
    min_schema_valid: float = 1.0
    max_regression: float = 0.05
    max_perplexity_increase: float = 0.10


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool
    detail: str
    value: float | None = None
    limit: float | None = None


@dataclass(frozen=True)
class GateResult:
    passed: bool
    criteria: list[Criterion] = field(default_factory=list)
    baseline: str = ""  # name:version of the approved version compared against

    @property
    def failed(self) -> list[Criterion]:
        return [c for c in self.criteria if not c.passed]

    def summary(self) -> str:
        """``"passed"`` or ``"failed: tool_accuracy 0.31 < 0.50; smoke ..."``."""
        if self.passed:
            return "passed"
        return "failed: " + "; ".join(c.detail for c in self.failed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "baseline": self.baseline,
            "summary": self.summary(),
            "criteria": [asdict(c) for c in self.criteria],
        }


def gate_check(
    evaluation: dict[str, Any],
    policy: Policy,
    baseline: dict[str, Any] | None = None,
    baseline_key: str = "",
    *,
    replacing: bool = False,
) -> GateResult:
    """Apply ``policy`` to an evaluation report (``inference.packages.evaluation``'s shape) and
    the approved version's report (``baseline``, or None). A report whose smoke test failed
    fails at that criterion only: nothing else was measured. ``replacing``: ``baseline`` is
    the version this one replaces; the floors go no higher than its own figures."""
    smoke = evaluation.get("smoke") or {}
    if not smoke.get("passed"):
        error = smoke.get("error") or "the smoke test did not run"
        return GateResult(False, [Criterion("smoke", False, f"smoke test failed: {error}")])
    criteria = [Criterion("smoke", True, "smoke test passed")]
    grammar = _grammar(evaluation)
    accuracy = grammar.get("tool_accuracy")
    if replacing and baseline:
        policy = _floors_of(policy, _grammar(baseline))
    criteria.append(_at_least("tool_accuracy", accuracy, policy.min_tool_accuracy))
    criteria.append(
        _at_least("schema_valid", grammar.get("schema_valid_rate"), policy.min_schema_valid)
    )
    criteria += _against_baseline(
        evaluation, policy, baseline, accuracy, "replaced" if replacing else "approved"
    )
    return GateResult(all(c.passed for c in criteria), criteria, baseline_key if baseline else "")


def _grammar(report: dict[str, Any]) -> dict[str, Any]:
    return (report.get("modes") or {}).get("grammar") or {}


def _floors_of(policy: Policy, replaced: dict[str, Any]) -> Policy:
    """``policy`` with its floors no higher than the replaced version's own figures less the
    allowed drop."""

    def floor(limit: float, figure: float | None) -> float:
        if figure is None:
            return limit
        return min(limit, round(figure - policy.max_regression, 6))

    return replace(
        policy,
        min_tool_accuracy=floor(policy.min_tool_accuracy, replaced.get("tool_accuracy")),
        min_schema_valid=floor(policy.min_schema_valid, replaced.get("schema_valid_rate")),
    )


def _at_least(name: str, value: float | None, limit: float) -> Criterion:
    if value is None:
        return Criterion(name, False, f"{name} was not measured", None, limit)
    ok = value >= limit
    sign = ">=" if ok else "<"
    return Criterion(name, ok, f"{name} {value:.2f} {sign} {limit:.2f}", value, limit)


def _against_baseline(
    evaluation: dict[str, Any],
    policy: Policy,
    baseline: dict[str, Any] | None,
    accuracy: float | None,
    whose: str = "approved",
) -> list[Criterion]:
    if not baseline:
        note = "no approved version to compare"
        return [Criterion("regression", True, note), Criterion("perplexity", True, note)]
    base_accuracy = _grammar(baseline).get("tool_accuracy")
    out = []
    if base_accuracy is None or accuracy is None:
        out.append(Criterion("regression", True, "no tool accuracy to compare"))
    else:
        floor = base_accuracy - policy.max_regression
        ok = accuracy >= floor - 1e-9
        out.append(
            Criterion(
                "regression",
                ok,
                f"tool accuracy {accuracy:.2f} against the {whose} {base_accuracy:.2f} "
                f"({'within' if ok else 'more than'} the allowed drop of {policy.max_regression:.2f})",
                accuracy - base_accuracy,
                -policy.max_regression,
            )
        )
    ppl, base_ppl = evaluation.get("perplexity"), baseline.get("perplexity")
    if not ppl or not base_ppl:
        out.append(Criterion("perplexity", True, "no perplexity to compare"))
    else:
        rise = ppl / base_ppl - 1.0
        ok = rise <= policy.max_perplexity_increase + 1e-9
        out.append(
            Criterion(
                "perplexity",
                ok,
                f"perplexity {ppl:.2f} is {rise:+.1%} against the {whose} {base_ppl:.2f} "
                f"(at most {policy.max_perplexity_increase:+.0%})",
                rise,
                policy.max_perplexity_increase,
            )
        )
    return out
