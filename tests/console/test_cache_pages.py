"""The Cache page: what a viewer reads (a namespace's hits and a false-hit report) and what a
viewer may not do (change rules, invalidate)."""

from __future__ import annotations

import pytest

from inference.semcache import service
from inference.semcache.cache import tool_text
from inference.semcache.store import Entry


@pytest.fixture
def cache_home(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.REDIS_URL = None


@pytest.mark.django_db
def test_a_viewer_reads_hits_and_false_hit_reports(login, cache_home) -> None:
    service.namespace_save(
        "tools:get_weather", enabled=True, threshold=0.8, ttl_s=600, max_entries=100
    )
    rules = service.rules_for("tools:get_weather")
    cache = service.the_cache()
    text = tool_text("get_weather", {"city": "Oslo"})
    entry = cache.put(Entry("tools:get_weather", "", "", text, '"cold"', 0.0, 0.0), rules)
    cache.lookup("tools:get_weather", "", text, rules)
    cache.lookup("tools:get_weather", "", tool_text("get_weather", {"city": "Bergen"}), rules)
    cache.report_false_hit(
        entry.id, "weather in Oslo next week", 1.0, "it was a forecast for today"
    )
    page = login("viewer").get("/cache/").content.decode()
    assert 'data-namespace="tools:get_weather"' in page and "50 %" in page
    assert "it was a forecast for today" in page and "weather in Oslo next week" in page
    assert 'id="namespace-form"' not in page  # a viewer changes nothing


@pytest.mark.django_db
def test_a_viewer_cannot_invalidate(login, cache_home) -> None:
    response = login("viewer").post("/cache/invalidate/", {"namespace": ""})
    assert response.status_code == 403
