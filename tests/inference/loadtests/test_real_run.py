"""Load tests against a real array (control plane, control loop, a node agent with the bundled
model, on loopback): a short run from the command line, a run from the API in the control
loop's worker (which proves the target is this control plane before it mints a token),
stopped, and the console answering during it; a worker killed mid-run resumed, and every
token minted for the run revoked. States and order are asserted, never timings:
how fast a stop lands is printed by ``bench/loadtest.py``."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.inference.loadtests.synthetic import REPORT_SECTIONS
from tests.support.processes import REPO
from tests.support.serving_array import serving_array

pytestmark = [pytest.mark.e2e, pytest.mark.model]

TINY = """
name: tiny-agents
kind: agent_sessions
steps: [1, 2]
turns: 3
tool_call_fraction: 0.5
max_tokens: 8
tool_max_tokens: 64
max_s: 240
"""
HEADLINE = {
    "knee_concurrency",
    "session_p95_s",
    "turn_ttft_p95_s",
    "errors",
    "requests",
    "sessions_per_node",
    "cost_per_session",
}


@pytest.fixture(scope="module")
def array(tmp_path_factory):
    with serving_array(tmp_path_factory.mktemp("loadtest-home")) as array:
        yield array


def until(check, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(step)


def test_a_short_run_from_the_command_line_reports_every_section(array, tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "loadtest",
            "--file",
            str(scenario),
            "--target",
            array.url,
            "--token",
            array.token,
            "--profile",
            "--quiet",
        ],
        cwd=REPO,
        env={**os.environ, **array.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    headline = json.loads(done.stdout.strip().splitlines()[-1])
    assert HEADLINE <= set(headline)
    assert headline["state"] == "succeeded"
    assert headline["requests"] == 9 and headline["errors"] == 0  # 1 + 2 sessions, 3 turns

    report = array.api("GET", f"/loadtests/{headline['run']}/report").json()
    assert REPORT_SECTIONS <= set(report)
    assert [r["concurrency"] for r in report["steps"]] == [1, 2]
    assert report["nodes"][0]["node"] == "node-lt1" and report["nodes"][0]["requests"] == 9
    # the control plane answered every probe while the run ran
    health = report["control_plane"]["health"]
    assert health["count"] >= 1 and health["failed"] == 0, health
    # the summary counts the tool-required turns the per-turn export lists, each checked
    required = [t for t in report["turns"] if t["tool_req"]]
    calls = report["tool_calls"]
    assert calls["required"] == len(required) >= 1, (calls, len(required))
    assert calls["valid"] == sum(1 for t in required if t["tool_valid"])
    # every later turn of a session reuses that session's own KV on its node
    later = [t for t in report["turns"] if t["turn"] > 0]
    assert later and all(t["hit"] for t in later)
    assert report["summary"]["cached_ratio"] > 0.5
    assert report["profiles"]["control_plane"].get("file") == "control_plane.svg", report[
        "profiles"
    ]
    # the node too: the process on its address holds the credential this array derives for it
    assert report["profiles"]["node"].get("file") == "node.svg", report["profiles"]
    svg = array.api("GET", f"/loadtests/{headline['run']}/profiles/control_plane.svg")
    assert svg.status_code == 200 and b"<svg" in svg.content[:2000]

    steps = array.api("GET", f"/loadtests/{headline['run']}/report.csv").text
    rows = list(csv.DictReader(io.StringIO(steps)))
    assert [r["concurrency"] for r in rows] == ["1", "2"]
    turns = array.api("GET", f"/loadtests/{headline['run']}/report.csv?rows=turns").text
    assert len(list(csv.DictReader(io.StringIO(turns)))) == 9


def test_a_run_from_the_api_runs_in_a_worker_and_stops_keeping_what_it_measured(array):
    spec = {
        "name": "long-steady",
        "kind": "steady",
        "concurrency": 2,
        "hold_s": 300,
        "turns": 4,
        "max_tokens": 16,
        "max_s": 400,
    }
    started = array.api("POST", "/loadtests", json={"spec": spec, "target_url": array.url})
    assert started.status_code == 201, started.text
    run_id = started.json()["id"]

    def measuring():
        run = array.api("GET", f"/loadtests/{run_id}").json()
        return run if run["state"] == "running" and run["live"].get("answered", 0) >= 3 else None

    run = until(measuring, timeout=120)
    assert run, array.api("GET", f"/loadtests/{run_id}").json()
    assert run["live"]["concurrency"] == 2

    # the console answers while the run goes on: each answer comes before the run ends
    for path in ("/health", "/api/nodes", f"/api/loadtests/{run_id}", "/login/"):
        headers = {"Authorization": f"Bearer {array.token}"}
        assert httpx.get(f"{array.url}{path}", headers=headers, timeout=30).status_code == 200
    during = array.api("GET", f"/loadtests/{run_id}").json()
    assert during["state"] == "running" and not during["cancel_requested"]

    answered = during["live"]["answered"]
    stop = array.api("POST", f"/loadtests/{run_id}/stop")
    assert stop.status_code == 200
    stopped = until(
        lambda: array.api("GET", f"/loadtests/{run_id}").json()["state"] == "stopped",
        timeout=120,
    )
    assert stopped, array.api("GET", f"/loadtests/{run_id}").json()
    report = array.api("GET", f"/loadtests/{run_id}/report").json()
    assert report["state"] == "stopped"
    # every turn that had finished before the stop is kept in the report
    assert sum(1 for t in report["turns"] if t["ok"]) >= answered >= 3
    assert report["steps"][0]["concurrency"] == 2
    console = report["control_plane"]["console"]  # the console answered during the run
    assert console["count"] >= 1 and console["failed"] == 0, console
    # a session the stop cut short is not counted as a complete conversation
    for session in report["sessions"]:
        its_own = sum(1 for t in report["turns"] if t["sid"] == session["sid"] and t["ok"])
        assert session["complete"] == (its_own == session["turns"]), session
    # the control loop ran it in a worker process of its own (``manage.py loadtestjob``)
    assert (
        f"load test {run_id}: stopped"
        in (array.home / "logs" / f"loadtest-{run_id}.log").read_text()
    )
    assert array.api("POST", f"/loadtests/{run_id}/stop").status_code == 409


def _row(array, sql: str, *args):
    import sqlite3

    with sqlite3.connect(array.home / "phalanx.sqlite3", timeout=30) as db:
        return db.execute(sql, args).fetchone()


def _tokens(array, run_id: int) -> dict[int, bool]:
    """``{token id: revoked}`` of every token minted for the run (read from the array's
    database: no API shows them)."""
    (minted,) = _row(array, "SELECT minted_tokens FROM inference_loadtestrun WHERE id = ?", run_id)
    return {
        i: bool(_row(array, "SELECT revoked FROM inference_apitoken WHERE id = ?", i)[0])
        for i in json.loads(minted)
    }


def test_a_killed_worker_resumes_and_every_token_minted_for_the_run_dies_with_it(array):
    import signal

    spec = {
        "name": "killed-steady",
        "kind": "steady",
        "concurrency": 1,
        "hold_s": 300,
        "turns": 4,
        "max_tokens": 8,
        "max_s": 400,
    }
    started = array.api("POST", "/loadtests", json={"spec": spec, "target_url": array.url})
    assert started.status_code == 201, started.text
    run_id = started.json()["id"]

    def answering(attempt):
        run = array.api("GET", f"/loadtests/{run_id}").json()
        ok = run["state"] == "running" and run["attempts"] == attempt
        return run if ok and run["live"].get("answered", 0) >= 1 else None

    assert until(lambda: answering(1), timeout=120), array.api("GET", f"/loadtests/{run_id}").json()
    first = _tokens(array, run_id)
    assert list(first.values()) == [False]  # one token, minted by the first attempt, valid
    (pid,) = _row(array, "SELECT pid FROM inference_loadtestrun WHERE id = ?", run_id)
    os.kill(pid, signal.SIGKILL)

    # the control loop queues it again and a new worker resumes it with a token of its own
    # (the live figures still show the first attempt's until the new one writes its own)
    resumed_with_its_own = until(
        lambda: answering(2) and len(_tokens(array, run_id)) == 2, timeout=180
    )
    assert resumed_with_its_own, array.api("GET", f"/loadtests/{run_id}").json()
    resumed = _tokens(array, run_id)
    assert len(resumed) == 2 and resumed[next(iter(first))] is True  # the dead one's is revoked
    assert sorted(resumed.values()) == [False, True]  # the running attempt's still works
    assert array.api("POST", f"/loadtests/{run_id}/stop").status_code == 200
    assert until(
        lambda: array.api("GET", f"/loadtests/{run_id}").json()["state"] == "stopped", timeout=120
    )
    assert all(_tokens(array, run_id).values())  # and the stop revoked the second
