"""Alerts end to end: a node goes down, the control loop's alert work fires an alert and
delivers it signed to a real local receiver, an operator acknowledges it, the node comes back
and the resolving is delivered; retries; webhook input; the page; the Prometheus rules file."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shutil
import subprocess
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from django.utils import timezone

from console.lib.metrics import prometheus_text
from console.lib.steps import registered
from console.models import AuditEntry
from inference.alerts.models import Alert, AlertDelivery, AlertSettings, AlertWebhook
from inference.alerts.prometheus import rules_document, rules_yaml
from inference.alerts.services import alerts_evaluate, webhook_create
from inference.alerts.webhooks import MAX_ATTEMPTS, deliveries_send_due
from nodes.control import ControlLoop
from nodes.models import Node
from tests.fakenode import FakeNode

SECRET = "s3cret-s3cret-s3cret"


class Receiver:
    """A webhook receiver on 127.0.0.1: records (headers, body); answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status, self.got = status, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((dict(self.headers), body))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _verified(headers: dict, body: bytes) -> dict:
    stamp = headers["X-Phalanx-Timestamp"]
    want = hmac.new(SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Phalanx-Signature"], "sha256=" + want)
    return json.loads(body)


def test_it_fires_delivers_signed_is_acknowledged_and_resolves(package, receiver, api):
    fake = FakeNode("node-01").start()
    try:
        Node.objects.create(
            node_id="node-01", address=fake.address, package=package, validation="passed"
        )
        webhook_create(name="ops", url=receiver.url, secret=SECRET)
        loop = ControlLoop()
        loop.tick()
        assert alerts_evaluate() == []
        fake.health_status = 503
        for _ in range(3):
            loop.tick()
        assert Node.objects.get().state == Node.State.DOWN
        [(alert, event)] = alerts_evaluate()
        assert (alert.rule, alert.subject, event) == ("node_down", "node:node-01", "firing")
        assert deliveries_send_due() == 1
        [(headers, body)] = receiver.got
        sent = _verified(headers, body)
        assert sent["event"] == "firing" and sent["alert"]["rule"] == "node_down"
        assert SECRET not in json.dumps(dict(headers)) + body.decode()

        answer = api("operator", "post", f"/alerts/{alert.pk}/acknowledge")
        assert answer.status_code == 200 and answer.json()["state"] == "acknowledged"
        assert AuditEntry.objects.filter(action="alert.acknowledge").exists()
        assert alerts_evaluate() == []  # still down: stays acknowledged, nothing sent
        assert Alert.objects.get().state == "acknowledged"

        fake.health_status = 200
        for _ in range(2):
            loop.tick()
        assert Node.objects.get().state == Node.State.UP
        [(_, event)] = alerts_evaluate()
        assert event == "resolved" and Alert.objects.get().state == "resolved"
        assert deliveries_send_due() == 1
        assert _verified(*receiver.got[1])["event"] == "resolved"
        listed = api("viewer", "get", "/alerts?state=resolved").json()
        assert [a["rule"] for a in listed] == ["node_down"]
    finally:
        fake.stop()


def test_it_is_work_the_control_loop_runs():
    names = {getattr(item, "name", None) for item in registered()}
    assert {"alerts", "alert webhooks"} <= names


def _down_alert(package) -> Alert:
    Node.objects.create(
        node_id="node-02", address="127.0.0.1:1", package=package, state=Node.State.DOWN
    )
    [(alert, _)] = alerts_evaluate()
    return alert


def test_it_retries_a_failing_receiver_then_gives_up(package):
    bad = Receiver(status=500)
    try:
        webhook_create(name="flaky", url=bad.url, secret=SECRET)
        _down_alert(package)
        now = timezone.now()
        for i in range(MAX_ATTEMPTS):
            assert deliveries_send_due(now=now + timedelta(hours=i)) == 0
        delivery = AlertDelivery.objects.get()
        assert delivery.state == "given_up" and delivery.attempts == MAX_ATTEMPTS
        assert delivery.last_error == "HTTP 500"
        assert len(bad.got) == MAX_ATTEMPTS
        assert len({h["X-Phalanx-Delivery"] for h, _ in bad.got}) == 1
        assert (
            deliveries_send_due(now=now + timedelta(days=1)) == 0 and len(bad.got) == MAX_ATTEMPTS
        )
    finally:
        bad.close()


def test_it_retries_after_the_backoff_not_before(package, receiver):
    receiver.status = 503
    webhook_create(name="ops", url=receiver.url, secret=SECRET)
    _down_alert(package)
    now = timezone.now()
    deliveries_send_due(now=now)
    receiver.status = 200
    assert deliveries_send_due(now=now + timedelta(seconds=1)) == 0  # backing off
    assert deliveries_send_due(now=now + timedelta(seconds=30)) == 1
    assert AlertDelivery.objects.get().state == "delivered" and len(receiver.got) == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "url": "ftp://example.com/", "secret": SECRET}, "url"),
        ({"name": "x", "url": "http://u:p@example.com/", "secret": SECRET}, "url"),
        ({"name": "x", "url": "not a url", "secret": SECRET}, "url"),
        ({"name": "x", "url": "https://example.com/h", "secret": "short"}, "secret"),
    ],
)
def test_it_refuses_bad_webhook_input_naming_the_field(api, body, field):
    answer = api("admin", "post", "/alert-webhooks", body)
    assert answer.status_code == 422 and answer.json()["field"] == field
    assert not AlertWebhook.objects.exists()


