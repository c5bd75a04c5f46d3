"""Alert state changes: the control loop's evaluation (``alerts_evaluate``) and the
operator's acknowledge and resolve. Every firing and every resolving queues one delivery per
enabled webhook (``inference.alerts.webhooks``) in the same transaction. Transitions are
conditional UPDATEs, so two control-plane replicas evaluating at once fire an alert once.
docs/alerts.md."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from django.utils import timezone

from console.lib.audit import audit_record, current_actor
from console.lib.errors import Conflict, Invalid, NotFound
from inference.alerts.models import Alert, AlertSettings, AlertWebhook
from inference.alerts.rules import Finding, evaluate
from inference.alerts.snapshot import snapshot_take
from inference.alerts.webhooks import deliveries_queue

log = logging.getLogger(__name__)


def alerts_evaluate(*, now: datetime | None = None) -> list[tuple[Alert, str]]:
    """One round: take the snapshot, run every rule, apply the findings. Returns the
    transitions made, ``[(alert, "firing" | "resolved")]``. The control loop calls it every
    health-check interval (``inference.apps``)."""
    now = now or timezone.now()
    started = time.monotonic()
    settings = AlertSettings.load()
    findings = evaluate(snapshot_take(now=now, settings=settings), settings)
    moves = alerts_apply(findings, now=now)
    log.debug("alerts evaluated in %.1f ms", (time.monotonic() - started) * 1000)
    return moves


def alerts_apply(findings: Iterable[Finding], *, now: datetime) -> list[tuple[Alert, str]]:
    """Findings -> alert rows: a new or resolved (rule, subject) fires; an open one keeps its
    state (acknowledged stays acknowledged) with the new value and ``last_seen_at``; an open
    one without a finding resolves. Returns the transitions."""
    open_alerts = {(a.rule, a.subject): a for a in Alert.objects.filter(state__in=Alert.OPEN)}
    moves: list[tuple[Alert, str]] = []
    for f in findings:
        alert = open_alerts.pop((f.rule, f.subject), None)
        if alert is not None:
            Alert.objects.filter(pk=alert.pk).update(
                value=f.value, message=f.message, last_seen_at=now
            )
            continue
        fired = _fire(f, now)
        if fired is not None:
            moves.append((fired, Alert.State.FIRING))
    for alert in open_alerts.values():
        if _resolve(alert, now=now, by=""):
            moves.append((alert, Alert.State.RESOLVED))
    return moves


def _fire(f: Finding, now: datetime) -> Alert | None:
    """Open the alert of ``f`` (a new row, or the resolved one firing anew); None when another
    evaluator did it first."""
    fields = {"value": f.value, "message": f.message, "first_seen_at": now, "last_seen_at": now}
    try:
        with transaction.atomic():
            alert, created = Alert.objects.get_or_create(
                rule=f.rule, subject=f.subject, defaults={**fields, "state": Alert.State.FIRING}
            )
            if not created:
                again = Alert.objects.filter(pk=alert.pk, state=Alert.State.RESOLVED).update(
                    **fields,
                    state=Alert.State.FIRING,
                    fired_count=alert.fired_count + 1,
                    acknowledged_at=None,
                    acknowledged_by="",
                    resolved_at=None,
                    resolved_by="",
                )
                if not again:
                    return None
                alert.refresh_from_db()
            deliveries_queue(alert, event=Alert.State.FIRING, now=now)
    except IntegrityError:  # another replica created it between our read and write
        return None
    log.warning("alert firing: %s %s: %s", f.rule, f.subject, f.message)
    return alert


def _resolve(alert: Alert, *, now: datetime, by: str) -> bool:
    """Open -> resolved (``by``: who, empty when the condition cleared), queueing the
    deliveries; False when it was not open any more."""
    with transaction.atomic():
        done = Alert.objects.filter(pk=alert.pk, state__in=Alert.OPEN).update(
            state=Alert.State.RESOLVED, resolved_at=now, resolved_by=by
        )
        if not done:
            return False
        alert.refresh_from_db()
        deliveries_queue(alert, event=Alert.State.RESOLVED, now=now)
    log.info("alert resolved: %s %s%s", alert.rule, alert.subject, f" by {by}" if by else "")
    return True


def _get(alert_id: int) -> Alert:
    alert = Alert.objects.filter(pk=alert_id).first()
    if alert is None:
        raise NotFound(f"No alert {alert_id}.")
    return alert


def alert_acknowledge(*, alert_id: int) -> Alert:
    """Firing -> acknowledged by the current actor (audited). Raises ``NotFound``, or
    ``Conflict`` when the alert is not firing."""
    alert = _get(alert_id)
    actor = current_actor()
    with transaction.atomic():
        done = Alert.objects.filter(pk=alert.pk, state=Alert.State.FIRING).update(
            state=Alert.State.ACKNOWLEDGED, acknowledged_at=timezone.now(), acknowledged_by=actor
        )
        if not done:
            raise Conflict(f"Alert {alert_id} is {alert.state}, not firing.", code="not_firing")
        audit_record(
            action="alert.acknowledge",
            target=f"{alert.rule} {alert.subject}",
            changes=["state: firing -> acknowledged"],
        )
    alert.refresh_from_db()
    return alert


def alert_resolve(*, alert_id: int) -> Alert:
    """Firing or acknowledged -> resolved by the current actor (audited; the resolving is sent
    to the webhooks). If the condition still holds, the next evaluation fires it anew.
    Raises ``NotFound``, or ``Conflict`` when it is resolved already."""
    alert = _get(alert_id)
    before = alert.state
    with transaction.atomic():
        if not _resolve(alert, now=timezone.now(), by=current_actor()):
            raise Conflict(f"Alert {alert_id} is resolved already.", code="resolved")
        audit_record(
            action="alert.resolve",
            target=f"{alert.rule} {alert.subject}",
            changes=[f"state: {before} -> resolved"],
        )
    return alert


def _checked_url(url: str) -> str:
    """``url`` when it is an absolute http(s) URL with a host and no credentials in it, else
    ``Invalid`` naming the field ``url``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Invalid("url: an absolute http:// or https:// URL is needed.", field="url")
    if parts.username or parts.password:
        raise Invalid(
            "url: no credentials in the URL; the secret signs each delivery.", field="url"
        )
    if len(url) > 500:
        raise Invalid("url: at most 500 characters.", field="url")
    return url.strip()


