"""The Upgrades pages: history and a start form (``/upgrades/``), one upgrade with its node
timeline, traffic split, gates and event log (``/upgrades/<id>/``, kept live by
``static/console/upgrades.js`` from ``/api/upgrades/<id>``), and the operator's actions."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import UpgradeForm
from console.lib import access
from console.lib.access import role_required
from console.lib.errors import ConsoleError, NotFound
from console.models import Role
from console.views import _form_error, _render
from inference.models import ModelPackage, Upgrade
from inference.upgrades import services
from inference.upgrades.api import override_reason, upgrade_out

STATE_COLOURS = {
    "pending": "grey",
    "running": "blue",
    "paused": "orange",
    "rolling_back": "orange",
    "succeeded": "green",
    "rolled_back": "red",
    "failed": "red",
}
ACTIONS = {
    "pause": lambda pk: services.upgrade_pause(upgrade_id=pk),
    "resume": lambda pk: services.upgrade_resume(upgrade_id=pk),
    "promote": lambda pk: services.upgrade_promote(upgrade_id=pk),
    "abort": lambda pk: services.upgrade_abort(upgrade_id=pk, reason="from the Upgrades page"),
}


@role_required(Role.VIEWER)
def upgrades(request: HttpRequest) -> HttpResponse:
    """History of upgrades, newest first, and (operators) the form that starts one."""
    form = UpgradeForm(request.POST or None, prefix="upgrade")
    status = 200
    if request.method == "POST":
        access.require(request.principal, Role.OPERATOR)  # type: ignore[attr-defined]
        status = 400
        if form.is_valid():
            try:
                upgrade = services.upgrade_start(**form.changes())
            except ConsoleError as exc:
                _form_error(request, form, _at_form_field(exc))
                status = exc.status
            else:
                messages.success(
                    request, f"Upgrade {upgrade.pk} planned; the control loop runs it."
                )
                return redirect("console:upgrade", upgrade_id=upgrade.pk)
    rows = Upgrade.objects.select_related("from_package", "to_package")[:100]
    return _render(
        request,
        "console/upgrades.html",
        {
            "page": "upgrades",
            "upgrades": rows,
            "form": form,
            "colours": STATE_COLOURS,
            "unapproved": unapproved_versions(),
        },
        status=status,
    )


def unapproved_versions(limit: int = 50) -> list[dict[str, Any]]:
    """Versions an upgrade cannot roll out yet (draft, evaluating, rejected; not
    completion-only), newest first, each ``{"package", "status", "verdict"}`` with its gate's
    verdict in words, for the start form's "not approved yet" list (each links to its
    package page, where an admin approves it, with a reason when its gate has not passed)."""
    Status = ModelPackage.Status
    rows = ModelPackage.objects.filter(
        status__in=(Status.DRAFT, Status.EVALUATING, Status.REJECTED)
    ).exclude(template_source=ModelPackage.TemplateSource.NONE)
    return [
        {"package": p, "status": p.get_status_display(), "verdict": gate_verdict(p.gate)}
        for p in rows.order_by("-created_at")[:limit]
    ]


def gate_verdict(gate: dict[str, Any] | None) -> str:
    """A package gate's verdict in words: "not evaluated", "passed", or its summary ("failed:
    tool_accuracy 0.31 < 0.50"), marked when the evaluation was partial."""
    if not gate:
        return "not evaluated"
    summary = gate.get("summary") or ("passed" if gate.get("passed") else "failed")
    return summary if gate.get("complete", True) else f"{summary} (partial evaluation)"


def _at_form_field(exc: ConsoleError) -> ConsoleError:
    """The service's error with its ``field`` as the form names it (``settings.bake_s`` and
    ``node_settings.threads`` are the form's ``bake_s`` and ``threads``)."""
    if exc.field:
        exc.field = exc.field.removeprefix("settings.").removeprefix("node_settings.")
    return exc


@role_required(Role.VIEWER)
def upgrade(request: HttpRequest, upgrade_id: int) -> HttpResponse:
    """One upgrade: plan and node timeline, traffic split (plotly), gates, event log."""
    try:
        row = services.upgrade_get(upgrade_id)
    except ConsoleError as exc:
        raise Http404(exc.message) from exc
    return _render(
        request,
        "console/upgrade.html",
        {"page": "upgrades", **upgrade_detail(row), "colours": STATE_COLOURS},
    )


def upgrade_detail(row: Upgrade) -> dict[str, Any]:
    """What the page shows: the upgrade as the API gives it, its events and samples."""
    return {
        "upgrade": row,
        "override": override_reason(row.to_package),
        "to_gate": gate_verdict(row.to_package.gate),
        "data": upgrade_out(row),
        "events": list(
            reversed(
                row.events.order_by("-at", "-id").values("at", "node_id", "kind", "message")[:2000]
            )
        ),
        "samples": [
            {
                "at": s.at.isoformat(),
                "old_sessions": s.old_sessions,
                "new_sessions": s.new_sessions,
                "new_share": s.new_share,
            }
            for s in reversed(row.samples.order_by("-at", "-id")[:3600])
        ],
    }


@require_POST
@role_required(Role.OPERATOR)
def upgrade_action(request: HttpRequest, upgrade_id: int, action: str) -> HttpResponse:
    """``POST /upgrades/<id>/<pause|resume|promote|abort>/``, then back to the upgrade's page
    with what happened; 404 for an unknown upgrade or action, a refusal (the upgrade's state
    does not allow it) as the page's error message."""
    act = ACTIONS.get(action)
    if act is None:
        raise Http404(f"No action {action!r} (one of {', '.join(ACTIONS)}).")
    try:
        act(upgrade_id)
        messages.success(request, f"Upgrade {upgrade_id}: {action} done.")
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except ConsoleError as exc:
        messages.error(request, exc.message)
    return redirect("console:upgrade", upgrade_id=upgrade_id)
