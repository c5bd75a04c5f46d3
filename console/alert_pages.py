"""The Alerts page (``/alerts/``): alerts filtered by state, acknowledge and resolve inline for
operators, the webhooks and their recent deliveries (given up ones stand out). The API is
``/api/alerts`` (``inference.alerts.api``); docs/alerts.md."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.models import Role
from console.views import _render
from inference.alerts import services
from inference.alerts.models import Alert, AlertDelivery, AlertWebhook

STATES = [s.value for s in Alert.State]


@role_required(Role.VIEWER)
def alerts(request: HttpRequest) -> HttpResponse:
    """Open alerts by default (``?state=`` firing, acknowledged, resolved or all)."""
    state = request.GET.get("state", "open")
    rows = Alert.objects.all()
    if state == "open":
        rows = rows.filter(state__in=Alert.OPEN)
    elif state in STATES:
        rows = rows.filter(state=state)
    return _render(
        request,
        "console/alerts.html",
        {
            "page": "alerts",
            "alerts": list(rows[:200]),
            "state": state,
            "states": ["open", *STATES, "all"],
            "webhooks": list(AlertWebhook.objects.all()),
            "deliveries": list(
                AlertDelivery.objects.select_related("webhook").defer("payload")[:20]
            ),
        },
    )


def _act(request: HttpRequest, alert_id: int, verb: str) -> HttpResponse:
    try:
        if verb == "acknowledge":
            alert = services.alert_acknowledge(alert_id=alert_id)
        else:
            alert = services.alert_resolve(alert_id=alert_id)
        messages.success(request, f"Alert {alert.rule} {alert.subject}: {alert.state}.")
    except ConsoleError as exc:
        messages.error(request, exc.message)
    return redirect(f"/alerts/?state={request.POST.get('state', 'open')}")


@require_POST
@role_required(Role.OPERATOR)
def alert_acknowledge(request: HttpRequest, alert_id: int) -> HttpResponse:
    """``POST /alerts/<id>/acknowledge/``."""
    return _act(request, alert_id, "acknowledge")


@require_POST
@role_required(Role.OPERATOR)
def alert_resolve(request: HttpRequest, alert_id: int) -> HttpResponse:
    """``POST /alerts/<id>/resolve/``."""
    return _act(request, alert_id, "resolve")