def _checked_secret(secret: str) -> str:
    if len(secret) < 16 or len(secret) > 200:
        raise Invalid("secret: 16 to 200 characters.", field="secret")
    return secret


def webhook_create(*, name: str, url: str, secret: str, enabled: bool = True) -> AlertWebhook:
    """A new webhook (audited, the secret never in the entry). Raises ``Invalid`` (field
    ``name``, ``url`` or ``secret``) or ``Conflict`` when the name is taken."""
    if not name.strip() or len(name) > 64:
        raise Invalid("name: 1 to 64 characters.", field="name")
    url, secret = _checked_url(url), _checked_secret(secret)
    with transaction.atomic():
        if AlertWebhook.objects.filter(name=name).exists():
            raise Conflict(f"A webhook named {name!r} exists.", field="name")
        hook = AlertWebhook.objects.create(name=name, url=url, secret=secret, enabled=enabled)
        audit_record(action="alert_webhook.create", target=name, changes=[f"url: {url}"])
    return hook


def webhook_update(
    *,
    webhook_id: int,
    url: str | None = None,
    secret: str | None = None,
    enabled: bool | None = None,
) -> AlertWebhook:
    """Change a webhook's URL, secret (write-only) or enabled flag (audited). Raises
    ``NotFound`` or ``Invalid``."""
    hook = AlertWebhook.objects.filter(pk=webhook_id).first()
    if hook is None:
        raise NotFound(f"No webhook {webhook_id}.")
    changes = []
    if url is not None and _checked_url(url) != hook.url:
        changes.append(f"url: {hook.url} -> {url.strip()}")
        hook.url = url.strip()
    if secret is not None:
        hook.secret = _checked_secret(secret)
        changes.append("secret: changed")
    if enabled is not None and enabled != hook.enabled:
        changes.append(f"enabled: {hook.enabled} -> {enabled}")
        hook.enabled = enabled
    with transaction.atomic():
        hook.save()
        audit_record(action="alert_webhook.update", target=hook.name, changes=changes)
    return hook


def webhook_delete(*, webhook_id: int) -> None:
    """Remove a webhook and its deliveries (audited). Raises ``NotFound``."""
    hook = AlertWebhook.objects.filter(pk=webhook_id).first()
    if hook is None:
        raise NotFound(f"No webhook {webhook_id}.")
    with transaction.atomic():
        hook.delete()
        audit_record(action="alert_webhook.delete", target=hook.name)
