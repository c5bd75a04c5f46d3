"""The proxy's cached lookups (``inference.lookups``): an answer used in the second half of its
TTL is read again in the background, so a steady caller never waits for an expired one; an
answer that now fails (a revoked token) is forgotten, and a clear during a read wins."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from console.lib.bare_http import db_thread
from inference import lookups
from inference.errors import AuthError
from inference.models import ApiToken
from inference.tokens import token_create

pytestmark = pytest.mark.django_db(transaction=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(lookups, "time", SimpleNamespace(monotonic=fake))  # lookups' clock only
    return fake


def _counting(answers: list[str]):
    reads: list[str] = []

    def load() -> str:
        reads.append(answers[len(reads)])
        return reads[-1]

    return load, reads


async def _settled() -> None:
    """Wait for the background reads under way (however slow the machine)."""
    await asyncio.wait_for(asyncio.gather(*list(lookups._refreshing.values())), 30)


def test_a_hit_in_the_second_half_of_the_ttl_reads_ahead_and_no_request_waits(clock):
    load, reads = _counting(["v1", "v2", "v3"])

    async def go() -> list[str]:
        seen = [await lookups._acached("kind", "k", load, 10.0)]  # a miss: read now
        clock.now += 4.0
        seen.append(await lookups._acached("kind", "k", load, 10.0))  # first half: a hit
        clock.now += 2.0
        seen.append(await lookups._acached("kind", "k", load, 10.0))  # second half: read ahead
        await _settled()
        clock.now += 5.0  # 11 s after the first read, which would have expired by now
        seen.append(await lookups._acached("kind", "k", load, 10.0))
        return seen

    assert asyncio.run(go()) == ["v1", "v1", "v1", "v2"]
    assert reads == ["v1", "v2"]  # the last request found the answer read ahead


def test_an_answer_never_outlives_its_ttl_without_traffic(clock):
    load, reads = _counting(["v1", "v2"])

    async def go() -> list[str]:
        first = await lookups._acached("kind", "k", load, 10.0)
        clock.now += 11.0
        return [first, await lookups._acached("kind", "k", load, 10.0)]

    assert asyncio.run(go()) == ["v1", "v2"]


def test_a_token_revoked_meanwhile_is_refused_after_the_read_ahead(clock):
    token, raw = token_create(name="agent")

    async def go() -> None:
        assert (await lookups.acaller_for_token(raw)).name == "agent"
        # revoked by another process (a CLI command): no signal clears this one's cache
        await db_thread(ApiToken.objects.filter(pk=token.pk).update)(revoked=True)
        clock.now += 6.0
        assert (await lookups.acaller_for_token(raw)).name == "agent"  # within its TTL
        await _settled()
        with pytest.raises(AuthError):
            await lookups.acaller_for_token(raw)

    asyncio.run(go())


def test_a_clear_during_a_read_keeps_the_older_answer_out():
    def load() -> str:
        lookups.clear()  # the change that cleared the cache happened while reading
        return "read before the change"

    assert lookups._cached("kind", "k", load) == "read before the change"
    assert ("kind", "k") not in lookups._entries
