"""Device validation through real node agents with the bundled model: a run on this machine,
a run on a fixture machine (its /proc and /sys, real benchmarks), the control plane's gate and
a firmware change seen by the agent's inventory watch."""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest

from inference.node_table import nodes_for_routing
from nodes import device_validation as dv
from nodes.control import ControlLoop
from nodes.devices.host import LocalHost
from nodes.devices.inventory import collect
from nodes.models import Node, ValidationRun
from nodes.services import node_upsert
from tests.support.processes import start_node
from tests.support.validation import MACHINES

pytestmark = [pytest.mark.model, pytest.mark.e2e]
NODE_ARGS = ["--sequences", "8", "--ctx-per-seq", "1024", "--host-ram-mib", "64"]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    proc = start_node("node-v1", tmp_path_factory.mktemp("node"), threads=2, extra_args=NODE_ARGS)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def fixture_node(tmp_path_factory):
    """A real agent whose inventory reads a copy of a fixture machine, rescanned every second."""
    machine = tmp_path_factory.mktemp("machine") / "gpu"
    shutil.copytree(MACHINES / "nvidia-l4", machine)
    saved = {
        k: os.environ.get(k) for k in ("PHALANX_DEVICE_FIXTURE", "PHALANX_INVENTORY_INTERVAL_S")
    }
    os.environ.update(PHALANX_DEVICE_FIXTURE=str(machine), PHALANX_INVENTORY_INTERVAL_S="1")
    try:
        proc = start_node(
            "node-v2", tmp_path_factory.mktemp("node"), threads=2, extra_args=NODE_ARGS
        )
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    proc.machine = machine
    yield proc
    proc.stop()


def wait_done(node, run: str, timeout: float = 300.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{node.url}/validation", headers=node.headers, timeout=5).json()
        if state["run"] == run and state["state"] != "running":
            return state
        time.sleep(0.5)
    raise AssertionError(f"run {run} did not end in {timeout:g} s")


def test_it_validates_this_machine_with_real_benchmarks(node):
    started = httpx.post(f"{node.url}/validation", json={"run": "r-1"}, headers=node.headers)
    assert started.status_code == 202 and started.json()["state"] == "running"
    again = httpx.post(f"{node.url}/validation", json={"run": "r-1"}, headers=node.headers)
    assert again.status_code == 202 and again.json()["run"] == "r-1"  # the same run
    other = httpx.post(f"{node.url}/validation", json={"run": "r-2"}, headers=node.headers)
    assert other.status_code == 409 and "r-1 is under way" in other.json()["error"]["message"]
    state = wait_done(node, "r-1")
    assert state["state"] == "done", state["error"]
    report = state["report"]
    bench = report["bench"]
    # what was measured and how (the figures themselves, and decode at 8 sequences against 1,
    # are bench/validation.py's: a test asserts no speed)
    figures = ("memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1", "decode_tok_s_8")
    assert all(isinstance(bench[key], float) for key in figures), bench
    assert (bench["prompt_tokens"], bench["decode_tokens"], bench["sequences_configured"]) == (
        512,
        64,
        8,
    )
    engine = report["engine"]
    assert (engine["quantization"], engine["threads"], engine["sequences"]) == ("Q4_1", 2, 8)
    assert engine["ctx_per_seq"] == 1024 and engine["host_ram_bytes"] == 64 << 20
    # the inventory is this machine's, as this process reads it
    here = collect(LocalHost())
    inventory = report["inventory"]
    assert inventory["cpu"] == here["cpu"] and inventory["cpu_budget"] == here["cpu_budget"]
    assert inventory["llama"]["features"]["AVX2"] == "1"  # the x86-64-v3 build
    health = httpx.get(f"{node.url}/health").json()
    assert health["device"]["instance"] == report["instance"]
    assert health["device"]["validation"] == {"run": "r-1", "state": "done"}


def test_it_refuses_strangers_and_bad_runs(node):
    assert httpx.post(f"{node.url}/validation", json={"run": "x"}).status_code == 401
    bad = httpx.post(f"{node.url}/validation", json={"run": 7}, headers=node.headers)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_validation"


@pytest.mark.django_db(transaction=True)
def test_the_control_plane_gates_a_real_node_and_revalidates_it_on_a_firmware_change(fixture_node):
    address = fixture_node.url.removeprefix("http://")
    node_upsert(node_id="node-v2", address=address, package_id=None)
    ControlLoop().tick()
    run = ValidationRun.objects.get()
    assert (run.trigger, Node.objects.get().validation) == ("start", "validating")
    run = dv.validation_wait(run, timeout_s=300)
    # the fixture machine's inventory (an L4 without a CUDA build), this machine's benchmarks
    assert run.state == "warned", run.reason
    assert "no CUDA backend" in run.reason
    assert set(run.bench) >= {"memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_8"}
    assert nodes_for_routing(stale_after_s=60).views[0].state == "up"
    assert Node.objects.get().measured_speed == 1.0  # the pool is this node alone

    (fixture_node.machine / "root/sys/class/dmi/id/bios_version").write_text("2.4.1\n")
    deadline = time.monotonic() + 30
    while not ValidationRun.objects.filter(trigger="change").exists():
        assert time.monotonic() < deadline, "the firmware change was not noticed"
        time.sleep(1)
        ControlLoop().tick()
    change = dv.validation_wait(ValidationRun.objects.get(trigger="change"), timeout_s=300)
    assert change.changes == [
        {"path": "firmware.bios_version", "before": "2.3.5", "after": "2.4.1"}
    ]
    assert change.state == "warned"
