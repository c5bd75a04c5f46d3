"""The design brief's load test, here: the ``agent-sessions`` scenario (a ramp of 1, 2, 4, 8,
16, 32 concurrent tool-calling agent sessions, 8 turns each) against ``manage.py up --nodes 2``,
headless through ``manage.py loadtest``; prints the report's step table, the knee, the knees at
other P95 targets, the cost per session and the findings.

``--quick`` runs the two quick built-ins instead (``ramp-quick``, ``agent-sessions-quick``),
each against the same array. Goals: the full run within 10 minutes, each quick one within 3.
The last line is one JSON object: per scenario its headline (``manage.py loadtest``'s JSON line)
and ``seconds``, ``console_p95_ms``/``console_max_ms`` (the console API's latency during the
run, goal 1 s), ``stop_s`` (how long a stop over the API took to land, goal 2 s), and
``goal_ratio`` (the longest run's seconds over its goal; under 1 meets it).
The peer measured in the same run is the per-request view a request-level tool (vLLM's
``bench serve``, GenAI-Perf) would report: ``request_p95_s`` (E2E latency of single
requests) beside ``session_p95_s`` (whole conversations), and their ratio.

    python bench/loadtest.py [--quick] [--port 8600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.harness import bundled_model_path, emit, percentile, spawn  # noqa: E402
from tests.support.processes import REPO  # noqa: E402

TOKEN = "phx_bench_loadtest_token_0123456789"
GOALS = {"agent-sessions": 600.0, "ramp-quick": 180.0, "agent-sessions-quick": 180.0}
CONSOLE_GOAL_MS = 1000.0  # the console's API answers within a second while a run runs


def start_array(home: Path, port: int):
    (home / "models").mkdir(parents=True)
    model = bundled_model_path()
    (home / "models" / model.name).symlink_to(model)
    env = {"PHALANX_HOME": str(home), "PHALANX_API_TOKEN": TOKEN, "PHALANX_ADMIN_PASSWORD": "bench"}
    proc = spawn(
        [sys.executable, "manage.py", "up", "--nodes", "2", "--port", str(port)],
        home / "up.log",
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            nodes = httpx.get(
                f"{base}/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"}
            ).json()
            if len(nodes) == 2 and all(
                n["state"] == "up" and n["validation"] in ("passed", "warned") for n in nodes
            ):
                return proc, base, env
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    proc.stop()
    raise RuntimeError(f"the array did not come up:\n{proc.log()[-3000:]}")


def run_scenario(name: str, base: str, env: dict[str, str]) -> dict:
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "loadtest",
            name,
            "--target",
            base,
            "--token",
            TOKEN,
            "--quiet",
        ],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    headline = json.loads(done.stdout.strip().splitlines()[-1])
    report = httpx.get(
        f"{base}/api/loadtests/{headline['run']}/report",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    ).json()
    show(name, report, seconds)
    costs = cost_by_target(base, headline["run"], report)
    request_p95 = percentile([t["lat"] for t in report["turns"] if t["ok"]], 95)
    session_p95 = report["summary"]["session_p95_s"]
    return {
        **headline,
        "seconds": round(seconds, 1),
        "goal_s": GOALS[name],
        "request_p95_s": round(request_p95, 3),
        "session_vs_request_p95": round(session_p95 / request_p95, 2)
        if request_p95 and session_p95
        else None,
        "cost_by_target": costs,
        # the console stays usable under load: its API's P95 and worst answer during the run
        # (goal CONSOLE_GOAL_MS; the tests assert only that it answered)
        "console_p95_ms": report["control_plane"]["console"].get("p95_ms"),
        "console_max_ms": report["control_plane"]["console"].get("max_ms"),
        "console_goal_ms": CONSOLE_GOAL_MS,
    }


def cost_by_target(base: str, run_id: int, report: dict) -> list[dict]:
    """The capacity plan for 1,000 sessions at each P95 target the run met at some step
    (``POST /api/loadtests/<id>/capacity``), with the cost model's defaults."""
    plans = []
    for t in report["targets"]:
        if t["knee_concurrency"] is None:
            continue
        plan = httpx.post(
            f"{base}/api/loadtests/{run_id}/capacity",
            json={"sessions": 1000, "target_p95_s": t["target_p95_s"]},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ).json()
        plans.append(
            {
                k: plan[k]
                for k in (
                    "target_p95_s",
                    "sessions_per_node",
                    "nodes_needed",
                    "cost_per_session",
                    "cost_per_million_tokens",
                )
            }
        )
        print(
            f" at P95 <= {plan['target_p95_s']} s: {plan['sessions_per_node']} sessions/node, "
            f"{plan['nodes_needed']} nodes for 1000 sessions, cost per session "
            f"{plan['cost_per_session']}, per million tokens {plan['cost_per_million_tokens']}"
        )
    return plans


