from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import ModelPackage, RoutingPolicy
from nodes import client as node_client
from nodes.client import ProbeResult
from nodes.control import ControlLoop
from nodes.models import Node, NodeEvent
from nodes.services import node_drain, node_record_failure, node_record_probe
from tests.fakenode import FakeNode, HungListener, refused_address

pytestmark = pytest.mark.django_db


@pytest.fixture
def package():
    return ModelPackage.objects.create(name="m", version="1", gguf_path="/x", sha256="0" * 64)


@pytest.fixture
def fake(package):
    node = FakeNode("node-01").start()
    yield node
    node.stop()


def test_it_marks_an_answering_node_up_with_its_load(fake, package):
    Node.objects.create(
        validation="passed", node_id="node-01", address=fake.address, package=package
    )
    report = ControlLoop().tick()
    node = Node.objects.get()
    assert report.statuses == {"node-01": "ok"}
    assert node.state == Node.State.UP
    assert node.load == 0.5  # (1 active + 1 queued) / 4 sequences
    assert node.last_probe_at is not None
    assert not NodeEvent.objects.filter(kind=NodeEvent.Kind.WENT_DOWN).exists()


def test_it_marks_a_node_down_after_the_failure_threshold(package):
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address=refused_address(),
        package=package,
        state=Node.State.UP,
        last_seen_load={"load": 0.1},
    )
    loop = ControlLoop()
    for _ in range(2):
        loop.tick()
    node = Node.objects.get()
    assert node.state == Node.State.UP and node.consecutive_failures == 2
    assert node.last_seen_load is None
    report = loop.tick()
    assert Node.objects.get().state == Node.State.DOWN
    assert [e.kind for e in report.events] == [NodeEvent.Kind.WENT_DOWN]
    assert report.statuses == {"node-01": "unreachable"}


def test_it_brings_a_down_node_back_after_the_recovery_threshold(fake, package):
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address=fake.address,
        package=package,
        state=Node.State.DOWN,
        consecutive_failures=5,
    )
    loop = ControlLoop()
    first = loop.tick()  # one good probe is not enough: a flapping node stays down
    node = Node.objects.get()
    assert node.state == Node.State.DOWN and node.consecutive_failures == 0
    assert first.events == []
    report = loop.tick()
    assert Node.objects.get().state == Node.State.UP
    assert [e.kind for e in report.events] == [NodeEvent.Kind.CAME_BACK]


def test_it_does_not_bring_back_a_node_that_flaps(package):
    node = Node.objects.create(
        validation="passed",
        node_id="node-01",
        address="127.0.0.1:1",
        package=package,
        state=Node.State.DOWN,
    )
    good, bad = ProbeResult(True, "ok", load={"load": 0.1}), ProbeResult(False, "timeout", "x")
    for result in (good, bad, good, bad, good):
        node_record_probe(
            node_id="node-01", result=result, failure_threshold=3, recovery_threshold=2
        )
    node.refresh_from_db()
    assert node.state == Node.State.DOWN


def test_it_sends_a_canary_to_an_idle_node_and_counts_its_failure(fake, package):
    policy = RoutingPolicy.load()
    policy.canary_idle_s, policy.failure_threshold = 1.0, 1
    policy.save()
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address=fake.address,
        package=package,
        state=Node.State.UP,
        last_active_at=timezone.now() - timedelta(seconds=5),
    )
    ControlLoop().tick()
    node = Node.objects.get()
    assert node.last_canary_at is not None and node.state == Node.State.UP
    assert fake.requests[-1]["body"]["max_tokens"] == 1
    # /health still says ok, but the engine no longer completes: the canary catches it
    fake.chat_status = 500
    Node.objects.update(last_canary_at=timezone.now() - timedelta(seconds=5))
    report = ControlLoop().tick()
    assert Node.objects.get().state == Node.State.DOWN
    assert "canary" in report.events[0].message


def test_it_sends_no_canary_to_a_busy_node(fake, package):
    policy = RoutingPolicy.load()
    policy.canary_idle_s = 1.0
    policy.save()
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address=fake.address,
        package=package,
        state=Node.State.UP,
        last_active_at=timezone.now(),
    )
    ControlLoop().tick()
    assert fake.requests == []


