"""Admin API: config as a file (``/api/config``), who am I (``/api/me``) and the kept
utilization history (``/api/utilization``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema

from console import selectors
from console.config_file import ApplyReport, ConfigError, apply_config_text, export_config
from console.lib.access import NEEDS_ADMIN, NEEDS_VIEWER
from console.lib.errors import Invalid
from inference.chat_request import decode_json
from inference.errors import BadRequest
from nodes import utilization

router = Router()

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")


class MeOut(Schema):
    name: str
    role: str | None


class ConfigOut(Schema):
    yaml: str


class ApplyOut(Schema):
    changed: bool
    dry_run: bool
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    removed: list[str]
    settings_changed: list[str]
    changes: list[str] = Field(description='each change, "field: before \u2192 after"')
    warnings: list[str]


class ConfigErrorOut(Schema):
    detail: str
    code: str = "invalid_config"
    line: int | None
    field: str | None


class UtilizationOut(Schema):
    snapshots: list[dict[str, Any]] = Field(description="oldest first; see nodes.utilization")


def report_out(report: ApplyReport) -> dict[str, Any]:
    """An ``ApplyReport`` as ``ApplyOut`` fields."""
    return {**report.__dict__, "changed": report.changed}


@router.get(
    "/me",
    response=MeOut,
    tags=["access"],
    summary="Who is calling, with which role (403 for a user in no role, as everywhere)",
    auth=NEEDS_VIEWER,
)
def me(request: HttpRequest) -> dict[str, Any]:
    principal = request.auth  # type: ignore[attr-defined]
    return {"name": principal.name, "role": principal.role.value if principal.role else None}


@router.get(
    "/config",
    response=ConfigOut,
    tags=["config"],
    summary="Export the array as a config file (?format=yaml for the raw file)",
    auth=NEEDS_VIEWER,
)
def config_export(request: HttpRequest, format: str = "json") -> Any:
    text = export_config()
    if format == "yaml":
        response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="phalanx.yaml"'
        return response
    return {"yaml": text}


def _body_text(request: HttpRequest) -> str:
    content_type = request.content_type or ""
    raw = request.body.decode("utf-8", "replace")
    if content_type == "application/json":
        try:
            data = decode_json(request.body)
        except BadRequest as exc:
            raise ConfigError(f"body: {exc.message}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("yaml"), str):
            raise ConfigError('send {"yaml": "..."} or the YAML file itself.', field="yaml")
        return data["yaml"]
    if content_type and content_type not in YAML_TYPES:
        raise ConfigError(f"send the file as application/yaml, not {content_type}.")
    return raw


@router.post(
    "/config",
    response={200: ApplyOut, 422: ConfigErrorOut},
    tags=["config"],
    summary='Apply a config file (YAML body or {"yaml": ...}); idempotent',
    openapi_extra={
        "requestBody": {"content": {"application/yaml": {"schema": {"type": "string"}}}}
    },
    auth=NEEDS_ADMIN,
)
def config_apply(request: HttpRequest, prune: bool = False, dry_run: bool = False) -> Any:
    report = apply_config_text(_body_text(request), prune=prune, dry_run=dry_run)
    return report_out(report)


@router.get(
    "/utilization",
    response=UtilizationOut,
    tags=["utilization"],
    summary="The kept utilization snapshots (the last minutes)",
    auth=NEEDS_VIEWER,
)
def utilization_history(request: HttpRequest) -> dict[str, Any]:
    return {"snapshots": async_to_sync(utilization.history)()}


class AuditOut(Schema):
    at: datetime
    actor: str
    action: str
    target: str
    changes: list[str]


@router.get(
    "/audit",
    response=list[AuditOut],
    tags=["audit"],
    summary="Who changed what, when (newest first)",
    auth=NEEDS_VIEWER,
)
def audit_list(request: HttpRequest, limit: int = 100, action: str | None = None) -> list[Any]:
    """``limit`` 1 to 1000; ``action`` a prefix such as ``node.`` or ``policy.update``."""
    if not 1 <= limit <= 1000:
        raise Invalid("limit: must be 1 to 1000.", field="limit")
    return selectors.audit_entries(limit=limit, action=action)
