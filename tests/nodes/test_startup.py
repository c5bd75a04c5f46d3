"""What ``up`` says while the array starts (``nodes.startup``): a line per node as its stage
changes, "ready" only once every node takes sessions or is kept out, and an estimate from the
machine's own last runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.embedded import nodes_mark_starting
from inference.models import ModelPackage
from nodes import validation_machines
from nodes.models import Node, ValidationRun
from nodes.startup import StartupWatch, schedule_s, validation_estimate
from nodes.validation_machines import Placement

pytestmark = pytest.mark.django_db
BASE = "http://127.0.0.1:8000"


@pytest.fixture
def nodes():
    package = ModelPackage.objects.create(name="m", version="1", gguf_path="/x", sha256="0" * 64)
    return [
        Node.objects.create(
            node_id=f"node-0{i}", address=f"127.0.0.1:800{i}", package=package, cpu_set=str(i - 1)
        )
        for i in (1, 2)
    ]


def set_node(node_id: str, **fields) -> None:
    Node.objects.filter(node_id=node_id).update(**fields)


def ran(node_id: str, state: str, seconds: float | None = None) -> ValidationRun:
    """A run of the node in ``state``; an ended one took ``seconds`` from start to finish."""
    now = timezone.now()
    started = now - timedelta(seconds=seconds) if seconds is not None else None
    return ValidationRun.objects.create(
        node=Node.objects.get(node_id=node_id),
        trigger="start",
        state=state,
        started_at=started if state != "queued" else None,
        finished_at=now if seconds is not None else None,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_says_ready_only_once_every_node_takes_sessions(nodes):
    clock = Clock()
    watch = StartupWatch(["node-01", "node-02"], base_url=BASE, clock=clock)
    set_node("node-01", state="up", validation="validating")
    ran("node-01", "running")
    assert watch.poll() == [
        "node-01 validating its devices (no sessions until done)",
        "node-02 loading its model",
    ]
    assert watch.poll() == []  # nothing changed, nothing said
    ValidationRun.objects.filter(state="running").delete()
    ran("node-01", "passed", seconds=12.0)
    set_node("node-01", validation="passed")
    set_node("node-02", state="up", validation="validating")
    ran("node-02", "queued")
    assert watch.poll() == [
        "node-01 takes sessions: passed in 12.0 s",
        "node-02 waits to validate: another run is measuring its CPUs",
    ]
    ValidationRun.objects.filter(state="queued").delete()
    ran("node-02", "warned", seconds=11.5)
    reason = "cpu.build: the CPU has avx512f (AVX512) but ...; numa: spans NUMA nodes 0, 1"
    set_node("node-02", validation="warned", validation_reason=reason)
    clock.now = 125.0
    assert watch.poll() == [
        "node-02 takes sessions: warned in 11.5 s (warnings: cpu.build, numa)",
        "ready: new sessions are placed on all 2 nodes (node-01, node-02), 25 s after the "
        f"models loaded; OpenAI base URL: {BASE}/v1",
    ]
    assert watch.poll() == []  # said once


def test_it_names_the_nodes_kept_out_and_says_when_none_serves(nodes):
    set_node("node-01", state="up", validation="passed")
    set_node("node-02", state="up", validation="failed", validation_reason="threads: 4 > 2")
    watch = StartupWatch(["node-01", "node-02"], base_url=BASE, clock=Clock())
    assert watch.poll() == [
        "node-01 takes sessions: passed",
        "node-02 kept out: threads: 4 > 2",
        "ready with 1 of 2 nodes (node-01), 0 s after the models loaded; kept out: node-02 "
        f"(see {BASE}/validation/); OpenAI base URL: {BASE}/v1",
    ]
    set_node("node-01", validation="failed", validation_reason="no AVX2")
    assert watch.poll() == [
        "node-01 kept out: no AVX2",
        f"not serving: no node takes sessions (0 s after the models loaded); see {BASE}/validation/",
    ]


def test_a_node_restarted_after_ready_is_said_again(nodes):
    Node.objects.update(state="up", validation="passed")
    watch = StartupWatch(["node-01", "node-02"], base_url=BASE, clock=Clock())
    assert watch.poll()[-1].startswith("ready: ")
    set_node("node-02", state="down", last_probe_error="unreachable")
    assert watch.poll() == ["node-02 down: unreachable"]
    set_node("node-02", state="up")
    assert [line.split(":")[0] for line in watch.poll()] == ["node-02 takes sessions", "ready"]


def test_it_estimates_from_the_last_runs_by_the_scheduling_rule(nodes, monkeypatch):
    monkeypatch.setattr(validation_machines, "TOGETHER", False)
    assert validation_estimate(["node-01", "node-02"]).seconds is None
    assert validation_estimate(["node-01"]).text == (
        "no estimate: no validation has finished on this machine yet"
    )
    ran("node-01", "passed", seconds=12.0)
    ran("node-02", "warned", seconds=20.0)
    serial = validation_estimate(["node-01", "node-02"])
    assert serial.seconds == pytest.approx(32.0, abs=0.1)
    assert (
        serial.text
        == "about 32 s (one at a time; the last runs here took node-01 12 s, node-02 20 s)"
    )
    monkeypatch.setattr(validation_machines, "TOGETHER", True)  # and CPUs 0 and 1
    together = validation_estimate(["node-01", "node-02"])
    assert together.seconds == pytest.approx(20.0, abs=0.1)
    assert together.text.startswith("about 20 s (together: each has CPUs of its own;")


def test_the_schedule_runs_each_as_soon_as_the_rule_lets_it(monkeypatch):
    monkeypatch.setattr(validation_machines, "TOGETHER", False)
    a, b, c = (Placement("loopback", frozenset({cpu})) for cpu in (0, 1, 0))
    assert schedule_s([10, 20, 5], [a, b, c]) == 35  # one at a time
    elsewhere = Placement("198.18.0.2", None)  # a host key only: no traffic is sent
    assert schedule_s([10, 20], [a, elsewhere]) == 20  # another machine
    monkeypatch.setattr(validation_machines, "TOGETHER", True)
    assert schedule_s([10, 20, 5], [a, b, c]) == 20  # c waits for a only


def test_up_resets_what_a_previous_process_left(nodes):
    Node.objects.update(state="up", validation="passed", consecutive_failures=2)
    set_node("node-02", state="draining", validation="waived")
    assert nodes_mark_starting(["node-01", "node-02"]) == 2
    rows = {n.node_id: n for n in Node.objects.all()}
    assert (rows["node-01"].state, rows["node-01"].validation) == ("unknown", "pending")
    assert rows["node-01"].consecutive_failures == 0
    assert (rows["node-02"].state, rows["node-02"].validation) == ("draining", "waived")
