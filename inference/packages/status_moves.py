"""A package version's status moves: the one write of ``ModelPackage.status``, allowed only
along ``ModelPackage.STATUS_MOVES`` and audited (``console.lib.audit``), and the way back from
``evaluating`` when an evaluation ends without a verdict.

Errors (``console.lib.errors``): ``Conflict`` (a move that is not allowed, 409).
"""

from __future__ import annotations

from console.lib.audit import audit_record
from console.lib.errors import Conflict
from inference.models import ModelPackage

Status = ModelPackage.Status


def status_move(package: ModelPackage, to: str, reason: str = "") -> ModelPackage:
    """Move ``package`` to status ``to`` with ``reason``, saved and audited. Raises
    ``Conflict`` (``package_status``) when its status may not become ``to``."""
    if to not in ModelPackage.STATUS_MOVES[package.status]:
        raise Conflict(
            f"{package.key} is {package.status}; it cannot become {to}.", code="package_status"
        )
    before = package.status
    package.status = to
    package.status_reason = reason
    package.save(update_fields=["status", "status_reason"])
    audit_record(
        action=f"package.{to}",
        target=package.key,
        changes=[f"status: {before} \u2192 {to}"] + ([f"reason: {reason}"] if reason else []),
    )
    return package


def package_evaluation_ended(*, package_id: int, status_before: str, why: str) -> None:
    """An evaluation stopped without a verdict (failed, cancelled, partial): the version goes
    back to ``status_before`` (draft or rejected), audited, unless someone moved it
    meanwhile."""
    package = ModelPackage.objects.filter(pk=package_id).first()
    if package is None or package.status != Status.EVALUATING:
        return
    back = status_before if status_before in (Status.DRAFT, Status.REJECTED) else Status.DRAFT
    status_move(package, back, why)
