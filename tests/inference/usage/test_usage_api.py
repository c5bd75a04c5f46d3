"""``/api/usage``: a period's usage summed per caller, model or node and priced from the cost
model, one session's cost, the CSV export, the parameters refused, and who may read it."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client

from console.models import Role
from inference.models import CostModel, UsageMinute
from inference.tokens import token_issue
from tests.support.usage import (
    ALPHA,
    OPS,
    TURNS,
    cost_model_set,
    per_node_second,
    turn_figures,
    usage_rows_create,
)

pytestmark = pytest.mark.django_db


def summed(who: dict | None = None, session: str | None = None) -> dict[str, float]:
    turns = [
        turn_figures(t)
        for t in TURNS
        if (who is None or t[0] is who) and (session is None or t[2] == session)
    ]
    return {name: sum(t[name] for t in turns) for name in turns[0]} | {"requests": len(turns)}


@pytest.fixture
def rows():
    cost_model_set()
    return usage_rows_create()


@pytest.fixture
def get():
    token = token_issue(name="reader", role=Role.VIEWER)[1]

    def call(path: str):
        return Client().get(f"/api{path}", headers={"Authorization": f"Bearer {token}"})

    return call


def test_it_sums_a_period_per_caller_and_prices_it_from_the_cost_model(rows, get):
    body = get("/usage?hours=1").json()
    price = per_node_second(CostModel.load())
    alpha, everyone = summed(ALPHA), summed()
    assert body["hours"] == 1 and body["group"] == "caller" and body["currency"] == "EUR"
    totals = body["totals"]
    assert totals["requests"] == 6 and totals["errors"] == 1 and totals["tool_calls"] == 3
    assert totals["prompt_tokens"] == 2200 and totals["cached_tokens"] == 840
    assert totals["completion_tokens"] == 470
    seconds = everyone["prefill_s"] + everyone["decode_s"]
    assert totals["node_seconds"] == pytest.approx(seconds)
    assert totals["cost"] == pytest.approx(seconds * price, rel=1e-5)
    assert [row["name"] for row in body["rows"]] == ["team-alpha", "ops"]  # most costly first
    first = body["rows"][0]
    assert first["key"] == "token:7" and first["requests"] == 5 and first["sessions"] == 2
    alpha_cost = (alpha["prefill_s"] + alpha["decode_s"]) * price
    assert first["cost"] == pytest.approx(alpha_cost, rel=1e-5)
    assert first["cost_per_request"] == pytest.approx(alpha_cost / 5, rel=1e-5)
    assert first["cost_per_session"] == pytest.approx(alpha_cost / 2, rel=1e-5)
    tokens = alpha["prompt_tokens"] + alpha["completion_tokens"]
    assert first["cost_per_million_tokens"] == pytest.approx(alpha_cost / tokens * 1e6, rel=1e-5)
    # KV reuse: the cached tokens' prefill, at the prefill rate the uncached tokens measured
    uncached = alpha["prompt_tokens"] - alpha["cached_tokens"]
    saved_s = alpha["cached_tokens"] * alpha["prefill_s"] / uncached
    assert first["saved"] == pytest.approx(saved_s * price, rel=1e-5)


def test_it_draws_series_per_caller_by_minute(rows, get):
    body = get("/usage?hours=1").json()
    assert body["bucket"] == "minute"
    series = {s["name"]: s for s in body["series"]}
    assert set(series) == {"team-alpha", "ops"}
    alpha = series["team-alpha"]
    assert alpha["t"] == [(rows - timedelta(minutes=m)).isoformat() for m in (10, 5)]
    assert alpha["tokens"] == [400 + 100 + 500 + 100 + 300, 450 + 100 + 450 + 120]
    price = per_node_second(CostModel.load())
    assert alpha["cost"] == pytest.approx([4.9 * price, 5.3 * price], rel=1e-5)


@pytest.mark.parametrize(
    ("group", "keys"),
    [
        ("model", ["smollm2-135m-instruct", "gemma-3-270m"]),
        ("node", ["node-01", "node-02"]),
    ],
)
def test_it_groups_by_model_or_node(rows, get, group, keys):
    body = get(f"/usage?hours=1&group={group}").json()
    assert [row["key"] for row in body["rows"]] == keys
    assert [row["requests"] for row in body["rows"]] == [5, 1]
    assert sorted(s["name"] for s in body["series"]) == sorted(keys)


def test_a_period_counts_only_its_minutes(rows, get):
    UsageMinute.objects.create(
        minute=rows - timedelta(hours=3), requests=4, prompt_tokens=10, decode_s=1.0, **OPS
    )
    hour = {row["name"]: row["requests"] for row in get("/usage?hours=1").json()["rows"]}
    six = get("/usage?hours=6").json()
    assert hour == {"team-alpha": 5, "ops": 1}
    assert {row["name"]: row["requests"] for row in six["rows"]} == {"team-alpha": 5, "ops": 5}
    assert six["totals"]["requests"] == 10


def test_a_session_costs_its_node_seconds(rows, get):
    body = get("/usage/sessions/s-a1").json()
    session = summed(ALPHA, "s-a1")
    seconds = session["prefill_s"] + session["decode_s"]
    assert body["session_id"] == "s-a1" and body["requests"] == 3 and body["errors"] == 1
    assert body["node_seconds"] == pytest.approx(seconds)
    assert body["cost"] == pytest.approx(seconds * per_node_second(CostModel.load()), rel=1e-5)
    assert body["currency"] == "EUR"


def test_a_session_without_turns_is_a_404_naming_it(rows, get):
    response = get("/usage/sessions/s-nowhere")
    assert response.status_code == 404
    assert response.json()["detail"] == "No turns counted for session 's-nowhere'."
    assert response.json()["code"] == "session_usage_not_found"


def test_the_csv_has_a_header_and_a_row_per_minute_caller_model_and_node(rows, get):
    response = get("/usage.csv?hours=6")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="phalanx-usage-6h.csv"'
    table = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert table[0] == [
        "minute",
        "caller",
        "caller_name",
        "model",
        "package",
        "node_id",
        "requests",
        "errors",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "tool_calls",
        "prefill_s",
        "decode_s",
        "cost",
        "currency",
    ]
    body = table[1:]
    assert [(r[0], r[2], r[6]) for r in body] == [
        ((rows - timedelta(minutes=10)).isoformat(), "team-alpha", "3"),
        ((rows - timedelta(minutes=5)).isoformat(), "team-alpha", "2"),
        ((rows - timedelta(minutes=5)).isoformat(), "ops", "1"),
    ]
    ops = body[2]
    assert ops[1:6] == ["user:ops", "ops", "gemma-3-270m", "gemma-3-270m-q4_k_m:1", "node-02"]
    assert float(ops[-2]) == pytest.approx(1.2 * per_node_second(CostModel.load()), rel=1e-5)
    assert ops[-1] == "EUR"


def test_a_callers_name_that_starts_like_a_formula_is_text_in_the_csv(rows, get):
    """A token's name is free text: ``=HYPERLINK(...)`` must not run in a spreadsheet."""
    UsageMinute.objects.filter(caller_name="ops").update(
        caller_name='=HYPERLINK("http://evil","x")', node_id="@SUM(1+1)"
    )
    response = get("/usage.csv?hours=6")
    table = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    ops = next(r for r in table if r[1] == "user:ops")
    assert ops[2] == '\'=HYPERLINK("http://evil","x")' and ops[5] == "'@SUM(1+1)"
    assert [r[2] for r in table[1:3]] == ["team-alpha", "team-alpha"]  # plain names untouched


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("/usage?hours=lots", "hours", "valid number"),
        ("/usage?hours=0", "hours", "greater than 0"),
        ("/usage?hours=-2", "hours", "greater than 0"),
        ("/usage?hours=2161", "hours", "less than or equal to 2160"),
        ("/usage?hours=nan", "hours", "finite number"),
        ("/usage?hours=inf", "hours", "finite number"),
        ("/usage?group=team", "group", "'caller', 'model' or 'node'"),
        ("/usage.csv?hours=0", "hours", "greater than 0"),
    ],
)
def test_a_bad_parameter_is_a_422_naming_it(get, query, field, words):
    response = get(query)
    assert response.status_code == 422
    body = response.json()
    assert body["field"] == field and body["detail"].startswith(f"{field}: ")
    assert words in body["detail"]


@pytest.mark.parametrize("path", ["/usage", "/usage.csv", "/usage/sessions/s-a1"])
def test_anonymous_callers_are_refused(rows, path):
    response = Client().get(f"/api{path}")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
