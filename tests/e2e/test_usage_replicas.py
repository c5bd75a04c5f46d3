"""Usage and limits across two control-plane replicas (two daphne processes on one
PostgreSQL database and the machine's Redis, fake nodes): concurrent turns sent to both are
each counted once, and a token's requests-per-minute limit admits exactly its limit however
the requests are spread over the replicas."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest

from tests.support.processes import REPO
from tests.support.replicas import MODEL, Replicas, replica_array

pytestmark = pytest.mark.e2e

TIMINGS = {"ttft_ms": 1.0, "prefill_node_ms": 3.0, "decode_node_ms": 5.0}


@pytest.fixture
def replicas(tmp_path):
    with replica_array(tmp_path, planes=2, nodes=2) as array:
        for node in array.nodes:
            node.prompt_tokens, node.cached_tokens, node.timings = 30, 12, dict(TIMINGS)
            node.token_delay = 0.005
        yield array


def _shell(replicas: Replicas, code: str) -> str:
    env = {**os.environ, **replicas.env, "DJANGO_SETTINGS_MODULE": "console.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


def _token(replicas: Replicas, name: str, quota: str = "{}") -> tuple[int, str]:
    out = _shell(
        replicas,
        "from inference.tokens import token_create\n"
        "from inference.usage.quotas import quota_set\n"
        f"token, raw = token_create(name={name!r})\n"
        f"quota_set(token_id=token.pk, changes={quota})\n"
        "print(token.pk, raw)",
    )
    pk, raw = out.split()
    return int(pk), raw


def _sums(replicas: Replicas, caller: str) -> list[float]:
    fields = "requests errors prompt_tokens cached_tokens completion_tokens prefill_s decode_s"
    out = _shell(
        replicas,
        "import time\nfrom django.db.models import Sum\n"
        "from inference.models import UsageMinute\ntime.sleep(1.5)\n"  # the writers' flush
        f"rows = UsageMinute.objects.filter(caller={caller!r})\n"
        f"sums = rows.aggregate(**{{f: Sum(f) for f in {fields.split()!r}}})\n"
        f"print(' '.join(str(sums[f] or 0) for f in {fields.split()!r}))",
    )
    return [float(v) for v in out.split()]


async def _turns(replicas: Replicas, raw: str, count: int) -> list[int]:
    async with httpx.AsyncClient(timeout=30) as client:
        sent = [
            client.post(
                f"{replicas.planes[i % 2].url}/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"turn {i}"}],
                    "stream": i % 3 == 0,
                },
                headers={"Authorization": f"Bearer {raw}", "X-Session-Id": f"s-{i % 7}"},
            )
            for i in range(count)
        ]
        return [r.status_code for r in await asyncio.gather(*sent)]


def test_turns_sent_to_both_replicas_at_once_are_each_counted_once(replicas):
    pk, raw = _token(replicas, "shared-agent")
    assert asyncio.run(_turns(replicas, raw, 24)) == [200] * 24
    requests, errors, prompt, cached, completion, prefill_s, decode_s = _sums(
        replicas, f"token:{pk}"
    )
    assert (requests, errors) == (24, 0)
    assert (prompt, cached, completion) == (24 * 30, 24 * 12, 24 * 3)
    assert prefill_s == pytest.approx(24 * 0.003) and decode_s == pytest.approx(24 * 0.005)


def test_a_limit_admits_exactly_its_count_across_replicas(replicas):
    _, raw = _token(replicas, "capped-agent", "{'requests_per_minute': 9}")
    statuses = asyncio.run(_turns(replicas, raw, 30))
    if statuses.count(200) < 9:  # the burst straddled a minute: the next window admits more
        pytest.fail(f"fewer than the limit were admitted: {statuses}")
    assert statuses.count(200) in (9, 18), statuses
    assert set(statuses) == {200, 429}
