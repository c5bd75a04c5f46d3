"""Device validation in the control plane, against fake nodes that speak the protocol (their
reports come from the fixture machines): the gate, the measured weight, re-validation on a
change with its diff, restarts, external nodes, one run per machine."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.utils import timezone

from inference.models import ModelPackage, RoutingPolicy
from inference.node_table import nodes_for_routing
from inference.tokens import token_create
from nodes import device_validation as dv
from nodes.control import ControlLoop
from nodes.models import Node, ValidationRun
from nodes.services import node_upsert
from tests.fakenode import FakeNode
from tests.support.validation import MACHINES, machine_report

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "smollm2-test"


def report(machine: str | Path, **kw) -> dict:
    return machine_report(machine, **kw)


def speaking(fake: FakeNode, rep: dict) -> FakeNode:
    fake.validation_report = rep
    fake.device = {"instance": rep["instance"], "fingerprint": rep["fingerprint"]}
    return fake


@pytest.fixture
def package(transactional_db) -> ModelPackage:
    policy = RoutingPolicy.load()
    policy.connect_timeout_s, policy.request_timeout_s, policy.canary_idle_s = 1.0, 5.0, 0
    policy.save()
    return ModelPackage.objects.create(
        name=MODEL, version="1", gguf_path="/tmp/x.gguf", sha256="0" * 64, quantization="Q4_K_M"
    )


@pytest.fixture
def fleet(package):
    started: list[FakeNode] = []

    def add(node_id: str, rep: dict | None) -> FakeNode:
        fake = FakeNode(node_id).start()
        if rep is not None:
            speaking(fake, rep)
        started.append(fake)
        node_upsert(node_id=node_id, address=fake.address, package_id=package.pk)
        return fake

    yield add
    for fake in started:
        fake.stop()


def settle(max_steps: int = 20) -> None:
    """One control-loop tick, then validation steps until no run is open."""
    ControlLoop().tick()
    for _ in range(max_steps):
        if not dv.validation_step():
            return
    raise AssertionError("validation runs did not end")


def validation_of(node_id: str) -> str:
    return Node.objects.get(node_id=node_id).validation


async def chat(session: str, auth: dict) -> int:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    response = await AsyncClient().post(
        "/v1/chat/completions",
        body,
        content_type="application/json",
        headers={**auth, "X-Session-Id": session},
    )
    return response.status_code


async def test_it_sends_no_traffic_to_a_node_until_it_passes_and_none_to_one_that_fails(fleet):
    auth = {"Authorization": f"Bearer {(await sync_to_async(token_create)(name='t'))[1]}"}
    good = await sync_to_async(fleet)("node-01", report("xeon-2numa-avx512"))
    bad = await sync_to_async(fleet)("node-02", report("cgroup-limited", threads=4))
    await sync_to_async(ControlLoop().tick)()  # healthy, but not validated yet
    assert await chat("s-0", auth) == 503
    await sync_to_async(settle)()
    assert await sync_to_async(validation_of)("node-01") == "warned"  # spans two NUMA nodes
    assert await sync_to_async(validation_of)("node-02") == "failed"
    reason = (await sync_to_async(Node.objects.get)(node_id="node-02")).validation_reason
    assert "threads: threads 4 > CPU budget 2" in reason
    assert [await chat(f"s-{i}", auth) for i in range(1, 7)] == [200] * 6
    assert len(good.requests) == 6 and bad.requests == []


def test_it_sets_routing_weights_from_measured_decode_speed(fleet):
    fleet("node-01", report("nvidia-l4", decode_8=100.0, threads=4))
    fleet("node-02", report("nvidia-l4", decode_8=300.0, threads=4))
    settle()
    nodes = {n.node_id: n for n in Node.objects.all()}
    assert (nodes["node-01"].measured_speed, nodes["node-02"].measured_speed) == (0.5, 1.5)
    table = {v.node_id: v for v in nodes_for_routing(stale_after_s=60).views}
    assert (table["node-01"].weight, table["node-02"].weight) == (0.5, 1.5)
    assert all(v.state == "up" for v in table.values())
    # the second run was compared with the pool: one other node at 100 tok/s
    second = ValidationRun.objects.get(node__node_id="node-02")
    assert second.pool["decode_tok_s_8"] == 100.0
    # the operator's override: weight alone
    Node.objects.filter(node_id="node-02").update(weight_measured=False, weight=2.0)
    table = {v.node_id: v for v in nodes_for_routing(stale_after_s=60).views}
    assert table["node-02"].weight == 2.0


def test_it_validates_again_when_firmware_or_a_module_changes_and_shows_the_diff(
    fleet, tmp_path, client, admin_user
):
    import shutil

    machine = tmp_path / "gpu"
    shutil.copytree(MACHINES / "nvidia-l4", machine)
    fake = fleet("node-01", report(machine, threads=4))
    settle()
    assert validation_of("node-01") == "warned"
    (machine / "root/sys/class/dmi/id/bios_version").write_text("2.4.1\n")
    (machine / "root/sys/module/nvidia/version").write_text("550.54.15\n")
    speaking(fake, report(machine, threads=4))  # same agent, new fingerprint
    ControlLoop().tick()
    run = ValidationRun.objects.filter(node__node_id="node-01").first()
    assert (run.trigger, run.state) == ("change", "queued")
    assert validation_of("node-01") == "validating"
    settle()
    run.refresh_from_db()
    assert run.changes == [
        {"path": "firmware.bios_version", "before": "2.3.5", "after": "2.4.1"},
        {"path": "modules.nvidia", "before": "535.161.08", "after": "550.54.15"},
    ]
    ControlLoop().tick()  # the same fingerprint again: no new run
    assert ValidationRun.objects.count() == 2
    client.force_login(admin_user)
    page = client.get("/validation/node-01/").content.decode()
    assert "firmware.bios_version" in page and "2.3.5 → 2.4.1" in page


def test_it_validates_a_restarted_agent_again(fleet):
    fake = fleet("node-01", report("nvidia-l4", threads=4, instance="first"))
    settle()
    speaking(fake, report("nvidia-l4", threads=4, instance="second"))
    ControlLoop().tick()
    assert ValidationRun.objects.first().trigger == "start"
    settle()
    assert Node.objects.get(node_id="node-01").device_instance == "second"


def test_it_errors_a_run_the_node_forgot_and_keeps_the_node_out(fleet):
    fake = fleet("node-01", report("nvidia-l4", threads=4))
    fake.validation_polls = 100
    ControlLoop().tick()
    dv.validation_step()  # started
    dv.validation_step()  # running
    fake.validation_run = "another"  # the agent restarted and knows nothing of ours
    dv.validation_step()
    run = ValidationRun.objects.get()
    assert run.state == "error" and "restarted" in run.reason
    assert validation_of("node-01") == "failed"
    # the restarted agent is validated again; the errored run has no inventory to compare
    fake.validation_polls = 1
    speaking(fake, report("nvidia-l4", threads=4, instance="after-restart"))
    settle()
    latest = ValidationRun.objects.first()
    assert (latest.trigger, latest.state, latest.changes) == ("start", "warned", [])
    assert validation_of("node-01") == "warned"


def test_it_fails_an_external_node_until_an_operator_waives_it(fleet):
    fleet("node-01", None)  # says nothing of its devices
    settle()
    run = ValidationRun.objects.get()
    assert run.state == "failed" and "does not report its devices" in run.reason
    assert nodes_for_routing(stale_after_s=60).views[0].state == "failed validation"
    dv.validation_waive(node_id="node-01", reason="llama-server checked by hand", by="ann")
    assert nodes_for_routing(stale_after_s=60).views[0].state == "up"
    settle()  # no new run for a waived node that still says nothing
    assert ValidationRun.objects.count() == 1


def run_states() -> dict[str, str]:
    return dict(ValidationRun.objects.values_list("node__node_id", "state"))


@pytest.mark.parametrize(
    ("allowed", "cpu_sets", "together"),
    [
        (False, ("0", "1"), False),  # PHALANX_VALIDATIONS_TOGETHER=0: one run per machine
        (True, ("", ""), False),  # not pinned: either may use any CPU of the machine
        (True, ("0-1", ""), False),
        (True, ("0-1", "1-2"), False),  # CPU 1 is shared
        (True, ("0", "1"), True),  # each node pinned to its own CPU, as `up` pins them
        (True, ("0,2", "1,3"), True),
    ],
)
def test_validations_on_one_machine_run_together_only_on_cpus_of_their_own(
    fleet, monkeypatch, allowed, cpu_sets, together
):
    from nodes import validation_machines

    monkeypatch.setattr(validation_machines, "TOGETHER", allowed)
    fakes = [fleet(f"node-0{i}", report("nvidia-l4", threads=4, instance=f"i-{i}")) for i in (1, 2)]
    for fake, cpus in zip(fakes, cpu_sets, strict=True):
        fake.validation_polls = 2
        Node.objects.filter(node_id=fake.node_id).update(cpu_set=cpus)
    ControlLoop().tick()
    dv.validation_step()
    second = "running" if together else "queued"
    assert run_states() == {"node-01": "running", "node-02": second}  # both on loopback
    for _ in range(10):
        dv.validation_step()
    assert run_states() == {"node-01": "warned", "node-02": "warned"}


def test_a_run_waits_for_one_another_process_started_on_its_cpus(fleet, monkeypatch):
    """The rule is read afresh when a run starts: another process (``manage.py validate``, a
    second loop) may have started a run on the same CPUs since this step listed the runs."""
    from nodes import validation_machines

    monkeypatch.setattr(validation_machines, "TOGETHER", True)
    fakes = [fleet(f"node-0{i}", report("nvidia-l4", threads=4, instance=f"i-{i}")) for i in (1, 2)]
    Node.objects.update(cpu_set="0")
    ControlLoop().tick()
    first, second = ValidationRun.objects.order_by("created_at", "id").select_related("node")
    ValidationRun.objects.filter(pk=first.pk).update(state="running")  # by someone else
    assert dv.validation_start(second) is True  # busy: not started
    assert run_states()["node-02"] == "queued" and fakes[1].validation_run is None


def test_it_validates_a_node_again_when_its_address_changes(fleet):
    fleet("node-01", report("nvidia-l4", threads=4))
    settle()
    node = Node.objects.get()
    node_upsert(node_id="node-01", address="127.0.0.1:9", package_id=node.package_id)
    assert validation_of("node-01") == "pending"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("a string", "not a JSON object"),
        ({"inventory": {}, "engine": {}, "bench": {}}, "lacks numbers for threads"),
        ("bench-string", "lacks numbers for memory_bandwidth_gb_s"),
        ("cpu-string", "AttributeError"),
    ],
)
def test_it_errors_a_malformed_report_without_holding_up_other_runs(fleet, bad, why):
    good_report = report("nvidia-l4", threads=4)
    if bad == "bench-string":
        bad = {**good_report, "bench": {**good_report["bench"], "memory_bandwidth_gb_s": "fast"}}
    elif bad == "cpu-string":
        bad = {**good_report, "inventory": {**good_report["inventory"], "cpu": "x86"}}
    broken = fleet("node-01", good_report)
    broken.validation_report = bad
    fleet("node-02", report("nvidia-l4", threads=4, instance="i-2"))
    settle()
    runs = {r.node.node_id: r for r in ValidationRun.objects.select_related("node")}
    assert runs["node-01"].state == "error" and why in runs["node-01"].reason
    assert runs["node-02"].state == "warned"
    assert validation_of("node-01") == "failed"


def test_it_retries_a_run_that_could_not_finish_after_a_backoff(fleet):
    fake = fleet("node-01", report("nvidia-l4", threads=4))
    fake.validation_report = "garbage"
    settle()
    assert ValidationRun.objects.get().state == "error"
    ControlLoop().tick()  # the same agent, right after: no new run yet
    assert ValidationRun.objects.count() == 1
    assert dv.retry_delay_s(1) == 60 and dv.retry_delay_s(3) == 240 and dv.retry_delay_s(20) == 3600
    ValidationRun.objects.update(finished_at=timezone.now() - timedelta(seconds=61))
    speaking(fake, report("nvidia-l4", threads=4))
    settle()
    retry = ValidationRun.objects.first()
    assert (retry.trigger, retry.state) == ("retry", "warned")


def test_a_waiver_given_during_a_run_stands(fleet):
    fake = fleet("node-01", report("cgroup-limited", threads=4))
    fake.validation_polls = 3
    ControlLoop().tick()
    dv.validation_step()
    dv.validation_waive(node_id="node-01", reason="known limits", by="ann")
    settle()
    assert ValidationRun.objects.get().state == "failed"
    assert validation_of("node-01") == "waived"


def test_a_node_switched_to_another_package_loses_its_measured_speed(fleet, package):
    fleet("node-01", report("nvidia-l4", decode_8=100.0, threads=4))
    fleet("node-02", report("nvidia-l4", decode_8=300.0, threads=4, instance="i-2"))
    settle()
    other = ModelPackage.objects.create(name="other", version="1", gguf_path="/x", sha256="1" * 64)
    Node.objects.filter(node_id="node-02").update(package=other)  # as an upgrade switches it
    dv.speeds_refresh(package_id=other.pk)
    dv.speeds_refresh(package_id=package.pk)
    speeds = dict(Node.objects.values_list("node_id", "measured_speed"))
    assert speeds == {"node-01": 1.0, "node-02": None}


def test_a_config_file_or_up_keeps_the_operators_weight_override(fleet, package):
    fleet("node-01", report("nvidia-l4", threads=4))
    Node.objects.update(weight_measured=False)
    node_upsert(node_id="node-01", address=Node.objects.get().address, package_id=package.pk)
    assert Node.objects.get().weight_measured is False


def test_models_are_listed_only_when_a_validated_node_serves_them(fleet):
    from inference.selectors import packages_served

    fleet("node-01", report("nvidia-l4", threads=4))
    ControlLoop().tick()
    assert packages_served() == []  # up, but validating
    settle()
    assert [name for name, _ in packages_served()] == [MODEL]


def test_the_migration_waives_nodes_registered_before_validation(package):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("nodes.migrations.0005_device_validation")
    node_upsert(node_id="node-01", address="127.0.0.1:9", package_id=package.pk)
    migration.waive_existing_nodes(apps, None)
    node = Node.objects.get()
    assert node.validation == "waived" and node.device_instance == ""


def test_runs_that_overlap_are_each_compared_with_the_other(fleet, client, admin_user):
    """Two nodes on CPUs of their own validate together: the first run to end saw its peer
    still validating; once the peer's run ends it is judged again beside it, and each page
    reads "Pool median (1 other node)"."""
    fleet("node-01", report("nvidia-l4", decode_8=100.0, threads=4))
    fleet("node-02", report("nvidia-l4", decode_8=300.0, threads=4))
    Node.objects.filter(node_id="node-01").update(cpu_set="0")
    Node.objects.filter(node_id="node-02").update(cpu_set="1")
    settle()
    runs = {r.node.node_id: r for r in ValidationRun.objects.select_related("node")}
    assert {n: r.pool["nodes"] for n, r in runs.items()} == {"node-01": 1, "node-02": 1}
    assert runs["node-01"].pool["decode_tok_s_8"] == 300.0
    assert runs["node-02"].pool["decode_tok_s_8"] == 100.0
    pool_rule = next(r for r in runs["node-01"].rules if r["rule"] == "pool")
    assert pool_rule["reason"] == (
        "decodes 100.0 tok/s at 8 sequences, 33% of the pool's median 300.0: look for a busy "
        "neighbour, a lower clock or fewer memory channels"
    )
    client.force_login(admin_user)
    page = client.get("/validation/node-01/").content.decode()
    assert "Pool median (1 other node)" in page


def test_the_pool_says_why_a_node_serving_the_package_is_not_in_it(fleet):
    fleet("node-01", report("nvidia-l4", decode_8=100.0, threads=4))
    fleet("node-02", report("cgroup-limited", threads=4))  # fails: threads over its budget
    settle()
    Node.objects.filter(node_id="node-01").update(validation="pending", device_instance="")
    settle()
    run = ValidationRun.objects.filter(node__node_id="node-01").first()
    assert run.pool["nodes"] == 0
    assert run.pool["left_out"] == [{"node_id": "node-02", "why": "failed validation"}]
    pool_rule = next(r for r in run.rules if r["rule"] == "pool")
    assert pool_rule["reason"] == (
        "decodes 100.0 tok/s at 8 sequences; no other node's figures to compare yet: "
        "node-02 failed validation"
    )
