"""The Load tests pages: runs, scenarios, the cost model and a start form (``/loadtests/``);
one run, live while it runs (``/ws/loadtests/<id>/``, drawn by
``static/console/loadtests.js``) and its report after (``/loadtests/<id>/``: the curve with
its knee, an overlay of another run, tables, findings, capacity and cost, flame graphs)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.forms import CapacityForm, CostModelForm, LoadTestForm, ScenarioForm
from console.lib import access
from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _form_error, _render
from inference.loadtests import analysis, services
from inference.loadtests.api import profile_path, run_out
from inference.loadtests.models import CostModel, LoadScenario, LoadTestRun


def steps_text(spec: dict[str, Any]) -> str:
    """A scenario's concurrency steps as text: "1, 2, 4" (a steady one: its concurrency)."""
    return ", ".join(str(c) for c in spec.get("steps") or [spec.get("concurrency")])


def turns_text(spec: dict[str, Any]) -> str:
    """A session length as text: "8", or "2–6" for a range."""
    turns = spec.get("turns", 4)
    return f"{turns['min']}–{turns['max']}" if isinstance(turns, dict) else str(turns)


def _with_steps(row: LoadScenario) -> LoadScenario:
    row.steps_text = steps_text(row.spec)  # type: ignore[attr-defined]
    row.turns_text = turns_text(row.spec)  # type: ignore[attr-defined]
    return row


def _forms(request: HttpRequest) -> dict[str, Any]:
    post = request.POST if request.method == "POST" else None
    which = request.POST.get("form") if post else None
    model = CostModel.load()
    return {
        "form": LoadTestForm(post if which == "start" else None, prefix="run"),
        "scenario_form": ScenarioForm(post if which == "scenario" else None, prefix="scenario"),
        "cost_form": CostModelForm(
            post if which == "cost" else None,
            prefix="cost",
            initial={f: getattr(model, f) for f in (*CostModel.FIELDS, "currency")},
        ),
    }


def _act(request: HttpRequest, forms: dict[str, Any]) -> tuple[HttpResponse | None, int]:
    """Handle the posted form; a redirect when it worked, else the status to render with."""
    which = request.POST.get("form")
    form = {
        "start": forms["form"],
        "scenario": forms["scenario_form"],
        "cost": forms["cost_form"],
    }.get(which)
    if form is None or not form.is_valid():
        return None, 400
    try:
        if which == "start":
            run = services.loadtest_start(**form.changes())
            messages.success(request, f"Load test {run.pk} queued; the control loop starts it.")
            return redirect("console:loadtest", run_id=run.pk), 302
        if which == "scenario":
            row = services.scenario_save(yaml_text=form.cleaned_data["yaml"])
            messages.success(request, f"Scenario {row.name} saved.")
        else:
            services.cost_model_update(changes=form.cleaned_data)
            messages.success(request, "Cost model saved.")
    except ConsoleError as exc:
        _form_error(request, form, exc)
        return None, exc.status
    return redirect("console:loadtests"), 302


@role_required(Role.VIEWER)
def loadtests(request: HttpRequest) -> HttpResponse:
    """Runs (newest first), scenarios, the cost model; operators start runs and save both."""
    forms = _forms(request)
    status = 200
    if request.method == "POST":
        access.require(request.principal, Role.OPERATOR)  # type: ignore[attr-defined]
        response, status = _act(request, forms)
        if response is not None:
            return response
    return _render(
        request,
        "console/loadtests.html",
        {
            "page": "loadtests",
            "runs": LoadTestRun.objects.defer("turns", "sessions", "live")[:100],
            "scenarios": [_with_steps(s) for s in services.scenario_list()],
            "colours": LoadTestRun.STATE_COLOURS,
            **forms,
        },
        status=status,
    )


@role_required(Role.VIEWER)
def loadtest(request: HttpRequest, run_id: int) -> HttpResponse:
    """One run: live while it runs, its report once it has one; ``?overlay=<id>`` draws
    another run's curve beside it; ``?sessions=&target_p95_s=`` plans capacity."""
    try:
        run = services.loadtest_get(run_id)
    except ConsoleError as exc:
        raise Http404(exc.message) from exc
    overlay = _overlay(request.GET.get("overlay"), run)
    capacity_form = CapacityForm(request.GET if "sessions" in request.GET else None)
    plan, plan_error = _plan(run, capacity_form)
    others = (
        LoadTestRun.objects.exclude(pk=run.pk)
        .filter(report__isnull=False)
        .only("pk", "scenario_name", "created_at")[:50]
    )
    return _render(
        request,
        "console/loadtest.html",
        {
            "page": "loadtests",
            "run": run,
            "steps_text": steps_text(run.scenario),
            "turns_text": turns_text(run.scenario),
            "data": run_out(run),
            "report": shown_report(run.report),
            "overlay": overlay,
            "overlay_data": {"id": overlay.pk, "curve": overlay.report["curve"]}
            if overlay
            else None,
            "others": others,
            "capacity_form": capacity_form,
            "plan": plan or default_plan(run.report),
            "plan_error": plan_error,
            "currency": CostModel.load().currency,
            "colours": LoadTestRun.STATE_COLOURS,
        },
    )


def default_plan(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The capacity plan a report's page shows before the operator asks for another: at the
    run's target when some step met it, else at the tightest target the run meets
    (``capacity_tightest``), so the answer is never empty while any target was met."""
    report = report or {}
    plan, tightest = report.get("capacity"), report.get("capacity_tightest")
    if plan and not plan.get("reachable") and tightest:
        return tightest
    return plan


def shown_report(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored report as the page draws it: its errors table cut to
    ``analysis.MAX_ERROR_KINDS`` rows (a report written before that bound may hold one row
    per request), the rest as it is (every other section is bounded by the steps and nodes)."""
    if not report or not isinstance(report.get("errors"), list):
        return report
    return {**report, "errors": analysis.fold_error_rows(report["errors"])}


def _overlay(raw: str | None, run: LoadTestRun) -> LoadTestRun | None:
    """The run ``?overlay=`` names, when it is another run with a report (else none)."""
    try:
        other = int(raw or "")
    except ValueError:
        return None
    if other == run.pk or not 0 < other < 2**63:
        return None
    return LoadTestRun.objects.filter(pk=other, report__isnull=False).first()


def _plan(run: LoadTestRun, form: CapacityForm) -> tuple[dict | None, str]:
    if not form.is_bound or not run.report:
        return None, ""
    if not form.is_valid():
        return None, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
    try:
        return services.loadtest_capacity(
            run_id=run.pk,
            sessions=form.cleaned_data["sessions"],
            target_p95_s=form.cleaned_data.get("target_p95_s"),
        ), ""
    except ConsoleError as exc:
        return None, exc.message


@require_POST
@role_required(Role.OPERATOR)
def loadtest_stop(request: HttpRequest, run_id: int) -> HttpResponse:
    """``POST /loadtests/<id>/stop/``."""
    try:
        services.loadtest_stop(run_id=run_id)
        messages.success(request, f"Load test {run_id}: stopping; it keeps what it measured.")
    except ConsoleError as exc:
        messages.error(request, exc.message)
    return redirect("console:loadtest", run_id=run_id)


@role_required(Role.VIEWER)
def loadtest_profile(request: HttpRequest, run_id: int, name: str) -> FileResponse:
    """A run's flame graph (SVG) for the report page."""
    try:
        path = profile_path(run_id, name)
    except ConsoleError as exc:
        raise Http404(exc.message) from exc
    return FileResponse(open(path, "rb"), content_type="image/svg+xml")
