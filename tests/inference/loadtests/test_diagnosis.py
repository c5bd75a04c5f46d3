"""Findings after a run: each rule of the troubleshooting table fires on its evidence and
stays quiet on a clean run."""

from __future__ import annotations

from inference.loadtests.analysis import CostInputs
from inference.loadtests.report import build_report
from inference.loadtests.scenario import parse_scenario
from tests.inference.loadtests.synthetic import REPORT_SECTIONS, curve, turn

SCENARIO = parse_scenario({"name": "d", "kind": "agent_sessions", "steps": [1, 2, 4]})


def report_of(turns, sessions, steps, samples=()):
    return build_report(
        scenario=SCENARIO,
        target="http://127.0.0.1:1",
        state="succeeded",
        turns=turns,
        sessions=sessions,
        steps=steps,
        samples=list(samples),
        costs=CostInputs(),
    )


def balanced_samples(n=5, cpu=90.0):
    return [
        {
            "nodes": {
                "node-01": {"cpu": cpu, "active": 1, "queue": 0, "kv_pct": 5},
                "node-02": {"cpu": cpu, "active": 1, "queue": 0, "kv_pct": 5},
            },
            "health_ms": 5.0,
            "console_ms": 20.0,
        }
        for _ in range(n)
    ]


def clean_run():
    turns, sessions, steps = curve([(1, 0.05, 30), (2, 0.06, 58), (4, 0.08, 110)])
    for i, t in enumerate(turns):
        t["node"] = "node-01" if i % 2 else "node-02"
    for s in sessions:
        s["nodes"] = ["node-01"]
    return turns, sessions, steps


def rules(report):
    return [f["rule"] for f in report["findings"]]


def test_a_clean_run_has_no_findings():
    assert rules(report_of(*clean_run(), balanced_samples())) == []


def test_it_finds_broken_stickiness_with_the_session_that_moved():
    turns, sessions, steps = clean_run()
    sessions[0]["nodes"] = ["node-01", "node-02"]
    found = report_of(turns, sessions, steps, balanced_samples())["findings"]
    assert [f["rule"] for f in found] == ["session_moved"]
    assert f"{sessions[0]['sid']}: node-01 -> node-02" in found[0]["evidence"]


def test_it_blames_quantization_for_invalid_tool_calls():
    turns, sessions, steps = clean_run()
    turns += [
        turn(2, 4, tool_req=True, tool_called=True, tool_valid=i < 7, node="node-01")
        for i in range(10)
    ] + [turn(2, 4, node="node-02") for _ in range(10)]
    found = report_of(turns, sessions, steps, balanced_samples())["findings"]
    assert "tool_calls" in [f["rule"] for f in found]
    assert "7 of 10 required tool calls" in found[0]["evidence"]


def test_it_tells_cut_off_tool_calls_from_wrong_ones():
    turns, sessions, steps = clean_run()
    turns += [
        turn(
            2,
            4,
            tool_req=True,
            tool_called=False,
            tool_valid=False,
            finish="length",
            node="node-01",
        )
        for _ in range(10)
    ] + [turn(2, 4, node="node-02") for _ in range(10)]
    found = rules(report_of(turns, sessions, steps, balanced_samples()))
    assert found == ["tool_calls", "tool_calls_truncated"]


def test_it_finds_one_node_saturated_while_another_idles():
    turns, sessions, steps = clean_run()
    for t in turns:
        t["node"] = "node-01"
    samples = [{"nodes": {"node-01": {"cpu": 95.0}, "node-02": {"cpu": 3.0}}}] * 5
    found = report_of(turns, sessions, steps, samples)["findings"]
    assert "placement" in [f["rule"] for f in found]
    assert "node-01 answered 100% of requests" in next(
        f["evidence"] for f in found if f["rule"] == "placement"
    )


def test_it_finds_queueing_while_the_cpu_idles():
    turns, sessions, steps = clean_run()
    for t in turns:
        t["queue_ms"], t["ttft"] = 200.0, 0.25
    found = report_of(turns, sessions, steps, balanced_samples(cpu=30.0))["findings"]
    assert "queueing" in [f["rule"] for f in found]


def test_it_finds_a_cold_start():
    turns, sessions, steps = clean_run()
    first = min((t for t in turns if t["node"] == "node-02"), key=lambda t: t["t"])
    first["ttft"] = 4.0
    found = report_of(turns, sessions, steps, balanced_samples())["findings"]
    assert [f["rule"] for f in found] == ["cold_start"]
    assert "node-02's first turn waited 4.00 s" in found[0]["evidence"]


def stalled_run():
    turns, sessions, steps = curve([(1, 0.05, 30), (2, 0.05, 32), (4, 0.05, 33)])
    for t in turns:  # per-stream decode falls as concurrency grows
        t["lat"] = t["ttft"] + 0.2 * t["c"] ** 2
    return turns, sessions, steps


def cpu_samples(node_cpu, host_cpu, cpus=1):
    return [
        {
            "step": step,
            "nodes": {"node-01": {"cpu": node_cpu, "cpus": cpus, "host_cpu": host_cpu}},
            "health_ms": 5.0,
            "console_ms": 20.0,
        }
        for step in range(3)
    ]


def test_it_finds_memory_bandwidth_when_streams_stall_and_throughput_stays_flat():
    found = report_of(*stalled_run(), cpu_samples(40.0, 45.0))["findings"]
    assert [f["rule"] for f in found] == ["memory_bandwidth"]
    assert "the CPU had room (busiest node 40 % of its CPUs, host 45 %)" in found[0]["evidence"]


def test_it_says_cpu_was_not_measured_when_it_blames_bandwidth_without_cpu_samples():
    samples = [{"nodes": {"node-01": {"cpu": 99.0}}, "health_ms": 5.0, "console_ms": 9.0}] * 5
    found = report_of(*stalled_run(), samples)["findings"]
    assert [f["rule"] for f in found] == ["memory_bandwidth"]
    assert "CPU saturation is not ruled out" in found[0]["evidence"]


def test_it_blames_a_node_out_of_cpu_before_memory_bandwidth():
    # one CPU a node, the node's process at 98 % of it: the stall is the CPU
    found = report_of(*stalled_run(), cpu_samples(98.0, 60.0))["findings"]
    assert [f["rule"] for f in found] == ["cpu_saturated"]
    assert found[0]["cause"].startswith("CPU saturated")
    assert "at 4 sessions node-01 used 98 % of the CPUs it computes on" in found[0]["evidence"]


def test_it_blames_a_busy_host_before_memory_bandwidth():
    # a node with 2 CPUs at half of them, but the host at 100 %: still no CPU left
    found = report_of(*stalled_run(), cpu_samples(100.0, 100.0, cpus=2))["findings"]
    assert [f["rule"] for f in found] == ["cpu_saturated"]
    assert "the host's CPUs were 100 % busy" in found[0]["evidence"]
    assert "node-01 used" not in found[0]["evidence"]


def test_it_finds_overload_and_a_slow_control_plane():
    turns, sessions, steps = clean_run()
    turns.append(turn(2, 4, ok=False, error="http_429 array_full", ttft=None))
    samples = balanced_samples()
    for s in samples:
        s["console_ms"] = 1500.0
    found = rules(report_of(turns, sessions, steps, samples))
    assert "overload" in found and "control_plane" in found


def test_a_run_that_measured_nothing_still_has_every_section():
    report = report_of([], [], [])
    assert REPORT_SECTIONS <= set(report)
    assert report["summary"]["requests"] == 0 and report["summary"]["knee_concurrency"] is None
    assert report["findings"] == [] and not report["capacity"]["reachable"]
