"""The central log store (console/lib/log_store.py): a node ships its records with its own
credential, an operator finds them by request id, session, node, level and time, pages and
exports them, and retention removes the old and the excess."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.lib.log_store import records_store, records_trim
from console.models import LogRecord
from nodes.credentials import node_credential

pytestmark = pytest.mark.django_db

CREDENTIAL_LIKE = "phx2." + "cd34" * 16


@pytest.fixture(autouse=True)
def empty_store() -> None:
    """Job processes that earlier tests started on this database shipped records of their
    own (committed by them, outside any test's transaction): each test starts without."""
    LogRecord.objects.all().delete()


def line(event: str, **fields) -> str:
    return json.dumps({"event": event, "level": "info", "process": "runnode", **fields})


def ship(node_id: str, body: str, credential: str | None = None):
    credential = credential if credential is not None else node_credential(node_id)
    return Client().post(
        f"/api/nodes/self/logs?node_id={node_id}",
        data=body,
        content_type="application/x-ndjson",
        headers={"Authorization": f"Bearer {credential}"},
    )


def test_a_node_ships_its_records_and_they_are_stamped_with_its_id(node) -> None:
    body = "\n".join(
        [
            line("chat answered", request_id="req-1", session_id="s-1", node_id="node-99"),
            line("prefix reused", request_id="req-1", tokens=12),
            "",
        ]
    )
    response = ship("node-01", body)
    assert response.status_code == 200, response.content
    assert response.json() == {"stored": 2, "rejected": 0, "problem": ""}
    rows = list(LogRecord.objects.order_by("id"))
    assert [r.node_id for r in rows] == ["node-01", "node-01"]  # not the node-99 it claimed
    assert rows[0].request_id == "req-1" and rows[0].session_id == "s-1"
    assert rows[1].fields == {"tokens": 12}


def test_a_node_without_its_credential_ships_nothing(node) -> None:
    assert ship("node-01", line("x"), credential="phx1." + "0" * 64).status_code == 401
    assert ship("node-02", line("x"), credential=node_credential("node-01")).status_code == 401
    assert not LogRecord.objects.exists()


def test_lines_that_are_not_records_are_named_and_the_others_kept(node) -> None:
    body = "\n".join([line("kept"), "{not json", json.dumps({"level": "info"}), "[1]"])
    response = ship("node-01", body)
    assert response.status_code == 200
    assert response.json()["stored"] == 1 and response.json()["rejected"] == 3
    assert response.json()["problem"].startswith("line 2: not JSON")
    only_bad = ship("node-01", json.dumps({"event": "x", "level": "loud"}))
    assert only_bad.status_code == 422
    assert "level: 'loud' is not one of" in only_bad.json()["detail"]


def test_a_shipped_secret_is_redacted_where_it_is_kept(node) -> None:
    ship("node-01", line(f"joined with {CREDENTIAL_LIKE}", token=f"Bearer {CREDENTIAL_LIKE}"))
    row = LogRecord.objects.get()
    assert CREDENTIAL_LIKE not in row.event + json.dumps(row.fields)


def seed() -> None:
    now = timezone.now()
    lines = []
    for i in range(30):
        level = "error" if i % 10 == 0 else "info"
        moment = (now - timedelta(minutes=30 - i)).isoformat()
        lines.append(line(f"turn {i}", level=level, time=moment, request_id=f"r-{i % 3}"))
    records_store(lines, node_id="node-01")


def test_the_api_filters_pages_and_exports(api) -> None:
    seed()
    page = api("viewer", "get", "/logs?request_id=r-1&limit=4").json()
    assert [r["event"] for r in page["records"]] == ["turn 28", "turn 25", "turn 22", "turn 19"]
    assert all(r["process"] == "runnode" and r["node_id"] == "node-01" for r in page["records"])
    rest = api("viewer", "get", f"/logs?request_id=r-1&before={page['next_before']}").json()
    assert len(rest["records"]) == 6 and rest["next_before"] is None
    errors = api("viewer", "get", "/logs?level=error").json()["records"]
    assert [r["event"] for r in errors] == ["turn 20", "turn 10", "turn 0"]
    since = (timezone.now() - timedelta(minutes=5, seconds=30)).isoformat()
    recent = api("viewer", "get", "/logs", data={"since": since}).json()["records"]
    assert [r["event"] for r in recent] == [f"turn {i}" for i in range(29, 24, -1)]
    export = api("viewer", "get", "/logs?format=jsonl&node_id=node-01")
    assert export["Content-Type"] == "application/x-ndjson"
    lines = b"".join(export.streaming_content).decode().splitlines()
    assert len(lines) == 30 and json.loads(lines[-1])["event"] == "turn 0"


@pytest.mark.parametrize(
    ("query", "field"),
    [("level=loud", "level"), ("since=yesterday", "since"), ("limit=0", "limit")],
)
def test_a_query_that_cannot_be_asked_is_a_422_naming_it(api, query, field) -> None:
    response = api("viewer", "get", f"/logs?{query}")
    assert response.status_code == 422 and response.json()["field"] == field


def test_retention_removes_old_records_then_the_oldest_past_the_size_bound() -> None:
    seed()
    assert records_trim(max_age_s=10 * 60 + 30, max_bytes=1 << 30) == 20
    assert LogRecord.objects.count() == 10
    sizes = sum(LogRecord.objects.values_list("size", flat=True))
    newest_four = sum(LogRecord.objects.order_by("-id").values_list("size", flat=True)[:4])
    assert records_trim(max_age_s=3600, max_bytes=newest_four) == 6
    kept = list(LogRecord.objects.order_by("id").values_list("event", flat=True))
    assert kept == ["turn 26", "turn 27", "turn 28", "turn 29"] and sizes > newest_four


def test_lines_a_node_could_send_are_kept_or_named_never_a_500(node) -> None:
    body = "\n".join(
        [
            '{"event": "rate", "tokens_per_s": NaN, "level": "info"}',
            '{"event": "cut \\ud800 here", "level": "info"}',
            "[" * 100_000 + "]" * 100_000,
            '{"event": "x", "time": "2026-13-45T00:00:00"}',
            '{"event": "x", "time": "0001-01-01T00:00:00+05:00"}',
            '{"event": "ahead", "time": "2999-01-01T00:00:00Z"}',
        ]
    )
    response = ship("node-01", body)
    assert response.status_code == 200, response.content
    assert response.json()["stored"] == 3 and response.json()["rejected"] == 3
    rows = {r.event: r for r in LogRecord.objects.all()}
    assert rows["rate"].fields == {"tokens_per_s": "nan"}
    assert "cut" in next(e for e in rows if e.startswith("cut"))
    assert rows["ahead"].time.year < 2999 and rows["ahead"].fields["shipped_time"].startswith(
        "2999"
    )


def test_secrets_nested_in_fields_or_keys_are_redacted(node) -> None:
    record = {
        "event": "e",
        "nested": {"tok": "phx_" + "a" * 20, "auth": "Bearer zzz"},
        "list": ["f" * 64],
        "phx_" + "b" * 20: 1,
    }
    ship("node-01", json.dumps(record))
    stored = json.dumps(LogRecord.objects.get().fields)
    for secret in ("a" * 20, "zzz", "f" * 64, "b" * 20):
        assert secret not in stored


def test_a_request_past_the_record_bound_is_refused_whole(node) -> None:
    response = ship("node-01", "\n".join([line("x")] * 10_001))
    assert response.status_code == 422 and "at most 10000 records" in response.json()["detail"]
    assert not LogRecord.objects.exists()


@pytest.mark.parametrize("query", ["until=2026-02-30T00:00", "since=9999-12-31T23:59:59-05:00"])
def test_a_date_that_does_not_exist_is_a_422(api, query) -> None:
    assert api("viewer", "get", f"/logs?{query}").status_code == 422