def test_it_detects_a_hung_node_by_timeout(package):
    policy = RoutingPolicy.load()
    policy.probe_timeout_s, policy.failure_threshold = 0.2, 1
    policy.save()
    hung = HungListener()
    try:
        Node.objects.create(
            validation="passed",
            node_id="node-01",
            address=hung.address,
            package=package,
            state=Node.State.UP,
        )
        report = ControlLoop().tick()
    finally:
        hung.close()
    assert report.statuses == {"node-01": "timeout"}
    assert Node.objects.get().state == Node.State.DOWN


def test_it_counts_a_loading_node_as_not_ready(fake, package):
    fake.health_status = 503
    Node.objects.create(
        validation="passed", node_id="node-01", address=fake.address, package=package
    )
    report = ControlLoop().tick()
    assert report.statuses == {"node-01": "loading"}
    assert Node.objects.get().state == Node.State.UNKNOWN


def test_it_keeps_a_draining_node_draining(fake, package):
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address=fake.address,
        package=package,
        state=Node.State.UP,
    )
    node_drain(node_id="node-01")
    ControlLoop().tick()
    assert Node.objects.get().state == Node.State.DRAINING
    assert NodeEvent.objects.filter(kind=NodeEvent.Kind.DRAINED).count() == 1


def test_it_uses_the_client_seam(package, monkeypatch):
    calls = []

    def probe(address, *, node_id, timeout):
        calls.append((address, node_id, timeout))
        return ProbeResult(True, "ok", "", {"load": 0.25})

    monkeypatch.setattr(node_client, "probe", probe)
    Node.objects.create(
        validation="passed", node_id="node-01", address="127.0.0.1:1", package=package
    )
    ControlLoop().tick()
    assert calls == [("127.0.0.1:1", "node-01", 2.0)]
    assert Node.objects.get().load == 0.25


def test_it_marks_down_a_node_the_proxy_saw_fail(package):
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address="127.0.0.1:1",
        package=package,
        state=Node.State.UP,
        last_probe_at=timezone.now(),
    )
    for _ in range(3):
        node_record_failure(node_id="node-01", reason="refused", failure_threshold=3)
    assert Node.objects.get().state == Node.State.DOWN
    assert node_record_failure(node_id="gone", reason="x", failure_threshold=3) is None


def test_it_runs_once_from_the_command(fake, package, capsys):
    from django.core.management import call_command

    Node.objects.create(
        validation="passed", node_id="node-01", address=fake.address, package=package
    )
    call_command("controlloop", "--once")
    assert "node-01: ok" in capsys.readouterr().out


def test_a_node_loading_its_model_for_the_first_time_is_not_down(fake, package):
    """``up`` starts a node: it answers 503 "loading" for a while. Not up yet is not down: no
    "went down" event, and it is up at its first good probe."""
    Node.objects.create(
        validation="passed", node_id="node-01", address=fake.address, package=package
    )
    fake.health_status = 503
    loop = ControlLoop()
    for _ in range(4):  # past the failure threshold (3)
        assert loop.tick().events == []
    node = Node.objects.get()
    assert (node.state, node.consecutive_failures) == (Node.State.UNKNOWN, 0)
    assert node.last_probe_error.startswith("loading its model (not up yet)")
    fake.health_status = 200
    loop.tick()
    assert Node.objects.get().state == Node.State.UP
    assert not NodeEvent.objects.filter(kind=NodeEvent.Kind.WENT_DOWN).exists()


def test_a_node_that_was_up_and_loads_again_goes_down(fake, package):
    Node.objects.create(
        validation="passed",
        node_id="node-01",
        address=fake.address,
        package=package,
        state=Node.State.UP,
    )
    fake.health_status = 503
    loop = ControlLoop()
    for _ in range(3):
        loop.tick()
    node = Node.objects.get()
    assert node.state == Node.State.DOWN
    event = NodeEvent.objects.get(kind=NodeEvent.Kind.WENT_DOWN)
    assert event.message == "3 failed probes, last: health 503 (loading)"
