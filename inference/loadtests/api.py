"""Admin API for load tests (``/api/loadtests...``): viewers read scenarios, runs, reports
(JSON and CSV), flame graphs and capacity plans; operators save scenarios, start and stop runs
and set the cost model. Runs happen in a worker (``inference.loadtests.jobs``); these answer at
once."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse
from ninja import Field, Router, Schema

from console.lib.access import NEEDS_OPERATOR, NEEDS_VIEWER
from console.lib.errors import Conflict, Invalid, NotFound
from inference.loadtests import services
from inference.loadtests.models import CostModel, LoadScenario, LoadTestRun
from inference.loadtests.report import steps_csv, turns_csv
from inference.loadtests.scenario import parse_scenario, scenario_to_yaml

router = Router(tags=["load tests"])


FORBID_EXTRA = {"extra": "forbid"}  # a misspelt field is a 422 naming it, not ignored


class ScenarioIn(Schema):
    model_config = FORBID_EXTRA

    spec: dict[str, Any] | None = Field(
        None, description="the scenario's fields (docs/loadtests.md)"
    )
    yaml: str | None = Field(None, description="or the same as YAML text")


class ScenarioOut(Schema):
    name: str
    kind: str = Field(description="ramp | steady | agent_sessions")
    builtin: bool
    spec: dict[str, Any]
    updated_at: datetime


class RunIn(Schema):
    model_config = FORBID_EXTRA

    scenario: str | None = Field(None, description="a stored scenario's name")
    spec: dict[str, Any] | None = Field(None, description="or an unsaved scenario")
    target_url: str | None = Field(None, description="base URL (default: this array's own)")
    token: str = Field("", description="Bearer token for another target (never shown again)")
    profile: bool = Field(False, description="flame graphs of the control plane and a node")


class RunOut(Schema):
    id: int
    scenario_name: str
    scenario: dict[str, Any]
    target_url: str
    state: str = Field(description="queued | running | succeeded | stopped | failed")
    progress: float = Field(description="0..1")
    message: str
    live: dict[str, Any] = Field(description="the latest live figures (runner.LoadRun.live)")
    cancel_requested: bool
    finished: bool = Field(description="succeeded, stopped or failed")
    profile: bool
    error: str
    attempts: int
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    summary: dict[str, Any] | None = Field(description="the report's summary, once there is one")


class CapacityIn(Schema):
    model_config = FORBID_EXTRA

    sessions: int = Field(description="concurrent sessions to plan for")
    target_p95_s: float | None = Field(None, description="default: the scenario's target")
    costs: dict[str, float] = Field({}, description="override cost-model inputs for this plan")


class CostModelIO(Schema):
    model_config = FORBID_EXTRA

    power_w: float | None = None
    electricity_per_kwh: float | None = None
    hardware_cost: float | None = None
    amortization_months: float | None = None
    operations_per_month: float | None = None
    space_per_month: float | None = None
    currency: str | None = None


def run_out(run: LoadTestRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "scenario_name": run.scenario_name,
        "scenario": run.scenario,
        "target_url": run.target_url,
        "state": run.state,
        "progress": run.progress,
        "message": run.message,
        "live": run.live,
        "cancel_requested": run.cancel_requested,
        "finished": run.finished,
        "profile": run.profile,
        "error": run.error,
        "attempts": run.attempts,
        "created_by": run.created_by,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "summary": run.report["summary"] if run.report else None,
    }


def _scenario_out(row: LoadScenario) -> dict[str, Any]:
    return {
        "name": row.name,
        "kind": row.kind,
        "builtin": row.builtin,
        "spec": row.spec,
        "updated_at": row.updated_at,
    }


def _report(run_id: int) -> LoadTestRun:
    run = services.loadtest_get(run_id)
    if not run.report:
        raise Conflict(
            f"Load test {run_id} has no report yet ({run.state}).", code="loadtest_no_report"
        )
    return run


@router.get(
    "/loadtests/scenarios",
    response=list[ScenarioOut],
    auth=NEEDS_VIEWER,
    summary="Load-test scenarios, built-in first",
)
def scenarios_list(request: HttpRequest) -> list[dict]:
    return [_scenario_out(s) for s in services.scenario_list()]


@router.post(
    "/loadtests/scenarios",
    response={201: ScenarioOut},
    auth=NEEDS_OPERATOR,
    summary="Save a scenario (JSON spec or YAML); a bad field is a 422 naming it",
)
def scenarios_save(request: HttpRequest, payload: ScenarioIn) -> tuple[int, dict]:
    if (payload.spec is None) == (payload.yaml is None):
        raise Invalid("Give the scenario as yaml or as spec (one of them).", field="yaml")
    row = services.scenario_save(spec=payload.spec, yaml_text=payload.yaml)
    return 201, _scenario_out(row)


@router.get("/loadtests/scenarios/{name}", response=ScenarioOut, auth=NEEDS_VIEWER)
def scenarios_get(request: HttpRequest, name: str) -> dict:
    return _scenario_out(services.scenario_get(name))


@router.get("/loadtests/scenarios/{name}/yaml", auth=NEEDS_VIEWER, summary="A scenario as YAML")
def scenarios_yaml(request: HttpRequest, name: str) -> HttpResponse:
    text = scenario_to_yaml(parse_scenario(services.scenario_get(name).spec))
    return HttpResponse(text, content_type="application/yaml; charset=utf-8")


@router.delete("/loadtests/scenarios/{name}", response={204: None}, auth=NEEDS_OPERATOR)
def scenarios_delete(request: HttpRequest, name: str) -> tuple[int, None]:
    services.scenario_delete(name=name)
    return 204, None


@router.get("/loadtests", response=list[RunOut], auth=NEEDS_VIEWER, summary="Runs, newest first")
def runs_list(request: HttpRequest, limit: int = 50) -> list[dict]:
    rows = LoadTestRun.objects.defer("turns", "sessions")[: max(1, min(limit, 500))]
    return [run_out(r) for r in rows]


@router.post(
    "/loadtests",
    response={201: RunOut},
    auth=NEEDS_OPERATOR,
    summary="Queue a run; the control loop starts it in a worker process",
)
def runs_start(request: HttpRequest, payload: RunIn) -> tuple[int, dict]:
    run = services.loadtest_start(
        scenario=payload.scenario,
        spec=payload.spec,
        target_url=payload.target_url,
        token=payload.token,
        profile=payload.profile,
    )
    return 201, run_out(run)


@router.get("/loadtests/{run_id}", response=RunOut, auth=NEEDS_VIEWER)
def runs_get(request: HttpRequest, run_id: int) -> dict:
    return run_out(services.loadtest_get(run_id))


@router.post(
    "/loadtests/{run_id}/stop",
    response=RunOut,
    auth=NEEDS_OPERATOR,
    summary="Stop a run; it keeps what it measured (409 once finished)",
)
def runs_stop(request: HttpRequest, run_id: int) -> dict:
    return run_out(services.loadtest_stop(run_id=run_id))


@router.get("/loadtests/{run_id}/report", auth=NEEDS_VIEWER, summary="The report as JSON")
def runs_report(request: HttpRequest, run_id: int, download: bool = False) -> HttpResponse:
    import json

    run = _report(run_id)
    body = {"id": run.pk, **run.report, "turns": run.turns, "sessions": run.sessions}
    response = HttpResponse(json.dumps(body, indent=1), content_type="application/json")
    if download:
        response["Content-Disposition"] = f'attachment; filename="loadtest-{run.pk}.json"'
    return response


@router.get(
    "/loadtests/{run_id}/report.csv",
    auth=NEEDS_VIEWER,
    summary="The step table (or every turn: ?rows=turns) as CSV",
)
def runs_csv(
    request: HttpRequest, run_id: int, rows: Literal["steps", "turns"] = "steps"
) -> HttpResponse:
    run = _report(run_id)
    which = rows
    text = turns_csv(run.turns) if which == "turns" else steps_csv(run.report)
    response = HttpResponse(text, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="loadtest-{run.pk}-{which}.csv"'
    return response


@router.post(
    "/loadtests/{run_id}/capacity",
    response=dict[str, Any],
    auth=NEEDS_VIEWER,
    summary="Nodes and cost for N concurrent sessions at a target P95, from this run",
)
def runs_capacity(request: HttpRequest, run_id: int, payload: CapacityIn) -> dict:
    return services.loadtest_capacity(
        run_id=run_id,
        sessions=payload.sessions,
        target_p95_s=payload.target_p95_s,
        costs=payload.costs,
    )


@router.get(
    "/loadtests/{run_id}/profiles/{name}.svg",
    auth=NEEDS_VIEWER,
    summary="A flame graph of the run (control_plane or node)",
)
def runs_profile(request: HttpRequest, run_id: int, name: str) -> FileResponse:
    return FileResponse(open(profile_path(run_id, name), "rb"), content_type="image/svg+xml")


def profile_path(run_id: int, name: str) -> Path:
    """The flame graph ``name`` of run ``run_id``; ``NotFound`` when it has none."""
    run = services.loadtest_get(run_id)
    entry = ((run.report or {}).get("profiles") or {}).get(name) or {}
    path = Path(settings.VAR_DIR) / "loadtests" / f"run-{run.pk}" / f"{name}.svg"
    if name not in ("control_plane", "node") or not entry.get("file") or not path.exists():
        raise NotFound(f"Load test {run_id} has no {name} flame graph.", code="profile_not_found")
    return path


@router.get(
    "/loadtests-cost-model",
    response=CostModelIO,
    auth=NEEDS_VIEWER,
    summary="The cost model's inputs",
)
def cost_model_get(request: HttpRequest) -> dict:
    return _cost_model_out(CostModel.load())


@router.put(
    "/loadtests-cost-model",
    response=CostModelIO,
    auth=NEEDS_OPERATOR,
    summary="Change any of the cost model's inputs",
)
def cost_model_put(request: HttpRequest, payload: CostModelIO) -> dict:
    return _cost_model_out(services.cost_model_update(changes=payload.dict(exclude_none=True)))


def _cost_model_out(model: CostModel) -> dict[str, Any]:
    return {f: getattr(model, f) for f in (*CostModel.FIELDS, "currency")}