def test_it_never_shows_the_secret_and_needs_admin(api):
    assert api("operator", "post", "/alert-webhooks", {"name": "x"}).status_code == 403
    made = api(
        "admin",
        "post",
        "/alert-webhooks",
        {"name": "o", "url": "https://e.com/h", "secret": SECRET},
    )
    assert made.status_code == 201 and SECRET not in made.content.decode()
    hook = made.json()["id"]
    listed = api("admin", "get", "/alert-webhooks")
    assert SECRET not in listed.content.decode()
    patched = api("admin", "patch", f"/alert-webhooks/{hook}", {"enabled": False})
    assert patched.json()["enabled"] is False
    assert not any(SECRET in " ".join(e.changes) for e in AuditEntry.objects.all())
    assert api("admin", "delete", f"/alert-webhooks/{hook}").status_code == 204


def test_it_refuses_acknowledging_a_resolved_alert(package, api):
    alert = _down_alert(package)
    assert api("viewer", "post", f"/alerts/{alert.pk}/resolve").status_code == 403
    assert api("operator", "post", f"/alerts/{alert.pk}/resolve").status_code == 200
    assert api("operator", "post", f"/alerts/{alert.pk}/acknowledge").status_code == 409
    [(again, event)] = alerts_evaluate()  # still down: fires anew
    assert event == "firing" and again.fired_count == 2


def test_the_page_lists_firing_alerts_with_the_count_in_the_nav(package, login):
    alert = _down_alert(package)
    page = login("operator").get("/alerts/").content.decode()
    assert 'id="alerts-firing"' in page and "node:node-02" in page and "Acknowledge" in page
    client = login("operator")
    answer = client.post(f"/alerts/{alert.pk}/acknowledge/", {"state": "open"})
    assert answer.status_code == 302 and Alert.objects.get().state == "acknowledged"
    viewer = login("viewer").get("/alerts/?state=acknowledged").content.decode()
    assert "node:node-02" in viewer and "<button>Acknowledge" not in viewer


def _served_names(package) -> set[str]:
    Node.objects.create(
        node_id="node-03",
        address="127.0.0.1:1",
        package=package,
        state=Node.State.UP,
        last_seen_load={
            "requests": 1,
            "failed": 0,
            "ttft_p95": 0.1,
            "queue": 0,
            "total": 4,
            "restores_skipped": 0,
            "restored": 0,
        },
    )
    text = prometheus_text()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_the_prometheus_rules_name_only_metrics_our_metrics_serves(package, api):
    served = _served_names(package)
    doc = yaml.safe_load(api("viewer", "get", "/alerts/rules.yaml").content)
    assert doc == rules_document(AlertSettings.load())
    [group] = doc["groups"]
    assert len(group["rules"]) == 9
    for rule in group["rules"]:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert rule["alert"].isidentifier() and rule["annotations"]["summary"]
        named = set(re.findall(r"phalanx_[a-z0-9_]+", rule["expr"]))
        assert named and named <= served, named - served


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_rules_file(db, tmp_path):
    path = tmp_path / "phalanx.rules.yaml"
    path.write_text(rules_yaml(AlertSettings.load()))
    run = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
