"""Alert webhooks: the outbox (one ``AlertDelivery`` per alert transition and webhook), the
signature, and the sender the control loop runs every second. All of the alerts' outbound
HTTP goes through ``post`` (one seam for tests).

A delivery is a JSON POST of ``payload`` (the same bytes on every attempt) with headers
``X-Phalanx-Event`` (``firing`` | ``resolved``), ``X-Phalanx-Delivery`` (the delivery id:
receivers de-duplicate on it, delivery is at least once), ``X-Phalanx-Timestamp`` (Unix
seconds of this attempt) and ``X-Phalanx-Signature: sha256=<hex>``, the HMAC-SHA256 with the
webhook's secret of ``"<timestamp>.<body>"`` (Stripe's and Slack's scheme: the timestamp
inside the MAC lets a receiver refuse replays). Any 2xx delivers; anything else (a refused
connection, a timeout, 3xx/4xx/5xx) is retried after ``backoff_s(attempts)`` until
``MAX_ATTEMPTS``, then the delivery is ``given_up`` and shows on the Alerts page.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.db.models import Q
from django.utils import timezone

from inference.alerts.models import Alert, AlertDelivery, AlertWebhook

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 8
BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 600.0
TIMEOUT_S = 5.0
LEASE_S = 30.0
BATCH = 20


def backoff_s(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: 5, 10, 20 ... capped at
    600 (about 21 minutes over all ``MAX_ATTEMPTS``)."""
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1))


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``b"<timestamp>." + body`` keyed with ``secret``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def alert_payload(alert: Alert, *, event: str) -> dict[str, Any]:
    """The body of a delivery: ``{"event", "alert": {"id", "rule", "subject", "state", "value",
    "message", "first_seen_at", "last_seen_at", "resolved_at", "fired_count"}}`` (ISO 8601)."""
    return {
        "event": event,
        "alert": {
            "id": alert.pk,
            "rule": alert.rule,
            "subject": alert.subject,
            "state": alert.state,
            "value": alert.value,
            "message": alert.message,
            "first_seen_at": _iso(alert.first_seen_at),
            "last_seen_at": _iso(alert.last_seen_at),
            "resolved_at": _iso(alert.resolved_at),
            "fired_count": alert.fired_count,
        },
    }


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def deliveries_queue(alert: Alert, *, event: str, now: datetime) -> int:
    """Queue ``event`` of ``alert`` for every enabled webhook (call inside the transition's
    transaction); returns how many."""
    payload = alert_payload(alert, event=event)
    rows = [
        AlertDelivery(alert=alert, webhook=w, event=event, payload=payload, next_attempt_at=now)
        for w in AlertWebhook.objects.filter(enabled=True)
    ]
    AlertDelivery.objects.bulk_create(rows)
    return len(rows)


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST ``body`` to ``url``; returns the status code (raises ``httpx.HTTPError``)."""
    with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as client:
        return client.post(url, content=body, headers=headers).status_code


def deliveries_send_due(*, now: datetime | None = None) -> int:
    """Send up to ``BATCH`` due deliveries, each claimed first (a conditional UPDATE of its
    lease, so two control loops never send one at once); returns how many were delivered."""
    now = now or timezone.now()
    due = AlertDelivery.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now),
        state=AlertDelivery.State.PENDING,
        next_attempt_at__lte=now,
    ).values_list("pk", flat=True)[:BATCH]
    sent = 0
    for pk in list(due):
        claimed = AlertDelivery.objects.filter(
            Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk=pk
        ).update(lease_until=now + timedelta(seconds=LEASE_S))
        if claimed:
            sent += _attempt(AlertDelivery.objects.select_related("webhook").get(pk=pk), now)
    return sent


def _attempt(delivery: AlertDelivery, now: datetime) -> int:
    """One attempt of ``delivery``; records the outcome and releases the lease."""
    hook = delivery.webhook
    body = json.dumps(delivery.payload, sort_keys=True, separators=(",", ":")).encode()
    stamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "phalanx-alerts",
        "X-Phalanx-Event": delivery.event,
        "X-Phalanx-Delivery": str(delivery.pk),
        "X-Phalanx-Timestamp": stamp,
        "X-Phalanx-Signature": signature(hook.secret, stamp, body),
    }
    try:
        status = post(hook.url, body, headers)
        error = "" if 200 <= status < 300 else f"HTTP {status}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:255]
    attempts = delivery.attempts + 1
    rows = AlertDelivery.objects.filter(pk=delivery.pk)
    if not error:
        rows.update(state="delivered", attempts=attempts, delivered_at=now, lease_until=None)
        return 1
    gave_up = attempts >= MAX_ATTEMPTS
    rows.update(
        state="given_up" if gave_up else "pending",
        attempts=attempts,
        last_error=error,
        next_attempt_at=now + timedelta(seconds=backoff_s(attempts)),
        lease_until=None,
    )
    log.warning(
        "webhook %s: delivery %s attempt %d failed: %s", hook.name, delivery.pk, attempts, error
    )
    return 0
