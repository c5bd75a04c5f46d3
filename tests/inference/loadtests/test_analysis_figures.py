"""The report's tables and rules to the figure: the per-node table, costs and plans, the knee's
rule at its edges, the curve's bend, the tightest target, CPU per step, errors, probes and tool
calls, each on plain data."""

from __future__ import annotations

from inference.loadtests import analysis
from inference.loadtests.analysis import CostInputs, capacity_plan, knee
from tests.inference.loadtests.synthetic import turn


def test_it_tables_each_node_from_its_requests_first_sessions_and_samples():
    turns = [turn(0, 1, node="node-01")] * 4 + [turn(0, 1, node="node-02")] * 2
    turns += [turn(0, 1, node="node-03"), turn(0, 1, ok=False, node="")]  # "": never routed
    sessions = [{"nodes": ["node-02", "node-01"]}, {"nodes": ["node-01"]}, {"nodes": []}]
    samples = [
        {"nodes": {"node-01": {"cpu": 90.25, "kv_pct": 20.25, "active": 3, "queue": 1}}},
        {"nodes": None},
        {},
        {"nodes": {"node-01": {"cpu": 70.0, "kv_pct": 30.55, "active": 2, "queue": None}}},
        {"nodes": {"node-01": {"active": 2, "queue": 4}, "node-04": {"cpu": 5.0}}},
    ]
    nothing = dict.fromkeys(
        ("cpu_mean", "cpu_peak", "kv_peak_pct", "active_peak", "active_mean", "queue_peak")
    )
    assert analysis.node_rows(turns, sessions, samples) == [
        {
            "node": "node-01",
            "requests": 4,
            "sessions": 1,
            "share": 0.571,
            "cpu_mean": 80.1,
            "cpu_peak": 90.2,
            "kv_peak_pct": 30.6,
            "active_peak": 3,
            "active_mean": 2.33,
            "queue_peak": 4,
        },
        {"node": "node-02", "requests": 2, "sessions": 1, "share": 0.286, **nothing},
        {"node": "node-03", "requests": 1, "sessions": 0, "share": 0.143, **nothing},
        {
            "node": "node-04",
            "requests": 0,
            "sessions": 0,
            "share": 0.0,
            **nothing,
            "cpu_mean": 5.0,
            "cpu_peak": 5.0,
        },
    ]


def test_it_shares_nothing_out_when_no_request_reached_a_node():
    samples = [{"nodes": {"node-01": {"cpu": 0.0, "queue": 0}}}]
    assert analysis.node_rows([turn(0, 1, ok=False, node="")], [], samples) == [
        {
            "node": "node-01",
            "requests": 0,
            "sessions": 0,
            "share": 0.0,
            "cpu_mean": 0.0,
            "cpu_peak": 0.0,
            "kv_peak_pct": None,
            "active_peak": None,
            "active_mean": None,
            "queue_peak": 0,
        }
    ]


def test_it_prices_the_default_node_month():
    assert CostInputs().node_month() == {
        "power": 36.5,  # 250 W for 730 h at 0.20 a kWh
        "hardware": 111.1111,  # 4000 over 36 months
        "operations": 60.0,
        "space": 40.0,
        "total": 247.6111,
    }


def knee_row(c, p95, **figures):
    return {
        "concurrency": c,
        "hit_turns": 1,
        "hit_ttft_p95_s": p95,
        "ttft_p95_s": 9.0,
        "error_rate": 0.0,
        "requests": 10,
        **figures,
    }


def test_it_prices_a_plan_at_the_knee_with_its_own_session_length():
    rows = [knee_row(4, 0.5, tokens_per_s=60.0), knee_row(2, 0.1, tokens_per_s=50.0)]
    rows[1]["session_mean_s"] = 90.0
    plan = capacity_plan(
        rows=rows, nodes_in_run=1, sessions=7, target_p95_s=0.3, costs=CostInputs()
    )
    assert plan == {
        "sessions": 7,
        "target_p95_s": 0.3,
        "sessions_per_node": 2.0,
        "node_month": CostInputs().node_month(),
        "inputs": {
            "power_w": 250.0,
            "electricity_per_kwh": 0.2,
            "hardware_cost": 4000.0,
            "amortization_months": 36.0,
            "operations_per_month": 60.0,
            "space_per_month": 40.0,
        },
        "reachable": True,
        "nodes_needed": 4,  # 7 sessions at 2 a node
        "array_month": 990.44,
        "cost_per_session": 0.00424,  # 90 s of a node-hour (247.6111 / 730), halved
        "cost_per_million_tokens": 1.8844,
    }


