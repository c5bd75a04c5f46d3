"""``/api/alerts``: the alerts (list, acknowledge, resolve), the webhooks that receive them
(CRUD, admin; the secret is write-only), their deliveries, and the Prometheus rules file.
docs/alerts.md."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema

from console.lib.access import NEEDS_ADMIN, NEEDS_OPERATOR, NEEDS_VIEWER
from inference.alerts import services
from inference.alerts.models import Alert, AlertDelivery, AlertSettings, AlertWebhook
from inference.alerts.prometheus import rules_yaml

router = Router(tags=["alerts"])
LIMIT = 500


class AlertOut(Schema):
    id: int
    rule: str
    subject: str
    state: str
    value: float | None
    message: str
    first_seen_at: datetime
    last_seen_at: datetime
    fired_count: int
    acknowledged_at: datetime | None
    acknowledged_by: str
    resolved_at: datetime | None
    resolved_by: str


class WebhookIn(Schema):
    name: str = Field(max_length=64)
    url: str = Field(max_length=500)
    secret: str = Field(description="16-200 characters; write-only, never shown back.")
    enabled: bool = True


class WebhookPatchIn(Schema):
    url: str | None = None
    secret: str | None = None
    enabled: bool | None = None


class WebhookOut(Schema):
    id: int
    name: str
    url: str
    enabled: bool
    created_at: datetime


class DeliveryOut(Schema):
    id: int
    alert_id: int
    webhook_id: int
    event: str
    state: str
    attempts: int
    next_attempt_at: datetime
    last_error: str
    delivered_at: datetime | None


@router.get("/alerts", response=list[AlertOut], summary="List alerts", auth=NEEDS_VIEWER)
def alerts_list(
    request: HttpRequest, state: Literal["firing", "acknowledged", "resolved"] | None = None
) -> list[Alert]:
    rows = Alert.objects.all()
    return list((rows.filter(state=state) if state else rows)[:LIMIT])


@router.get(
    "/alerts/rules.yaml",
    response={200: str},
    summary="The alert rules as a Prometheus alerting-rules file",
    auth=NEEDS_VIEWER,
)
def alerts_rules_yaml(request: HttpRequest) -> HttpResponse:
    return HttpResponse(rules_yaml(AlertSettings.load()), content_type="application/yaml")


@router.post(
    "/alerts/{alert_id}/acknowledge",
    response=AlertOut,
    summary="Acknowledge a firing alert",
    auth=NEEDS_OPERATOR,
)
def alert_acknowledge(request: HttpRequest, alert_id: int) -> Alert:
    return services.alert_acknowledge(alert_id=alert_id)


@router.post(
    "/alerts/{alert_id}/resolve", response=AlertOut, summary="Resolve an alert", auth=NEEDS_OPERATOR
)
def alert_resolve(request: HttpRequest, alert_id: int) -> Alert:
    return services.alert_resolve(alert_id=alert_id)


@router.get(
    "/alert-webhooks", response=list[WebhookOut], summary="List alert webhooks", auth=NEEDS_ADMIN
)
def webhooks_list(request: HttpRequest) -> list[AlertWebhook]:
    return list(AlertWebhook.objects.all())


@router.post(
    "/alert-webhooks",
    response={201: WebhookOut},
    summary="Add an alert webhook",
    auth=NEEDS_ADMIN,
)
def webhooks_create(request: HttpRequest, payload: WebhookIn) -> tuple[int, AlertWebhook]:
    return 201, services.webhook_create(**payload.dict())


@router.patch(
    "/alert-webhooks/{webhook_id}",
    response=WebhookOut,
    summary="Change an alert webhook",
    auth=NEEDS_ADMIN,
)
def webhooks_patch(request: HttpRequest, webhook_id: int, payload: WebhookPatchIn) -> AlertWebhook:
    return services.webhook_update(webhook_id=webhook_id, **payload.dict(exclude_unset=True))


@router.delete(
    "/alert-webhooks/{webhook_id}",
    response={204: None},
    summary="Remove an alert webhook",
    auth=NEEDS_ADMIN,
)
def webhooks_delete(request: HttpRequest, webhook_id: int) -> tuple[int, None]:
    services.webhook_delete(webhook_id=webhook_id)
    return 204, None


@router.get(
    "/alert-deliveries",
    response=list[DeliveryOut],
    summary="Recent webhook deliveries (newest first)",
    auth=NEEDS_VIEWER,
)
def deliveries_list(request: HttpRequest) -> list[AlertDelivery]:
    return list(AlertDelivery.objects.defer("payload")[:LIMIT])
