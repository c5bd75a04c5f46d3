"""The Usage page: what a viewer reads (the period's totals, the top consumers with their cost
in the cost model's currency, quota use, the CSV link) and the empty state."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from console.models import Role
from inference.models import CostModel, Quota, RateWindow
from inference.tokens import token_issue
from inference.usage import limits
from tests.console.test_pages import visible_text
from tests.support.usage import (
    ALPHA,
    TURNS,
    cost_model_set,
    per_node_second,
    turn_figures,
    usage_rows_create,
)

pytestmark = pytest.mark.django_db


def money(value: float) -> str:
    """Six significant figures, written out (how the page writes an amount)."""
    return format(Decimal(f"{value:.6g}"), "f")


def price() -> float:
    return per_node_second(CostModel.load())


def row_text(page: str, caller: str) -> str:
    row = re.search(rf'<tr data-caller="{re.escape(caller)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {caller}"
    return " ".join(re.sub(r"<[^>]+>", " ", row.group(1)).split())


def test_a_viewer_reads_the_top_consumers_and_their_cost(login):
    cost_model_set()
    usage_rows_create()
    response = login("viewer").get("/usage/?hours=1")
    assert response.status_code == 200
    text = visible_text(response)
    assert "Cost (EUR)" in text and "Saved by KV reuse (EUR)" in text
    page = response.content.decode()
    alpha = [turn_figures(t) for t in TURNS if t[0] is ALPHA]
    seconds = sum(t["prefill_s"] + t["decode_s"] for t in alpha)
    cost = seconds * price()
    # name, requests, errors, prompt, cached, completion, tool calls, node-seconds, cost, per
    # request, per million tokens, per session (2 sessions)
    assert row_text(page, "token:7").startswith(
        f"team-alpha 5 1 2100 840 420 3 {seconds:.2f} {money(cost)} {money(cost / 5)} "
        f"{money(cost / 2520 * 1e6)} {money(cost / 2)}"
    )
    assert row_text(page, "user:ops").startswith(f"ops 1 0 100 0 50 0 1.20 {money(1.2 * price())}")
    assert page.index('data-caller="token:7"') < page.index('data-caller="user:ops"')
    assert 'href="/api/usage.csv?hours=1"' in page and "Download CSV" in text
    assert 'aria-current="page">1 h<' in page
    series = json.loads(re.search(r'id="usage-series-caller"[^>]*>(.*?)</script>', page).group(1))
    assert {s["name"]: s["tokens"] for s in series} == {"team-alpha": [1400, 1120], "ops": [150]}
    assert "No turns were counted" not in text


def test_the_page_says_when_no_turns_were_counted(login):
    response = login("viewer").get("/usage/")
    text = visible_text(response)
    assert "No turns were counted in the last 24 h." in text
    assert 'id="usage-consumers"' not in response.content.decode()
    assert "No token has a counted limit" in text


def test_an_unknown_period_shows_the_last_24_hours(login):
    page = login("viewer").get("/usage/?hours=99999").content.decode()
    assert 'aria-current="page">24 h<' in page


def test_quota_use_shows_as_bars_per_counted_limit(login, monkeypatch, settings):
    settings.REDIS_URL = None  # the database's windows
    now = limits.clock()
    monkeypatch.setattr(limits, "clock", lambda: now)  # the page reads the same windows
    token, _ = token_issue(name="team-beta", role=Role.OPERATOR)
    Quota.objects.create(token=token, requests_per_minute=60, tokens_per_day=10_000)
    keys = limits.keys(f"token:{token.pk}", limits.Windows.at(now))
    later = timezone.now() + timedelta(minutes=5)
    RateWindow.objects.create(key=keys["requests_per_minute"], count=12, expires_at=later)
    RateWindow.objects.create(key=keys["tokens_per_day"], count=2500, expires_at=later)
    response = login("viewer").get("/usage/")
    page = response.content.decode()
    text = visible_text(response)
    assert "team-beta requests per minute 12 of 60 tokens per day 2500 of 10000" in text
    assert f'data-token="{token.pk}" data-limit="requests_per_minute"' in page
    assert '<progress max="60" value="12">' in page


def test_it_needs_a_login_and_a_role(login):
    assert Client().get("/usage/")["Location"].startswith("/login/")
    assert login("nobody").get("/usage/").status_code == 403