def test_it_plans_under_one_session_a_node_and_leaves_unknown_costs_out():
    rows = [knee_row(1, 0.1, tokens_per_s=0.9, session_mean_s=61.0), knee_row(2, 0.9)]
    costs = CostInputs(
        power_w=100,
        electricity_per_kwh=0.3,
        hardware_cost=1000,
        amortization_months=12,
        operations_per_month=7,
        space_per_month=3,
    )
    plan = capacity_plan(rows=rows, nodes_in_run=3, sessions=3, target_p95_s=0.3, costs=costs)
    assert (plan["reachable"], plan["sessions_per_node"], plan["nodes_needed"]) == (True, 0.333, 9)
    assert plan["node_month"] == {
        "power": 21.9,
        "hardware": 83.3333,
        "operations": 7,
        "space": 3,
        "total": 115.2333,
    }
    assert (plan["cost_per_session"], plan["cost_per_million_tokens"]) == (0.008024, 146.161)
    rows[0].update(tokens_per_s=0.0, session_mean_s=None)
    plan = capacity_plan(rows=rows, nodes_in_run=3, sessions=3, target_p95_s=0.3, costs=costs)
    assert plan["cost_per_session"] is None and plan["cost_per_million_tokens"] is None
    assert analysis.sessions_per_node(rows, 0.3, 0) == 0.0


def test_it_meets_a_target_at_its_edges_and_judges_one_turn_sessions_on_every_turn():
    assert analysis.meets_target(knee_row(1, 0.3), 0.3)
    assert analysis.meets_target(knee_row(1, 0.1, error_rate=0.01), 0.3)
    assert not analysis.meets_target(knee_row(1, 0.1, error_rate=0.0101), 0.3)
    assert not analysis.meets_target(knee_row(1, 0.1, requests=0), 0.3)
    assert analysis.meets_target(knee_row(1, 0.1, requests=1), 0.3)
    assert not analysis.meets_target(knee_row(1, None), 0.3)
    one_turn = knee_row(1, None, hit_turns=0, ttft_p95_s=0.25)
    assert analysis.knee_metric(one_turn) == 0.25 and analysis.meets_target(one_turn, 0.3)


def test_it_finds_the_knee_in_concurrency_order_whatever_the_row_order():
    rows = [knee_row(8, 0.9), knee_row(2, 0.2), knee_row(4, 0.3), knee_row(1, 0.1)]
    assert knee(rows, 0.3)["concurrency"] == 4


def test_it_bends_where_a_step_adds_under_a_quarter_of_proportional_throughput():
    def rows(*points):
        return [{"concurrency": c, "tokens_per_s": tps} for c, tps in points]

    assert analysis.bend(rows((1, 100.0), (2, 125.0))) is None  # exactly a quarter: no bend
    assert analysis.bend(rows((1, 100.0), (2, 124.0))) == 1
    assert analysis.bend(rows((4, 100.0), (2, 80.0), (8, 120.0))) == 4  # +20 % for +100 %
    assert analysis.bend(rows((1, 100.0), (2, 130.0))) is None
    assert analysis.bend(rows((1, 0.0), (2, 10.0), (4, 11.0))) == 2  # nothing to scale 1 from
    assert analysis.bend(rows((2, 100.0), (2, 100.0), (4, 190.0))) is None  # a repeated step
    assert analysis.bend(rows((1, 100.0), (3, 140.0))) == 1  # +40 % for +200 %


def test_past_the_ladder_the_tightest_target_rounds_up_to_two_figures():
    def tightest(p95, **figures):
        return analysis.tightest_target([knee_row(2, 99.0), knee_row(1, p95, **figures)], ())

    assert tightest(0.123) == 0.13
    assert tightest(0.13) == 0.13  # already two figures: kept
    assert tightest(0.5) == 0.5
    assert tightest(123.0) == 130.0
    assert tightest(0.0000009) == 0.000001  # kept to the microsecond
    assert tightest(0.0) is None
    assert tightest(0.123, error_rate=0.5) is None  # the lowest step failed
    assert analysis.tightest_target([knee_row(1, 0.2)], (5.0, 0.25, 1.0)) == 0.25


def test_it_takes_the_nearest_rank_at_every_edge():
    assert analysis.percentile(range(1, 101), 99) == 99
    assert analysis.percentile(range(1, 201), 99) == 198
    assert analysis.percentile(range(1, 201), 50) == 100
    assert analysis.percentile([3, 1, 2], 0) == 1
    assert analysis.mean_of([1.0, None, 2.0]) == 1.5 and analysis.mean_of([None]) is None
    assert analysis.rounded(None) is None and analysis.rounded(1.234567) == 1.2346


