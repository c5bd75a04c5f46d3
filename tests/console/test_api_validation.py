"""REST for device validation and ``manage.py validate``: roles, errors, the run and its report."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from console.models import AuditEntry
from nodes.device_validation import validation_finish
from nodes.models import Node, ValidationRun
from tests.fakenode import FakeNode
from tests.support.validation import machine_report


def test_it_validates_now_as_operator_and_shows_the_run(api, node):
    assert api("viewer", "post", "/nodes/node-01/validations").status_code == 403
    created = api("operator", "post", "/nodes/node-01/validations")
    assert created.status_code == 202
    run = created.json()
    assert (run["state"], run["trigger"], run["requested_by"]) == (
        "queued",
        "demand",
        "token:t-operator",
    )
    # the same button again: the run under way, not a second one
    assert api("operator", "post", "/nodes/node-01/validations").json()["id"] == run["id"]
    status = api("viewer", "get", "/nodes/node-01/validation").json()
    assert status["validation"] == "validating"
    assert api("viewer", "get", "/nodes/node-01").json()["validation"] == "validating"
    validation_finish(
        ValidationRun.objects.get(pk=run["id"]), machine_report("cgroup-limited", threads=4)
    )
    shown = api("viewer", "get", f"/validations/{run['id']}").json()
    # the verdict and the sentence a person acts on, as the matrix words it for that machine
    assert shown["state"] == "failed"
    threads = "threads: threads 4 > CPU budget 2 (affinity 16 CPUs, cgroup quota 2 CPUs): set threads to 2"
    assert threads in shown["reason"].split("; ")
    assert {r["rule"]: r["status"] for r in shown["rules"]} == {
        "cpu.required": "pass",
        "cpu.recommended": "pass",
        "cpu.build": "warn",
        "quantization.repack": "pass",
        "memory": "pass",
        "threads": "fail",
        "numa": "pass",
        "kernel_errors": "warn",
        "accelerators": "warn",
        "pool": "pass",
    }
    assert shown["inventory"]["cpu_budget"]["cgroup_source"].endswith("cri-abc/cpu.max")
    node_now = api("viewer", "get", "/nodes/node-01/validation").json()
    assert (node_now["validation"], node_now["validation_reason"]) == ("failed", shown["reason"])
    listed = api("viewer", "get", "/nodes/node-01/validations").json()
    assert [r["id"] for r in listed] == [run["id"]] and "inventory" not in listed[0]
    assert AuditEntry.objects.filter(action="node.validate", target="node-01").exists()


def test_it_answers_clear_errors(api, node):
    assert api("operator", "post", "/nodes/nope/validations").status_code == 404
    assert api("viewer", "get", "/validations/999").json()["code"] == "validation_not_found"
    assert api("viewer", "get", "/nodes/node-01/validations?limit=0").status_code == 422
    no_reason = api("admin", "post", "/nodes/node-01/validation/waive", json={"reason": "  "})
    assert no_reason.status_code == 422 and no_reason.json()["field"] == "reason"


def test_it_waives_as_admin_only(api, node):
    Node.objects.filter(pk=node.pk).update(validation="failed")
    body = {"reason": "external llama-server, checked by hand"}
    assert api("operator", "post", "/nodes/node-01/validation/waive", json=body).status_code == 403
    waived = api("admin", "post", "/nodes/node-01/validation/waive", json=body).json()
    assert waived["validation"] == "waived"
    assert "checked by hand" in waived["validation_reason"]


def test_it_turns_the_measured_weight_off_by_patch(api, node):
    Node.objects.filter(pk=node.pk).update(measured_speed=1.5)
    assert api("admin", "get", "/nodes/node-01").json()["routing_weight"] == 1.5
    patched = api("admin", "patch", "/nodes/node-01", json={"weight_measured": False, "weight": 2})
    assert (patched.json()["routing_weight"], patched.json()["weight_measured"]) == (2.0, False)


@pytest.mark.django_db(transaction=True)
def test_the_command_validates_a_node_and_prints_the_report(package, capsys):
    fake = FakeNode("node-01").start()
    try:
        rep = machine_report("nvidia-l4", threads=4)
        fake.validation_report, fake.device = (
            rep,
            {"instance": "i-1", "fingerprint": rep["fingerprint"]},
        )
        Node.objects.create(node_id="node-01", address=fake.address, package=package)
        call_command("validate", "node-01")
    finally:
        fake.stop()
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["state"] == "warned"
    assert result["reason"] == (
        "kernel_errors: 2 kernel errors since boot, the first: NVRM: GPU 0000:41:00.0: "
        "RmInitAdapter failed! (0x24:0x65:1417); accelerators.nvidia: NVIDIA Corporation "
        "AD104GL [L4] present (driver 535.161.08) but this llama.cpp build has no CUDA backend: "
        "the node serves from its CPUs"
    )
    assert (
        "  warn  accelerators.nvidia: NVIDIA Corporation AD104GL [L4] present (driver "
        "535.161.08) but this llama.cpp build has no CUDA backend: the node serves from its CPUs"
    ) in err.splitlines()
    assert err.splitlines()[-1].startswith("node-01: warned in ")
    assert Node.objects.get().validation == "warned"


@pytest.mark.django_db(transaction=True)
def test_the_command_exits_1_for_a_node_that_cannot_validate(package, capsys):
    fake = FakeNode("node-01").start()  # an external server: POST /validation is not found
    try:
        Node.objects.create(node_id="node-01", address=fake.address, package=package)
        with pytest.raises(SystemExit) as exited:
            call_command("validate", "node-01")
    finally:
        fake.stop()
    assert exited.value.code == 1
    result = json.loads(capsys.readouterr().out.strip())
    assert result["state"] == "failed"
    assert result["reason"].startswith("the node does not report its devices")
