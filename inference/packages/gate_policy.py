"""A model family's gate as the database holds it: its limits (``PackagePolicy`` rows, the
defaults of ``gate.Policy`` until set) and the approved version a new evaluation is compared
with. The gate's decision itself is pure: ``inference/packages/gate.py``.

Errors (``console.lib.errors``): ``Invalid`` (a limit out of range, 422).
"""

from __future__ import annotations

from console.lib.audit import audit_record
from console.lib.errors import Invalid
from inference.models import ModelPackage, PackagePolicy
from inference.packages import gate as gates

Status = ModelPackage.Status


def policy_for(family: str) -> gates.Policy:
    """``family``'s gate limits (the defaults when none are set)."""
    row = PackagePolicy.objects.filter(family=family).first()
    if row is None:
        return gates.Policy()
    return gates.Policy(
        min_tool_accuracy=row.min_tool_accuracy,
        min_schema_valid=row.min_schema_valid,
        max_regression=row.max_regression,
        max_perplexity_increase=row.max_perplexity_increase,
    )


def approved_baseline(package: ModelPackage) -> ModelPackage | None:
    """The family's newest approved version other than ``package`` (with an evaluation)."""
    return (
        ModelPackage.objects.filter(family=package.family, status=Status.APPROVED)
        .exclude(pk=package.pk)
        .exclude(evaluation=None)
        .order_by("-created_at", "-id")
        .first()
    )


def policy_update(*, family: str, changes: dict[str, float]) -> PackagePolicy:
    """Set some limits of ``family``'s gate. Raises ``Invalid`` for a bad value."""
    from django.core.exceptions import ValidationError

    row, _ = PackagePolicy.objects.get_or_create(family=family)
    before = {k: getattr(row, k) for k in changes}
    for key, value in changes.items():
        setattr(row, key, value)
    try:
        row.full_clean()
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise Invalid(f"{field}: {messages[0]}", field=field) from exc
    row.save()
    audit_record(
        action="package.policy",
        target=family,
        changes=[f"{k}: {before[k]} \u2192 {v}" for k, v in changes.items() if before[k] != v],
    )
    return row
