"""Rate limits on every store (``inference.usage.limits``): the database's, the embedded
array's memory (written behind) and Redis's count exactly under concurrent admissions, token windows refuse at their limit, leases bound the
sessions in flight, and the next window admits again."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from inference.models import RateWindow
from inference.usage.limit_store_db import DbLimitStore
from inference.usage.limit_store_memory import FLUSH_S, MemoryLimitStore
from inference.usage.limit_store_redis import RedisLimitStore
from inference.usage.limits import MINUTE_S, Windows, cap_max_tokens, keys
from inference.usage.quotas import Limits, merged
from tests.support.postgres import redis_url

pytestmark = pytest.mark.django_db(transaction=True)

NOW = 1_800_057_600.0  # a day's start (so a minute's too)


@pytest.fixture(params=["database", "memory", "redis"])
def store(request):
    if request.param == "database":
        yield DbLimitStore()
        return
    if request.param == "memory":
        memory_store = MemoryLimitStore()
        yield memory_store
        memory_store.clear()
        return
    redis_store = RedisLimitStore(
        redis_url(), prefix=f"phalanx:test-limits:{secrets.token_hex(4)}:"
    )
    yield redis_store
    redis_store.clear()


def _admit(store, limits: Limits, now: float = NOW, lease: str | None = None) -> str:
    return store.admit(keys("token:1", Windows.at(now)), limits, now, lease)


def test_exactly_the_limit_is_admitted_per_window_under_concurrent_requests(store):
    limits = Limits(requests_per_minute=7)

    def one(_: int) -> str:
        try:
            return _admit(store, limits, NOW + 5)
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(30)))
    assert results.count("") == 7
    assert set(results) == {"", "requests_per_minute"}
    assert _admit(store, limits, NOW + MINUTE_S) == ""  # the next window admits again


def test_a_token_window_refuses_once_the_turns_reached_its_limit(store):
    limits = Limits(tokens_per_minute=100, tokens_per_day=1000)
    window = keys("token:1", Windows.at(NOW))
    assert _admit(store, limits) == ""
    store.settle(window, 60, None)
    assert _admit(store, limits) == ""  # 60 < 100
    store.settle(window, 60, None)
    assert _admit(store, limits) == "tokens_per_minute"  # 120: one turn may pass the limit
    assert _admit(store, limits, NOW + MINUTE_S) == ""  # a new minute, the same day
    assert store.counts(window, NOW)["tokens_per_day"] == 120
    for _ in range(8):
        store.settle(window, 120, None)
    assert _admit(store, limits, NOW + 2 * MINUTE_S) == "tokens_per_day"


def test_leases_bound_the_sessions_in_flight_and_ending_a_turn_frees_one(store):
    limits = Limits(concurrent_sessions=2)
    window = keys("token:1", Windows.at(NOW))
    assert _admit(store, limits, lease="a") == ""
    assert _admit(store, limits, lease="b") == ""
    assert _admit(store, limits, lease="c") == "concurrent_sessions"
    assert store.counts(window, NOW)["concurrent_sessions"] == 2
    store.settle(window, 0, "a")
    assert _admit(store, limits, lease="c") == ""


def test_the_memory_store_writes_behind_and_a_restarted_process_goes_on_from_its_counts():
    """The embedded array counts in memory: what it counted is in the database within
    ``FLUSH_S`` without anyone asking, and a new process (a restart) refuses at the limit
    counting what the old one admitted and settled."""
    import time

    limits = Limits(requests_per_minute=5, tokens_per_day=1000)
    window = keys("token:1", Windows.at(NOW))
    first = MemoryLimitStore()
    assert [_admit(first, limits) for _ in range(3)] == ["", "", ""]
    first.settle(window, 400, None)
    deadline = time.monotonic() + FLUSH_S + 5
    while time.monotonic() < deadline:
        rows = dict(RateWindow.objects.values_list("key", "count"))
        if rows.get(window["tokens_per_day"]) == 400:
            break
        time.sleep(0.05)
    assert rows == {
        window["requests_per_minute"]: 3,
        window["tokens_per_minute"]: 400,
        window["tokens_per_day"]: 400,
    }
    assert (
        RateWindow.objects.get(key=window["tokens_per_day"]).expires_at.timestamp() > NOW + 86_400
    )

    restarted = MemoryLimitStore()
    assert [_admit(restarted, limits) for _ in range(3)] == ["", "", "requests_per_minute"]
    restarted.settle(window, 600, None)
    assert _admit(restarted, limits, NOW + MINUTE_S) == "tokens_per_day"  # 400 + 600
    restarted.clear()
    assert restarted.counts(window, NOW)["requests_per_minute"] == 5  # read back from the rows


def test_a_lease_of_a_process_that_died_expires():
    store = DbLimitStore()
    limits = Limits(concurrent_sessions=1)
    assert _admit(store, limits, lease="lost") == ""
    assert _admit(store, limits, NOW + 60, lease="next") == "concurrent_sessions"
    assert _admit(store, limits, NOW + 901, lease="next") == ""


def test_retry_after_is_the_rest_of_the_window():
    windows = Windows.at(NOW + 45.2)
    assert windows.retry_after("requests_per_minute", NOW + 45.2) == 15
    assert windows.retry_after("tokens_per_day", NOW + 45.2) == 86_400 - 45


def test_limits_merge_a_token_over_its_role_and_zero_means_none():
    role = {"requests_per_minute": 30, "tokens_per_day": 1000, "priority": 3}
    token = {"requests_per_minute": 60, "tokens_per_day": 0, "priority": None}
    limits = merged(token, role)
    assert limits.requests_per_minute == 60 and limits.tokens_per_day is None
    assert limits.priority == 3 and limits.limited
    assert merged(None, None) == Limits() and not Limits(max_tokens=5).limited


def test_max_tokens_quota_caps_what_a_request_may_ask():
    limits = Limits(max_tokens=64)
    assert cap_max_tokens({"messages": []}, limits)["max_tokens"] == 64
    assert cap_max_tokens({"max_tokens": 10}, limits)["max_tokens"] == 10
    from inference.errors import BadRequest

    with pytest.raises(BadRequest) as over:
        cap_max_tokens({"max_tokens": 65}, limits)
    assert over.value.param == "max_tokens" and "limit of 64" in over.value.message


def test_a_turn_that_ends_in_the_next_minute_counts_its_tokens_there(monkeypatch):
    """Tokens are spent when the turn ends: a stream admitted at :59.5 that ends at :00.5
    counts in the new minute's window, which then refuses at its limit."""
    from inference.usage import limits as usage_limits
    from inference.usage.quotas import Caller

    caller = Caller("token:9", "long-stream", "operator", Limits(tokens_per_minute=100))
    monkeypatch.setattr(usage_limits, "clock", lambda: NOW + 59.5)
    admission = usage_limits.admit(caller)
    monkeypatch.setattr(usage_limits, "clock", lambda: NOW + 60.5)
    usage_limits.settle(admission, 150)
    ended_in = keys("token:9", Windows.at(NOW + 60.5))
    assert usage_limits.store().counts(ended_in, NOW + 60.5)["tokens_per_minute"] == 150
    with pytest.raises(usage_limits.OverLimit):
        usage_limits.admit(caller)
