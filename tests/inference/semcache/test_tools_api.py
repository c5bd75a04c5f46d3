"""``/v1/cache/tools`` for agent runtimes (and its Python client), false-hit reports and the
operators' ``/api/cache``: per-tool opt-in, equivalent arguments hit, near-misses do not,
bad input is refused where it enters."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from inference.semcache.client import ToolCache

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fresh(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    settings.REDIS_URL = None
    monkeypatch.setenv("PHALANX_API_TOKEN", "env-secret")
    return {"Authorization": "Bearer env-secret"}


def post(path: str, auth: dict, body: object, **headers):
    return Client().post(
        path, json.dumps(body), content_type="application/json", headers={**auth, **headers}
    )


def enable(auth: dict, tool: str, **rules) -> dict:
    response = Client().put(
        f"/api/cache/namespaces/tools:{tool}",
        json.dumps(rules),
        content_type="application/json",
        headers=auth,
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_a_tool_is_cached_only_once_an_operator_enables_it(fresh):
    call = {"tool": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    refused = post("/v1/cache/tools", fresh, {**call, "result": {"temp_c": 18}})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "tool_not_cached"
    assert post("/v1/cache/tools/lookup", fresh, call).json()["hit"] is False
    assert enable(fresh, "get_weather")["enabled"] is True
    assert post("/v1/cache/tools", fresh, {**call, "result": {"temp_c": 18}}).status_code == 201
    reordered = {"tool": "get_weather", "arguments": {"days": 2, "city": "Paris"}}
    found = post("/v1/cache/tools/lookup", fresh, reordered)
    assert found["X-Phalanx-Cache"] == "hit"
    assert found.json()["result"] == {"temp_c": 18} and found.json()["exact"] is True
    other_city = {"tool": "get_weather", "arguments": {"city": "Lyon", "days": 2}}
    assert post("/v1/cache/tools/lookup", fresh, other_city).json()["hit"] is False
    bypassed = post("/v1/cache/tools/lookup", fresh, reordered, **{"X-Phalanx-Cache": "bypass"})
    assert bypassed["X-Phalanx-Cache"] == "bypass" and bypassed.json()["hit"] is False


def test_the_client_calls_the_tool_once_for_equivalent_arguments(fresh, live_server):
    enable(fresh, "search_web")
    calls = []

    def search_web(query: str) -> list[str]:
        calls.append(query)
        return [f"result for {query}"]

    cache = ToolCache(live_server.url, "env-secret")
    first = cache.call("search_web", {"query": "cheap flights to Rome"}, search_web)
    second = cache.call("search_web", {"query": "low-cost flights to Rome"}, search_web)
    third = cache.call("search_web", {"query": "cheap flights to Oslo"}, search_web)
    assert calls == ["cheap flights to Rome", "cheap flights to Oslo"]
    assert second == first and third == ["result for cheap flights to Oslo"]
    assert cache.last.hit is False and cache.last.reason


def test_a_false_hit_report_removes_the_entry_and_shows_in_the_report(fresh):
    enable(fresh, "lookup_order", threshold=0.8, ttl_s=600, max_entries=100)
    call = {"tool": "lookup_order", "arguments": {"order": "status of my last order"}}
    entry = post("/v1/cache/tools", fresh, {**call, "result": "shipped"}).json()["id"]
    report = post("/v1/cache/false-hits", fresh, {"id": entry, "query": "x", "note": "stale"})
    assert report.status_code == 201 and report.json()["namespace"] == "tools:lookup_order"
    assert post("/v1/cache/tools/lookup", fresh, call).json()["hit"] is False
    again = post("/v1/cache/false-hits", fresh, {"id": entry})
    assert again.status_code == 404
    shown = Client().get("/api/cache", headers=fresh).json()
    [row] = [n for n in shown["namespaces"] if n["name"] == "tools:lookup_order"]
    assert row["false_hits"] == 1 and row["threshold"] == 0.8 and row["entries"] == 0
    assert shown["false_hits"][0]["note"] == "stale"


def test_operators_invalidate_by_tool_and_age(fresh):
    for tool in ("a_tool", "b_tool"):
        enable(fresh, tool)
        post("/v1/cache/tools", fresh, {"tool": tool, "arguments": {"q": 1}, "result": 1})
    kept = Client().post(
        "/api/cache/invalidate", json.dumps({"namespace": "tools:", "older_than_s": 3600}),
        content_type="application/json", headers=fresh,
    )  # fmt: skip
    assert kept.json() == {"removed": 0}
    gone = Client().post(
        "/api/cache/invalidate", json.dumps({"namespace": "tools:a_tool"}),
        content_type="application/json", headers=fresh,
    )  # fmt: skip
    assert gone.json() == {"removed": 1}
    hits = [
        post("/v1/cache/tools/lookup", fresh, {"tool": t, "arguments": {"q": 1}}).json()["hit"]
        for t in ("a_tool", "b_tool")
    ]
    assert hits == [False, True]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tool": "bad name!", "arguments": {}}, "tool"),
        ({"tool": "t", "arguments": [1, 2]}, "arguments"),
        ({"tool": "t", "arguments": {"q": "x" * 70000}}, "arguments"),
        ({"tool": "t", "arguments": {}}, "result"),
        ({"tool": "t", "arguments": {}, "result": "x" * 300000}, "result"),
        ({"tool": "t", "arguments": {}, "result": 1, "ttl_s": -5}, "ttl_s"),
    ],
)
def test_bad_input_is_refused_naming_the_field(fresh, body, field):
    response = post("/v1/cache/tools", fresh, body)
    assert response.status_code == 400 and response.json()["error"]["param"] == field


def test_a_namespace_name_that_is_not_tools_or_answers_is_refused(fresh):
    response = Client().put(
        "/api/cache/namespaces/other:x", "{}", content_type="application/json", headers=fresh
    )
    assert response.status_code == 422 and "tools:<tool>" in response.content.decode()


def test_an_admin_opts_a_token_in_to_cached_answers(fresh):
    from inference.tokens import token_create

    token, _ = token_create(name="agent")
    response = Client().patch(
        f"/api/tokens/{token.pk}",
        json.dumps({"cache_answers": True}),
        content_type="application/json",
        headers=fresh,
    )
    assert response.status_code == 200 and response.json()["cache_answers"] is True
    token.refresh_from_db()
    assert token.cache_answers is True


@pytest.mark.parametrize(
    "body",
    [[], None, 5, "tools:other", {"namspace": "tools:other"}, {}],
)
def test_an_invalidation_that_does_not_say_what_removes_nothing(fresh, body):
    enable(fresh, "keep_me")
    post("/v1/cache/tools", fresh, {"tool": "keep_me", "arguments": {"q": 1}, "result": 1})
    response = Client().post(
        "/api/cache/invalidate", json.dumps(body), content_type="application/json", headers=fresh
    )
    assert response.status_code in (400, 422)
    assert post("/v1/cache/tools/lookup", fresh, {"tool": "keep_me", "arguments": {"q": 1}}).json()[
        "hit"
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": 10**30}, "id"),
        ({"id": str(10**30)}, "id"),
        ({"id": "²"}, "id"),
        ({"id": "١٢"}, "id"),
        ({"id": True}, "id"),
    ],
)
def test_a_false_hit_report_with_an_impossible_id_is_refused(fresh, body, field):
    response = post("/v1/cache/false-hits", fresh, body)
    assert response.status_code == 400 and response.json()["error"]["param"] == field


def test_a_huge_ttl_is_refused_and_a_bad_lookup_header_too(fresh):
    enable(fresh, "t")
    huge = post(
        "/v1/cache/tools", fresh, {"tool": "t", "arguments": {}, "result": 1, "ttl_s": 10**400}
    )
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "ttl_s"
    odd = post(
        "/v1/cache/tools/lookup",
        fresh,
        {"tool": "t", "arguments": {}},
        **{"X-Phalanx-Cache": "maybe"},
    )
    assert odd.status_code == 400 and "X-Phalanx-Cache" in odd.json()["error"]["message"]


def test_a_token_in_another_case_is_another_argument(fresh):
    enable(fresh, "auth_check")
    post(
        "/v1/cache/tools",
        fresh,
        {"tool": "auth_check", "arguments": {"token": "xYzAbC", "on": True}, "result": "ok"},
    )
    other = {"tool": "auth_check", "arguments": {"token": "XyZaBc", "on": True}}
    assert post("/v1/cache/tools/lookup", fresh, other).json()["hit"] is False
    same_city = {"tool": "auth_check", "arguments": {"token": "xYzAbC", "on": True}}
    assert post("/v1/cache/tools/lookup", fresh, same_city).json()["hit"] is True


def test_the_client_serves_a_cached_none_and_never_loses_a_result_json_cannot_hold(
    fresh, live_server
):
    import datetime

    enable(fresh, "maybe_none")
    enable(fresh, "clock")
    runs = []

    def maybe_none(q: str) -> None:
        runs.append(q)

    cache = ToolCache(live_server.url, "env-secret")
    assert cache.call("maybe_none", {"q": "x"}, maybe_none) is None
    assert cache.call("maybe_none", {"q": "x"}, maybe_none) is None
    assert runs == ["x"] and cache.last.hit is True
    now = cache.call("clock", {"zone": "UTC"}, lambda zone: datetime.datetime.now())
    assert isinstance(now, datetime.datetime)  # run, returned, not stored
