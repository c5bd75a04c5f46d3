"""The Device validation pages: every node's validation status (``/validation/``) and one
node's latest report, history and diffs, with "validate now" and live progress
(``/validation/<node_id>/``, kept live by ``static/console/validation.js`` from
``/api/validations/<id>``). See docs/validation.md."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console import services
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _render
from nodes.devices.summary import summary
from nodes.models import Node, ValidationRun
from nodes.startup import validation_estimate

STATUS_COLOURS = {
    "pending": "grey",
    "validating": "blue",
    "passed": "green",
    "warned": "orange",
    "failed": "red",
    "waived": "orange",
}
FIGURES = (
    ("memory_bandwidth_gb_s", "Memory bandwidth", "GB/s"),
    ("prompt_tok_s", "Prompt processing", "tok/s"),
    ("decode_tok_s_1", "Decode, 1 sequence", "tok/s"),
    ("decode_tok_s_8", "Decode, 8 sequences", "tok/s"),
)


@role_required(Role.VIEWER)
def validation(request: HttpRequest) -> HttpResponse:
    """Every node: validation status, why, measured speed, routing weight, last run."""
    newest = ValidationRun.objects.filter(node=OuterRef("pk")).order_by("-created_at", "-id")
    nodes = list(
        Node.objects.select_related("package").annotate(last_run=Subquery(newest.values("pk")[:1]))
    )
    runs = ValidationRun.objects.defer("inventory", "engine").in_bulk(
        [n.last_run for n in nodes if n.last_run]
    )
    rows = [{"node": n, "run": runs.get(n.last_run)} for n in nodes]
    return _render(
        request,
        "console/validation.html",
        {"page": "validation", "rows": rows, "colours": STATUS_COLOURS},
    )


def _figures(run: ValidationRun | None) -> list[dict[str, Any]]:
    bench, pool = (run.bench or {}, run.pool or {}) if run else ({}, {})
    return [
        {"key": k, "label": label, "unit": unit, "node": bench.get(k), "pool": pool.get(k)}
        for k, label, unit in FIGURES
    ]


@role_required(Role.VIEWER)
def validation_node(request: HttpRequest, node_id: str) -> HttpResponse:
    """One node: its latest report (inventory, figures beside the pool's, matrix results),
    the history of runs with what changed between them, validate now, waive."""
    node = Node.objects.select_related("package").filter(node_id=node_id).first()
    if node is None:
        raise Http404(f"No node {node_id!r}.")
    runs = list(node.validation_runs.defer("inventory", "engine")[:50])
    report = node.validation_runs.filter(inventory__isnull=False).first()
    open_run = next((r for r in runs if not r.finished), None)
    return _render(
        request,
        "console/validation_node.html",
        {
            "page": "validation",
            "node": node,
            "runs": runs,
            "report": report,
            "inventory": summary(report.inventory) if report else [],
            "figures": _figures(report),
            "open_run": open_run,
            "estimate": validation_estimate([node.node_id]).text,
            "colours": STATUS_COLOURS,
            "run_colours": ValidationRun.STATE_COLOURS,
        },
    )


@require_POST
@role_required(Role.OPERATOR)
def validation_start(request: HttpRequest, node_id: str) -> HttpResponse:
    """``POST /validation/<node_id>/validate/``: validate now."""
    try:
        run = services.node_validate(node_id=node_id)
        messages.success(
            request, f"Validation {run.pk} of {node_id} queued: no traffic until it ends."
        )
    except ConsoleError as exc:
        messages.error(request, exc.message)
    return redirect("console:validation_node", node_id=node_id)


@require_POST
@role_required(Role.ADMIN)
def validation_waive(request: HttpRequest, node_id: str) -> HttpResponse:
    """``POST /validation/<node_id>/waive/``: let the node serve without passing."""
    try:
        services.node_waive_validation(node_id=node_id, reason=request.POST.get("reason", ""))
        messages.success(request, f"{node_id} may take traffic without passing validation.")
    except ConsoleError as exc:
        messages.error(request, exc.message)
    return redirect("console:validation_node", node_id=node_id)
