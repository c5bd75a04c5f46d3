"""Usage through the real proxy (in-process control plane, fake nodes): every turn counted
against its token from the node's own usage and timings, limits answered with 429 and
Retry-After over REST and an error event on the websocket, and the cost of a session."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db.models import Sum
from django.test import AsyncClient

from console.asgi import application
from inference.models import CostModel, UsageMinute, UsageTurn
from inference.tokens import token_create
from inference.usage import limits
from inference.usage.quotas import quota_set
from inference.usage.recorder import recorder
from inference.usage.selectors import session_usage
from tests.inference.conftest import MODEL

pytestmark = pytest.mark.django_db(transaction=True)

TIMINGS = {"ttft_ms": 1.0, "prefill_node_ms": 4.0, "decode_node_ms": 6.5}


def _body(**extra) -> str:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra})


async def _post(token: str, session: str | None = None, **extra):
    headers = {"Authorization": f"Bearer {token}"}
    if session:
        headers["X-Session-Id"] = session
    response = await AsyncClient().post(
        "/v1/chat/completions", _body(**extra), content_type="application/json", headers=headers
    )
    if extra.get("stream") and response.status_code == 200:
        async for _ in response.streaming_content:
            pass
    return response


@pytest.fixture
def counted(fakes):
    for fake in fakes.values():
        fake.prompt_tokens, fake.cached_tokens, fake.timings = 40, 25, dict(TIMINGS)
    return fakes


def _sums(caller: str) -> dict:
    fields = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens")
    return UsageMinute.objects.filter(caller=caller).aggregate(
        **{f: Sum(f) for f in (*fields, "prefill_s", "decode_s")}
    )


async def test_concurrent_turns_of_two_tokens_are_each_counted_once(counted):
    a, raw_a = await sync_to_async(token_create)(name="agent-a")
    b, raw_b = await sync_to_async(token_create)(name="agent-b")
    turns = [_post(raw_a, f"a-{i}", stream=i % 2 == 0) for i in range(9)]
    turns += [_post(raw_b, f"b-{i}", stream=i % 2 == 1) for i in range(5)]
    answers = await asyncio.gather(*turns)
    assert [r.status_code for r in answers] == [200] * 14
    await sync_to_async(recorder.flush)()
    for token, n in ((a, 9), (b, 5)):
        sums = await sync_to_async(_sums)(f"token:{token.pk}")
        assert sums["requests"] == n and sums["errors"] == 0
        assert sums["prompt_tokens"] == 40 * n and sums["cached_tokens"] == 25 * n
        assert sums["completion_tokens"] == 3 * n  # the fake's three tokens
        assert sums["prefill_s"] == pytest.approx(0.004 * n)
        assert sums["decode_s"] == pytest.approx(0.0065 * n)
    rows = UsageTurn.objects.filter(caller=f"token:{a.pk}")
    assert await rows.acount() == 9
    assert {r.node_id async for r in rows} <= set(counted)


async def test_a_websocket_turn_is_counted_against_its_token(counted):
    token, raw = await sync_to_async(token_create)(name="ws-agent")
    comm = WebsocketCommunicator(application, f"/ws/sessions/ws-usage/?token={raw}")
    assert (await comm.connect(timeout=10))[0]
    await comm.send_json_to({"type": "user", "content": "hi"})
    while (await comm.receive_json_from(timeout=10))["type"] not in ("done", "error"):
        pass
    await comm.disconnect()
    await sync_to_async(recorder.flush)()
    turn = await UsageTurn.objects.aget(caller=f"token:{token.pk}")
    assert (turn.session_id, turn.prompt_tokens, turn.completion_tokens) == ("ws-usage", 40, 3)


async def test_over_its_limit_a_token_gets_429_and_an_error_event_then_the_next_window(
    counted, monkeypatch
):
    now = [1_800_057_600.0 + 10]
    monkeypatch.setattr(limits, "clock", lambda: now[0])
    token, raw = await sync_to_async(token_create)(name="capped")
    await sync_to_async(quota_set)(token_id=token.pk, changes={"requests_per_minute": 2})
    assert [(await _post(raw)).status_code for _ in range(2)] == [200, 200]
    refused = await _post(raw)
    assert refused.status_code == 429 and refused["Retry-After"] == "50"
    error = json.loads(refused.content)["error"]
    assert error["code"] == "rate_limit_exceeded" and error["param"] == "requests_per_minute"
    assert error["type"] == "rate_limit_error" and "2 requests per minute" in error["message"]
    comm = WebsocketCommunicator(application, f"/ws/sessions/capped-ws/?token={raw}")
    assert (await comm.connect(timeout=10))[0]
    await comm.send_json_to({"type": "user", "content": "hi"})
    event = await comm.receive_json_from(timeout=10)
    assert event["type"] == "error" and event["code"] == "rate_limit_exceeded"
    assert event["param"] == "requests_per_minute" and event["retry_after"] == 50
    now[0] += 50  # the next minute
    await comm.send_json_to({"type": "user", "content": "hi"})
    events = [await comm.receive_json_from(timeout=10)]
    while events[-1]["type"] not in ("done", "error"):
        events.append(await comm.receive_json_from(timeout=10))
    await comm.disconnect()
    assert events[-1]["type"] == "done"
    assert (await _post(raw)).status_code == 200


async def test_a_max_tokens_quota_refuses_more_and_caps_a_request_that_asks_none(counted):
    token, raw = await sync_to_async(token_create)(name="short")
    await sync_to_async(quota_set)(token_id=token.pk, changes={"max_tokens": 16})
    over = await _post(raw, max_tokens=17)
    assert over.status_code == 400
    assert json.loads(over.content)["error"]["param"] == "max_tokens"
    for n_predict in (100_000, -1, "lots"):  # llama-server reads n_predict before max_tokens
        around = await _post(raw, max_tokens=8, n_predict=n_predict)
        assert around.status_code == 400, n_predict
        assert json.loads(around.content)["error"]["param"] == "n_predict"
    assert (await _post(raw)).status_code == 200
    sent = [r["body"] for fake in counted.values() for r in fake.requests]
    assert [b["max_tokens"] for b in sent] == [16]


async def test_the_cost_of_a_session_is_the_cost_model_applied_to_its_node_seconds(counted):
    _, raw = await sync_to_async(token_create)(name="priced")
    for _ in range(3):
        assert (await _post(raw, "priced-session")).status_code == 200
    await sync_to_async(recorder.flush)()
    model = await sync_to_async(CostModel.load)()
    month = (
        model.power_w / 1000 * 730 * model.electricity_per_kwh
        + model.hardware_cost / model.amortization_months
        + model.operations_per_month
        + model.space_per_month
    )
    node_seconds = 3 * (0.004 + 0.0065)
    shown = await sync_to_async(session_usage)(session_id="priced-session")
    assert shown["requests"] == 3 and shown["node_seconds"] == pytest.approx(node_seconds)
    assert shown["cost"] == pytest.approx(node_seconds * month / (730 * 3600), rel=1e-5)
    assert shown["currency"] == model.currency
    # 25 of 40 prompt tokens cached: the prefill they saved at the measured 4 ms per 15 tokens
    assert shown["saved"] == pytest.approx(3 * 25 * 0.004 / 15 * month / (730 * 3600), rel=1e-5)
