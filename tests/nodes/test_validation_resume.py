"""A control loop killed in the middle of a validation (SIGKILL: no cleanup) and a new one
started: the run the row holds is picked up where it was, and the node ends validated, never
left "validating". Real processes on loopback: a control plane, the control loop and a node
agent with the bundled model."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import pytest

from tests.support.processes import Proc, control_plane_at_home, spawn, start_node
from tests.support.serving_array import FAST_LOOP, PACKAGE, ServingArray

pytestmark = [pytest.mark.model, pytest.mark.e2e]
NODE_ARGS = ["--sequences", "8", "--ctx-per-seq", "1024", "--host-ram-mib", "64"]


def until(what: Callable[[], object], *, timeout: float = 180.0, why: str = "") -> object:
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, why
        time.sleep(0.2)
    return value


def start_loop(array: ServingArray, name: str) -> Proc:
    return spawn(
        [sys.executable, "manage.py", "controlloop"], array.home / f"{name}.log", env=array.env
    )


def test_a_validation_survives_its_control_loop_being_killed(tmp_path):
    daphne, token, extra = control_plane_at_home(tmp_path, setup=FAST_LOOP)
    array = ServingArray(daphne.url, token, extra, tmp_path, {"daphne": daphne})
    try:
        array.procs["node"] = node = start_node("node-k1", tmp_path, extra_args=NODE_ARGS)
        array.procs["loop"] = first = start_loop(array, "loop-1")
        body = {"node_id": "node-k1", "address": node.url.removeprefix("http://")}
        assert array.api("PUT", "/nodes/node-k1", json={**body, "package": PACKAGE}).is_success

        def runs() -> list[dict]:
            return array.api("GET", "/nodes/node-k1/validations").json()

        running = until(
            lambda: [r for r in runs() if r["state"] == "running" and r["phase"] != "starting"],
            why="the first loop did not get the run going",
        )[0]
        os.killpg(first.popen.pid, signal.SIGKILL)  # mid-benchmark, as a crash would
        first.popen.wait(10)
        assert array.api("GET", "/nodes/node-k1").json()["validation"] == "validating"

        array.procs["loop-2"] = start_loop(array, "loop-2")
        node_row = until(
            lambda: (
                (n := array.api("GET", "/nodes/node-k1").json())["validation"]
                in ("passed", "warned")
                and n["state"] == "up"
                and n
            ),
            why=f"the node was not validated after the restart: {runs()}",
        )
        (run,) = runs()  # the same run, picked up: none left open, none started twice
        assert (run["id"], run["state"]) == (running["id"], node_row["validation"])
        figures = {"memory_bandwidth_gb_s", "prompt_tok_s", "decode_tok_s_1", "decode_tok_s_8"}
        assert figures <= set(run["bench"]) and run["finished_at"] is not None
    finally:
        for proc in reversed(list(array.procs.values())):
            proc.stop()