STOP_GOAL_S = 2.0  # a stop lands within two seconds (the tests assert only its state)


def stop_seconds(base: str) -> float | None:
    """Seconds from ``POST /api/loadtests/<id>/stop`` to the run's state ``stopped``, for a
    steady run of 2 sessions started over the API with no token (so the worker proves this
    control plane and mints one), stopped once it answered 3 turns; None if it never ran."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    spec = {"name": "bench-stop", "kind": "steady", "concurrency": 2, "hold_s": 300,
            "turns": 4, "max_tokens": 16, "max_s": 400}  # fmt: skip
    run = httpx.post(f"{base}/api/loadtests", json={"spec": spec}, headers=headers, timeout=30)
    run_id = run.json()["id"]
    url = f"{base}/api/loadtests/{run_id}"
    deadline = time.monotonic() + 120
    while httpx.get(url, headers=headers, timeout=30).json()["live"].get("answered", 0) < 3:
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    started = time.perf_counter()
    httpx.post(f"{url}/stop", headers=headers, timeout=30)
    while httpx.get(url, headers=headers, timeout=30).json()["state"] != "stopped":
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    print(
        f"\n== stop: the run was stopped {seconds:.2f} s after the request (goal {STOP_GOAL_S} s)"
    )
    return round(seconds, 2)


def show(name: str, report: dict, seconds: float) -> None:
    s = report["summary"]
    print(
        f"\n== {name}: {report['state']} in {seconds:.0f} s; {s['requests']} requests, {s['errors']} errors"
    )
    print(
        " conc  req  err  req/s  tok/s  TTFT p50  TTFT p95  hit p95  turn p95  sess p95  sess p99  cached"
    )
    for r in report["steps"]:
        print(
            f"{r['concurrency']:5} {r['requests']:4} {r['errors']:4} {r['requests_per_s']:6} "
            f"{r['tokens_per_s']:6} {r['ttft_p50_s']!s:>9} {r['ttft_p95_s']!s:>9} "
            f"{r['hit_ttft_p95_s']!s:>8} {r['turn_p95_s']!s:>9} {r['session_p95_s']!s:>9} "
            f"{r['session_p99_s']!s:>9} {r['cached_ratio']!s:>7}"
        )
    print(
        f" knee (P95 <= {s['target_p95_s']} s on cache-hit TTFT): {s['knee_concurrency']}; "
        f"curve bends after {s['bend_concurrency']}"
    )
    print(
        " knees by target: "
        + ", ".join(f"{t['target_p95_s']} s -> {t['knee_concurrency']}" for t in report["targets"])
    )
    cap = report["capacity"]
    print(
        f" sessions/node {s['sessions_per_node']}, cost per session {s['cost_per_session']}, "
        f"per million tokens {s['cost_per_million_tokens']}, node-month {cap['node_month']['total']}"
    )
    print(f" TTFT split: {report['ttft_split']}")
    print(f" control plane: {report['control_plane']}")
    print(f" tool calls: {report['tool_calls']}")
    for f in report["findings"]:
        print(f" finding: {f['symptom']} -> {f['cause']}: {f['evidence']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--port", type=int, default=8600)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="phalanx-loadtest-"))
    proc, base, env = start_array(home, args.port)
    try:
        names = ["ramp-quick", "agent-sessions-quick"] if args.quick else ["agent-sessions"]
        results = {name: run_scenario(name, base, env) for name in names}
        stop_s = stop_seconds(base)
    finally:
        proc.stop(timeout=30)
    ratio = max(r["seconds"] / r["goal_s"] for r in results.values())
    emit(
        {
            "scenarios": results,
            "stop_s": stop_s,
            "stop_goal_s": STOP_GOAL_S,
            "goal_ratio": round(ratio, 3),
            "ratio": round(ratio, 3),
        }
    )


if __name__ == "__main__":
    main()
