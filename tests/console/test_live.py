"""The live feed ``/ws/live/``: auth and origin, history then snapshots, node events, in both
channel-layer modes (in-memory; channels-redis with a second layer standing for another
process)."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.cache import cache
from django.test import override_settings

from console import services
from console.asgi import application
from console.lib.live import LIVE_GROUP
from console.models import Role
from inference import tokens
from inference.models import ModelPackage
from nodes import utilization
from nodes.models import Node
from tests.fakenode import FakeNode
from tests.support.logins import login_cookie

METRICS = (
    'phalanx_node_decode_tokens_per_second{node="n"} 41.5\n'
    'phalanx_node_prefill_tokens_per_second{node="n"} 300\n'
    'phalanx_node_sequences{node="n",state="active"} 1\n'
    'phalanx_node_sequences{node="n",state="idle"} 2\n'
    'phalanx_node_sequences_total{node="n"} 4\n'
    'phalanx_node_kv_used_tokens{node="n"} 512\nphalanx_node_kv_capacity_tokens{node="n"} 2048\n'
    'phalanx_node_queue_depth{node="n"} 0\n'
)


@pytest.fixture
def fake(transactional_db):
    cache.clear()
    node = FakeNode("node-01", metrics_text=METRICS).start()
    package = ModelPackage.objects.create(name="m", version="1", gguf_path="/x", sha256="0" * 64)
    Node.objects.create(
        validation="passed", node_id="node-01", address=node.address, package=package, state="up"
    )
    yield node
    node.stop()
    cache.clear()


@pytest.fixture
def token(transactional_db) -> str:
    return tokens.token_issue(name="live", role=Role.VIEWER)[1]


async def _next(communicator: WebsocketCommunicator, kind: str, limit: int = 20) -> dict:
    for _ in range(limit):
        message = await communicator.receive_json_from(timeout=10)
        if message["type"] == kind:
            return message
    raise AssertionError(f"no {kind} message")


def test_it_reads_node_metrics_into_snapshot_fields():
    fields = utilization.metrics_fields(METRICS)
    assert fields["decode_tps"] == 41.5 and fields["active"] == 1 and fields["idle"] == 2
    assert fields["kv_pct"] == 25.0


async def test_it_refuses_a_socket_without_credentials(transactional_db):
    communicator = WebsocketCommunicator(application, "/ws/live/")
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_json_from())["code"] == 4401
    assert (await communicator.receive_output())["code"] == 4401
    await communicator.disconnect()


@pytest.mark.parametrize("path", ["/ws/live/", "/ws/loadtests/1/"])
async def test_it_refuses_a_logged_in_user_in_no_role(transactional_db, path):
    communicator = WebsocketCommunicator(application, path, headers=await login_cookie(None))
    assert (await communicator.connect())[0]
    assert await communicator.receive_json_from() == {
        "type": "error",
        "code": 4403,
        "message": "Not allowed.",
    }
    assert await communicator.receive_output() == {"type": "websocket.close", "code": 4403}
    await communicator.disconnect()


async def test_it_refuses_a_foreign_origin(token):
    communicator = WebsocketCommunicator(
        application, f"/ws/live/?token={token}", headers=[(b"origin", b"http://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert not connected
    await communicator.disconnect()


async def test_it_sends_history_then_snapshots(fake, token):
    communicator = WebsocketCommunicator(
        application, f"/ws/live/?token={token}", headers=[(b"origin", b"http://127.0.0.1:8000")]
    )
    assert (await communicator.connect())[0]
    history = await _next(communicator, "history")
    assert history["snapshots"] == []
    snapshot = (await _next(communicator, "snapshot"))["snapshot"]
    node = snapshot["nodes"]["node-01"]
    assert node["state"] == "up" and node["ok"] and node["decode_tps"] == 41.5
    assert "cpu" in snapshot["host"]
    await communicator.disconnect()
    again = WebsocketCommunicator(application, f"/ws/live/?token={token}")
    assert (await again.connect())[0]
    assert len((await _next(again, "history"))["snapshots"]) >= 1
    await again.disconnect()


async def test_it_pushes_a_drain_to_open_pages(fake, token):
    communicator = WebsocketCommunicator(application, f"/ws/live/?token={token}")
    assert (await communicator.connect())[0]
    await _next(communicator, "history")
    await sync_to_async(services.node_set_drained)(node_id="node-01", drained=True)
    message = await _next(communicator, "node")
    assert message["node"]["state"] == "draining" and message["event"]["kind"] == "drained"
    await communicator.disconnect()


def _redis_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=0.5).close()
    except OSError:
        return bool(os.environ.get("PHALANX_TEST_REDIS"))
    return True


@pytest.mark.skipif(not _redis_up(), reason="no Redis on 127.0.0.1:6379 (set PHALANX_TEST_REDIS)")
async def test_it_relays_events_from_another_process_through_redis(fake, token):
    from channels.layers import get_channel_layer
    from channels_redis.core import RedisChannelLayer

    url = os.environ.get("PHALANX_TEST_REDIS", "redis://127.0.0.1:6379/0")
    prefix = f"phx-test-{uuid.uuid4().hex[:8]}"
    layers = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [url], "prefix": prefix},
        }
    }
    with override_settings(CHANNEL_LAYERS=layers):
        other_process = RedisChannelLayer(hosts=[url], prefix=prefix)
        communicator = WebsocketCommunicator(application, f"/ws/live/?token={token}")
        try:
            assert (await communicator.connect())[0]
            await _next(communicator, "history")
            await other_process.group_send(LIVE_GROUP, {"type": "node.removed", "node_id": "gone"})
            assert (await _next(communicator, "node_removed"))["node_id"] == "gone"
            await sync_to_async(services.node_set_drained)(node_id="node-01", drained=True)
            assert (await _next(communicator, "node"))["node"]["state"] == "draining"
        finally:
            # time for the consumer to leave its group and stop receiving before the layers
            # close (the default 1 s ran out on a loaded machine and left a receive parked)
            await communicator.disconnect(timeout=10)
            await other_process.flush()
            # close both layers' Redis connections on this loop: a receive still parked on
            # one kept the test's event loop from closing (seen once in a full run)
            await other_process.close_pools()
            await get_channel_layer().close_pools()


@pytest.fixture
def fake_node_for_history(transactional_db):
    cache.clear()
    node = FakeNode("node-h", metrics_text=METRICS).start()
    Node.objects.create(
        validation="passed", node_id="node-h", address=node.address, state=Node.State.UP
    )
    yield node
    node.stop()


def test_the_control_loop_keeps_history_without_an_open_tab(fake_node_for_history):
    from asgiref.sync import async_to_sync

    from console.models import UtilizationSample

    utilization.record_sample()
    utilization.record_sample()
    kept = async_to_sync(utilization.history)()
    assert len(kept) == 2 and kept[0]["t"] < kept[1]["t"]
    assert kept[-1]["nodes"]["node-h"]["state"] == "up"
    old = UtilizationSample.objects.first()
    old.taken_at -= timedelta(seconds=utilization.KEEP_S + 1)
    old.save()
    utilization.record_sample()  # also drops what is past KEEP_S
    assert UtilizationSample.objects.count() == 2


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")
def test_the_control_loops_samples_do_not_leak_sockets_or_connections(fake_node_for_history):
    for _ in range(3):  # warm: the sampling loop, its client and executor exist
        utilization.record_sample()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        utilization.record_sample()
    assert len(os.listdir("/proc/self/fd")) <= before + 1  # one a tick leaked, once


async def test_the_sampler_stops_when_cancelled_even_if_a_tick_swallowed_it(monkeypatch):
    sampler = utilization.UtilizationSampler()
    sampler.watchers = 1  # a page that never said goodbye
    ticking = asyncio.Event()

    async def swallowing_tick(after):
        ticking.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # as a library awaited in a tick may do
        return None

    monkeypatch.setattr(sampler, "tick", swallowing_tick)
    task = asyncio.get_running_loop().create_task(sampler.run())
    await ticking.wait()
    task.cancel()
    await asyncio.wait_for(task, 5)  # before: it kept ticking until cancelled a second time
