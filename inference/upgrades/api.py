"""Admin API for rolling upgrades (``/api/upgrades``): viewers read them (plan, node timeline,
gates, events, traffic samples); operators start, pause, resume, promote and abort them.
The control loop does the work (``inference.upgrades.driver``); these answer at once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema
from pydantic import StrictInt

from console.lib.access import NEEDS_OPERATOR, NEEDS_VIEWER
from inference.models import ModelPackage, Upgrade
from inference.upgrades import services

router = Router()


class UpgradeIn(Schema):
    from_package_id: int
    to_package_id: int
    model: str | None = Field(None, description="the name clients ask for (default: served now)")
    settings: dict[str, float | str] = Field(
        {},
        description="max_unavailable, canary_share, bake_s, drain_timeout_s, switch_timeout_s, "
        "max_error_rate_increase, max_ttft_ratio, ttft_slack_s, min_requests (numbers); "
        "no_traffic: pause (default) or proceed, what the upgrade does when a bake could "
        "compare nothing after waiting another bake_s for traffic",
    )
    node_settings: dict[str, StrictInt] = Field(
        {},
        description="threads (1-256), sequences (1-256), ctx_per_seq (256 to the package's "
        "trained context, at most 131072), host_ram_mib (1-1048576): rolled with it; one out "
        "of bounds is a 422 naming it",
    )


class AbortIn(Schema):
    reason: str = ""


class UpgradeOut(Schema):
    id: int
    model: str
    from_package: str = Field(description="name:version")
    to_package: str
    from_package_id: int
    to_package_id: int
    to_package_override: str = Field(
        description="why to_package was approved over its gate (an admin's override reason); "
        "empty when it passed its gate"
    )
    state: str = Field(description="pending, running, paused, rolling_back, succeeded, ...")
    phase: str
    new_share: float = Field(description="share of new sessions sent to the new version")
    settings: dict[str, Any]
    node_settings: dict[str, Any]
    nodes: list[dict[str, Any]]
    gates: list[dict[str, Any]] = Field(
        description='[{"at", "node_id" ("" for the array), "gate", "verdict" (pass, fail or '
        'skipped: a bake that compared nothing), "passed" (verdict is pass), "detail", "values"}]'
    )
    reason: str
    promote: bool
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class EventOut(Schema):
    at: datetime
    node_id: str
    kind: str
    message: str


class SampleOut(Schema):
    at: datetime
    old_sessions: int
    new_sessions: int
    old_nodes: int
    new_nodes: int
    new_share: float


def override_reason(package: ModelPackage) -> str:
    """The admin's reason for approving ``package`` over its gate, or "" (it passed)."""
    reason = package.status_reason or ""
    return reason.removeprefix("override:").strip() if reason.startswith("override:") else ""


def upgrade_out(upgrade: Upgrade) -> dict[str, Any]:
    return {
        "id": upgrade.pk,
        "model": upgrade.model,
        "from_package": upgrade.from_package.key,
        "to_package": upgrade.to_package.key,
        "from_package_id": upgrade.from_package_id,
        "to_package_id": upgrade.to_package_id,
        "to_package_override": override_reason(upgrade.to_package),
        "state": upgrade.state,
        "phase": upgrade.phase,
        "new_share": upgrade.new_share,
        "settings": upgrade.settings,
        "node_settings": upgrade.node_settings,
        "nodes": upgrade.nodes,
        "gates": upgrade.gates,
        "reason": upgrade.reason,
        "promote": upgrade.promote,
        "created_by": upgrade.created_by,
        "created_at": upgrade.created_at,
        "started_at": upgrade.started_at,
        "finished_at": upgrade.finished_at,
    }


@router.get(
    "/upgrades",
    response=list[UpgradeOut],
    tags=["upgrades"],
    summary="Upgrades, newest first",
    auth=NEEDS_VIEWER,
)
def upgrades_list(request: HttpRequest, limit: int = 50) -> list[dict]:
    rows = Upgrade.objects.select_related("from_package", "to_package")[: max(1, min(limit, 500))]
    return [upgrade_out(u) for u in rows]


@router.post(
    "/upgrades",
    response={201: UpgradeOut},
    tags=["upgrades"],
    summary="Plan a rolling upgrade; the control loop runs it",
    description="Only an approved to_package (409 otherwise); one upgrade per model at a time "
    "(409); a bad setting is a 422 naming it.",
    auth=NEEDS_OPERATOR,
)
def upgrades_start(request: HttpRequest, payload: UpgradeIn) -> tuple[int, dict]:
    upgrade = services.upgrade_start(**payload.dict())
    return 201, upgrade_out(services.upgrade_get(upgrade.pk))


@router.get(
    "/upgrades/{int:upgrade_id}",
    response=UpgradeOut,
    tags=["upgrades"],
    summary="One upgrade: plan, node timeline, gates",
    auth=NEEDS_VIEWER,
)
def upgrades_show(request: HttpRequest, upgrade_id: int) -> dict:
    return upgrade_out(services.upgrade_get(upgrade_id))


@router.get(
    "/upgrades/{int:upgrade_id}/events",
    response=list[EventOut],
    tags=["upgrades"],
    summary="The upgrade's event log, oldest first (the newest 2,000)",
    auth=NEEDS_VIEWER,
)
def upgrades_events(request: HttpRequest, upgrade_id: int) -> list:
    return _newest_oldest_first(services.upgrade_get(upgrade_id).events, 2000)


@router.get(
    "/upgrades/{int:upgrade_id}/samples",
    response=list[SampleOut],
    tags=["upgrades"],
    summary="The traffic split over time (one sample a second; the newest 3,600)",
    auth=NEEDS_VIEWER,
)
def upgrades_samples(request: HttpRequest, upgrade_id: int) -> list:
    return _newest_oldest_first(services.upgrade_get(upgrade_id).samples, 3600)


def _newest_oldest_first(rows: Any, limit: int) -> list:
    """The newest ``limit`` of an upgrade's timed ``rows`` (events, samples), oldest first."""
    return list(reversed(rows.order_by("-at", "-id")[:limit]))


def _action(name: str, summary: str):
    def view(request: HttpRequest, upgrade_id: int) -> dict:
        getattr(services, f"upgrade_{name}")(upgrade_id=upgrade_id)
        return upgrade_out(services.upgrade_get(upgrade_id))

    view.__name__ = f"upgrades_{name}"
    router.post(
        f"/upgrades/{{int:upgrade_id}}/{name}",
        response=UpgradeOut,
        tags=["upgrades"],
        summary=summary,
        auth=NEEDS_OPERATOR,
    )(view)


_action("pause", "Hold the upgrade where it is")
_action("resume", "Go on from where it was paused")
_action("promote", "Skip the remaining bake times; all new sessions to the new version")


@router.post(
    "/upgrades/{int:upgrade_id}/abort",
    response=UpgradeOut,
    tags=["upgrades"],
    summary="Roll back now",
    auth=NEEDS_OPERATOR,
)
def upgrades_abort(request: HttpRequest, upgrade_id: int, payload: AbortIn) -> dict:
    services.upgrade_abort(upgrade_id=upgrade_id, reason=payload.reason)
    return upgrade_out(services.upgrade_get(upgrade_id))