def test_it_takes_each_steps_busiest_node_and_host_from_that_steps_samples():
    rows = [{"step": 0}, {"step": 1}]
    samples = [
        {
            "step": 0,
            "nodes": {
                "a": {"cpu": 151.1, "cpus": 2, "host_cpu": 0.0},
                "b": {"cpu": 30.0, "cpus": 0, "host_cpu": 60.0},  # CPUs unknown: not judged
                "c": {"cpu": 10.0, "cpus": 1},
            },
        },
        {"step": 0, "nodes": {"a": {"cpu": 100.0, "cpus": 2, "host_cpu": 33.33}}},
        {"step": 0, "nodes": None},
        {"nodes": {"a": {"cpu": 200.0, "cpus": 2, "host_cpu": 99.0}}},  # between steps
    ]
    analysis.step_cpu(rows, samples)
    assert rows == [
        {"step": 0, "node_cpu_pct": 62.8, "node_cpu_node": "a", "host_cpu_pct": 46.7},
        {"step": 1, "node_cpu_pct": None, "node_cpu_node": None, "host_cpu_pct": None},
    ]


def test_it_counts_every_figure_of_tool_call_validity():
    def call(valid, finish="stop", **kw):
        figures = {"tool_req": True, "tool_called": True, "tool_valid": valid, **kw}
        return turn(0, 1, finish=finish, **figures)

    turns = [call(True), call(True, "length"), call(False), call(False, "length")]
    turns += [call(False, "length", tool_called=False), call(False, tool_called=False)]
    turns += [call(True, ok=False), call(False, "length", ok=False)]  # failed: not counted
    turns += [turn(0, 1, tool_called=True, tool_valid=True)]
    turns += [turn(0, 1, tool_called=True, tool_valid=False), turn(0, 1)]
    turns += [turn(0, 1, ok=False, tool_called=True, tool_valid=True)]
    assert analysis.tool_calls(turns) == {
        "required": 6,
        "valid": 2,
        "truncated": 2,
        "validity": 0.3333,
        "unrequired_calls": 2,
        "unrequired_valid": 1,
    }
    assert analysis.tool_calls([])["validity"] is None


def test_it_names_failures_without_a_kind_and_cuts_long_messages():
    no_message = {k: v for k, v in turn(0, 1, ok=False, error="timeout").items() if k != "message"}
    turns = [turn(0, 1), turn(0, 1, ok=False, error="", message="x" * 400), no_message]
    assert analysis.error_rows(turns) == [
        {"kind": "unknown", "count": 1, "share": 0.3333, "example": "x" * 300},
        {"kind": "timeout", "count": 1, "share": 0.3333, "example": ""},
    ]


def test_it_folds_errors_only_past_twenty_kinds_summing_what_each_row_has():
    twenty = [{"kind": f"k{i}", "count": 1, "share": 0.01, "example": "m"} for i in range(20)]
    assert analysis.fold_error_rows(twenty) == twenty
    rows = [*twenty[:19], {"kind": "a", "count": 2, "share": 0.12345, "example": "y" * 400}]
    rows += [{"kind": "b"}, {"kind": "c", "count": 3, "share": 0.1, "example": "z"}]
    assert analysis.fold_error_rows(rows)[19:] == [
        {"kind": "other (3 kinds)", "count": 5, "share": 0.2235, "example": "y" * 300}
    ]
    bare = [*twenty[:19], {"kind": "a"}, {"kind": "b", "example": "e"}]
    assert analysis.fold_error_rows(bare)[19:] == [
        {"kind": "other (2 kinds)", "count": 0, "share": 0.0, "example": ""}
    ]


def test_it_summarises_probe_latencies_and_their_failures():
    assert analysis.latency_summary([10.04, None, 30.06, 20.04, 15.55]) == {
        "count": 5,
        "failed": 1,
        "p50_ms": 15.6,
        "p95_ms": 30.1,
        "max_ms": 30.1,
    }
    twenty = analysis.latency_summary([v + 0.04 for v in range(1, 21)])
    assert (twenty["p50_ms"], twenty["p95_ms"], twenty["max_ms"]) == (10.0, 19.0, 20.0)
    assert analysis.latency_summary([None]) == {
        "count": 1,
        "failed": 1,
        "p50_ms": None,
        "p95_ms": None,
        "max_ms": None,
    }
