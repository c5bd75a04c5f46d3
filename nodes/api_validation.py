"""Admin API for device validation (``/api/nodes/{id}/validations``, ``/api/validations/{id}``):
validate a node now, list its runs, show one run with its report, waive validation. Reads need
the viewer role, "validate now" operator, waiving admin (``console.lib.access``). See
docs/validation.md."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema

from console import services
from console.lib.access import NEEDS_ADMIN, NEEDS_OPERATOR, NEEDS_VIEWER
from console.lib.errors import Invalid, NotFound
from nodes.models import Node, ValidationRun

router = Router(tags=["validation"])


class ValidationRunOut(Schema):
    id: int
    node_id: str
    trigger: str
    state: str = Field(description="queued, running, passed, warned, failed or error")
    phase: str
    progress: float = Field(description="0 to 1")
    requested_by: str
    reason: str = Field(description="the failed and warned rules' reasons, or why it errored")
    rules: list[dict[str, Any]] = Field(description="[{rule, status, reason}]")
    changes: list[dict[str, Any]] = Field(
        description="[{path, before, after}]: the inventory's changes since the node's last run"
    )
    bench: dict[str, Any] | None = Field(
        None,
        description="memory_bandwidth_gb_s, prompt_tok_s, decode_tok_s_1, decode_tok_s_8 (tok/s)",
    )
    pool: dict[str, Any] | None = Field(None, description="the other nodes' medians, same keys")
    seconds: float | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class ValidationReportOut(ValidationRunOut):
    inventory: dict[str, Any] | None
    engine: dict[str, Any] | None


class WaiveIn(Schema):
    reason: str = Field(description="why the node may serve without passing")


class NodeValidationOut(Schema):
    node_id: str
    validation: str = Field(description="pending, validating, passed, warned, failed or waived")
    validation_reason: str
    measured_speed: float | None
    weight: float
    weight_measured: bool
    routing_weight: float


def _run_out(run: ValidationRun, schema=ValidationRunOut):
    fields = {name: getattr(run, name) for name in schema.model_fields if name != "node_id"}
    return schema(**{**fields, "id": run.pk, "node_id": run.node.node_id})


def _node(node_id: str) -> Node:
    node = Node.objects.filter(node_id=node_id).first()
    if node is None:
        raise NotFound(f"No node {node_id!r}.", code="node_not_found")
    return node


def _node_out(node: Node) -> NodeValidationOut:
    return NodeValidationOut(
        node_id=node.node_id,
        validation=node.validation,
        validation_reason=node.validation_reason,
        measured_speed=node.measured_speed,
        weight=node.weight,
        weight_measured=node.weight_measured,
        routing_weight=node.routing_weight,
    )


@router.post(
    "/nodes/{node_id}/validations",
    response={202: ValidationRunOut},
    summary="Validate a node now (the run under way, if any)",
    auth=NEEDS_OPERATOR,
)
def validations_create(request: HttpRequest, node_id: str) -> tuple[int, ValidationRunOut]:
    run = services.node_validate(node_id=node_id)
    return 202, _run_out(ValidationRun.objects.select_related("node").get(pk=run.pk))


@router.get(
    "/nodes/{node_id}/validations",
    response=list[ValidationRunOut],
    summary="A node's validation runs, newest first",
    auth=NEEDS_VIEWER,
)
def validations_list(request: HttpRequest, node_id: str, limit: int = 20) -> list[ValidationRunOut]:
    node = _node(node_id)
    if not 1 <= limit <= 200:
        raise Invalid("limit: between 1 and 200.", field="limit")
    runs = node.validation_runs.select_related("node").defer("inventory", "engine")[:limit]
    return [_run_out(r) for r in runs]


@router.get(
    "/validations/{run_id}",
    response=ValidationReportOut,
    summary="One validation run with its inventory",
    auth=NEEDS_VIEWER,
)
def validations_show(request: HttpRequest, run_id: int) -> ValidationReportOut:
    run = ValidationRun.objects.select_related("node").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"No validation run {run_id}.", code="validation_not_found")
    return _run_out(run, ValidationReportOut)


@router.get(
    "/nodes/{node_id}/validation",
    response=NodeValidationOut,
    summary="A node's validation status and measured speed",
    auth=NEEDS_VIEWER,
)
def validation_status(request: HttpRequest, node_id: str) -> NodeValidationOut:
    return _node_out(_node(node_id))


@router.post(
    "/nodes/{node_id}/validation/waive",
    response=NodeValidationOut,
    summary="Let a node take traffic without passing validation",
    auth=NEEDS_ADMIN,
)
def validation_waive(request: HttpRequest, node_id: str, payload: WaiveIn) -> NodeValidationOut:
    services.node_waive_validation(node_id=node_id, reason=payload.reason)
    return _node_out(_node(node_id))
