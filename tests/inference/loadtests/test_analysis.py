"""Knee detection, the curve's bend, capacity and cost maths, on synthetic curves."""

from __future__ import annotations

import pytest

from inference.loadtests import analysis
from inference.loadtests.analysis import CostInputs, capacity_plan, knee, step_rows
from tests.inference.loadtests.synthetic import curve, turn


def rows_of(points, **kw):
    turns, sessions, steps = curve(points, **kw)
    return step_rows(turns, sessions, steps)


def test_it_takes_the_nearest_rank_percentile():
    assert analysis.percentile([5, 1, 4, 2, 3], 50) == 3
    assert analysis.percentile(range(1, 101), 95) == 95
    assert analysis.percentile([], 95) is None
    assert analysis.percentile([None, 2.0], 95) == 2.0


def test_it_finds_the_knee_at_the_last_step_meeting_the_target():
    rows = rows_of([(1, 0.05, 30), (2, 0.08, 55), (4, 0.2, 90), (8, 0.6, 100), (16, 1.5, 101)])
    assert knee(rows, 0.3)["concurrency"] == 4
    assert knee(rows, 1.0)["concurrency"] == 8
    assert knee(rows, 0.01) is None


def test_it_stops_the_knee_at_the_first_miss_even_if_a_later_step_recovers():
    rows = rows_of([(1, 0.05, 30), (2, 0.5, 50), (4, 0.1, 80)])
    assert knee(rows, 0.3)["concurrency"] == 1


def test_it_does_not_count_a_step_with_errors_as_meeting_the_target():
    turns, sessions, steps = curve([(1, 0.05, 30), (2, 0.05, 50)])
    turns += [turn(1, 2, ok=False, error="http_429 array_full", ttft=None) for _ in range(3)]
    rows = step_rows(turns, sessions, steps)
    assert rows[1]["error_rate"] > analysis.MAX_ERROR_RATE_AT_KNEE
    assert knee(rows, 0.3)["concurrency"] == 1


def test_it_judges_the_knee_on_cache_hit_turns_only():
    turns, sessions, steps = curve([(1, 0.05, 30)])
    turns += [turn(0, 1, ttft=3.0, hit=False) for _ in range(5)]  # first turns: full prefill
    rows = step_rows(turns, sessions, steps)
    assert rows[0]["ttft_p95_s"] == 3.0
    assert rows[0]["hit_ttft_p95_s"] == 0.05
    assert knee(rows, 0.3)["concurrency"] == 1


def test_it_finds_where_the_throughput_curve_bends():
    assert analysis.bend(rows_of([(1, 0.1, 30), (2, 0.1, 58), (4, 0.1, 110), (8, 0.2, 120)])) == 4
    assert analysis.bend(rows_of([(1, 0.1, 30), (2, 0.1, 60), (4, 0.1, 120)])) is None


def test_it_computes_a_step_rows_rates_over_its_wall_time():
    rows = rows_of([(2, 0.1, 50)], turns_per_step=20, duration_s=10)
    assert rows[0]["requests"] == 20
    assert rows[0]["requests_per_s"] == 2.0
    assert rows[0]["tokens_per_s"] == 50.0
    assert rows[0]["cached_ratio"] == pytest.approx(380 / 400)


def test_it_prices_a_node_month_from_its_parts():
    month = CostInputs(
        power_w=500,
        electricity_per_kwh=0.1,
        hardware_cost=3600,
        amortization_months=36,
        operations_per_month=20,
        space_per_month=30,
    ).node_month()
    assert month["power"] == pytest.approx(0.5 * 730 * 0.1)
    assert month["hardware"] == 100
    assert month["total"] == pytest.approx(36.5 + 100 + 20 + 30)


def test_it_plans_nodes_and_cost_from_the_knee():
    rows = rows_of([(2, 0.1, 40), (4, 0.2, 80), (8, 0.9, 90)])
    costs = CostInputs(
        power_w=0,
        hardware_cost=730 * 36,
        amortization_months=36,
        operations_per_month=0,
        space_per_month=0,
    )  # 730 a month: 1 an hour
    plan = capacity_plan(
        rows=rows, nodes_in_run=2, sessions=100, target_p95_s=0.3, costs=costs, session_s=360.0
    )
    assert plan["reachable"] and plan["sessions_per_node"] == 2.0  # knee 4 over 2 nodes
    assert plan["nodes_needed"] == 50
    assert plan["array_month"] == pytest.approx(50 * 730)
    assert plan["cost_per_session"] == pytest.approx(1 * 0.1 / 2)  # a tenth of a node-hour, halved
    # the knee's 80 tok/s over 2 nodes: 40 tok/s a node, 144,000 tokens a node-hour
    assert plan["cost_per_million_tokens"] == pytest.approx(1 / 144_000 * 1e6, rel=1e-3)


def test_it_rounds_nodes_up_and_says_when_no_step_meets_the_target():
    rows = rows_of([(3, 0.1, 40), (6, 2.0, 50)])
    plan = capacity_plan(
        rows=rows, nodes_in_run=1, sessions=10, target_p95_s=0.3, costs=CostInputs(), session_s=60
    )
    assert plan["nodes_needed"] == 4  # 10 / 3 per node
    unreachable = capacity_plan(
        rows=rows, nodes_in_run=1, sessions=10, target_p95_s=0.01, costs=CostInputs(), session_s=60
    )
    assert not unreachable["reachable"]
    assert unreachable["nodes_needed"] is None and unreachable["cost_per_session"] is None


def test_it_splits_ttft_into_queue_prefill_and_what_came_after_the_nodes_first_token():
    split = analysis.ttft_split(
        [turn(0, 1, ttft=0.5, queue_ms=30, prefill_ms=50, node_ttft_ms=80)] * 3
    )
    assert split["queue_p95_ms"] == 30 and split["prefill_p95_ms"] == 50
    assert split["node_ttft_p95_ms"] == 80
    assert split["after_node_p95_ms"] == pytest.approx(420)  # held back, then sent at once


def test_it_takes_per_stream_decode_from_the_node_not_from_a_burst():
    burst = turn(0, 1, ttft=1.0, lat=1.001, completion=30)  # all tokens at once
    assert analysis._stream_rates([burst]) == []
    assert analysis._stream_rates([{**burst, "decode_tps": 38.0}]) == [38.0]
    streamed = turn(0, 1, ttft=0.1, lat=1.1, completion=21)
    assert analysis._stream_rates([streamed]) == [pytest.approx(20.0)]


def test_it_counts_tool_call_validity_over_required_turns():
    turns = [turn(0, 1, tool_req=True, tool_called=True, tool_valid=True)] * 3 + [
        turn(0, 1, tool_req=True, tool_called=False, tool_valid=False),
        turn(0, 1, tool_req=False, tool_called=True, tool_valid=True),
    ]
    calls = analysis.tool_calls(turns)
    assert (calls["required"], calls["valid"], calls["validity"]) == (4, 3, 0.75)
    assert calls["unrequired_calls"] == 1


def test_it_counts_calls_cut_by_the_token_limit_as_invalid_and_apart():
    turns = [turn(0, 1, tool_req=True, tool_called=True, tool_valid=True)] * 3 + [
        turn(0, 1, tool_req=True, tool_called=False, tool_valid=False, finish="length")
    ]
    calls = analysis.tool_calls(turns)
    assert calls["truncated"] == 1 and calls["validity"] == 0.75


def test_it_tables_errors_by_kind_most_frequent_first():
    turns = (
        [turn(0, 1)] * 6
        + [turn(0, 1, ok=False, error="timeout")]
        + [turn(0, 1, ok=False, error="http_429 array_full", message="full")] * 3
    )
    rows = analysis.error_rows(turns)
    assert [(r["kind"], r["count"]) for r in rows] == [("http_429 array_full", 3), ("timeout", 1)]
    assert rows[0]["share"] == 0.3 and rows[0]["example"] == "full"


def test_it_summarises_nodes_from_records_and_samples():
    turns = [turn(0, 1, node="node-01")] * 3 + [turn(0, 1, node="node-02")]
    sessions = [
        {
            "step": 0,
            "c": 1,
            "sid": "a",
            "t": 0,
            "dur": 1,
            "turns": 1,
            "complete": True,
            "nodes": ["node-01"],
        }
    ]
    samples = [
        {
            "nodes": {
                "node-01": {"cpu": 90, "kv_pct": 20, "active": 3, "queue": 1},
                "node-02": {"cpu": 10, "kv_pct": 5, "active": 1, "queue": 0},
            }
        },
        {"nodes": {"node-01": {"cpu": 70, "kv_pct": 30, "active": 2, "queue": 0}}},
    ]
    rows = {r["node"]: r for r in analysis.node_rows(turns, sessions, samples)}
    assert rows["node-01"]["share"] == 0.75 and rows["node-01"]["sessions"] == 1
    assert rows["node-01"]["cpu_mean"] == 80 and rows["node-01"]["kv_peak_pct"] == 30
    assert rows["node-02"]["active_peak"] == 1


def test_the_errors_table_keeps_the_most_frequent_kinds_and_folds_the_rest():
    from inference.loadtests.analysis import MAX_ERROR_KINDS, error_rows

    failed = [
        {**turn(0, 1, sid=f"s{i}", turn=0), "ok": False, "error": f"http_500 k{i}", "message": "m"}
        for i in range(100)
    ] + [{**turn(0, 1, sid="t", turn=k), "ok": False, "error": "timeout"} for k in range(3)]
    rows = error_rows(failed)
    assert len(rows) == MAX_ERROR_KINDS and rows[0]["kind"] == "timeout" and rows[0]["count"] == 3
    assert rows[-1]["kind"] == "other (82 kinds)" and rows[-1]["count"] == 82
    assert sum(r["count"] for r in rows) == 103


def test_it_finds_the_tightest_target_of_the_ladder_the_run_meets():
    # one session's cache-hit TTFT P95 is 1.75 s: 0.3 s is out of reach, 2 s is not
    rows = rows_of([(1, 1.75, 7), (2, 5.6, 20), (4, 6.0, 22)])
    assert knee(rows, 0.3) is None
    assert analysis.tightest_target(rows, (0.1, 0.3, 1.0, 2.0, 5.0)) == 2.0
    assert knee(rows, 2.0)["concurrency"] == 1


def test_past_the_ladder_the_tightest_target_is_the_lowest_steps_p95_rounded_up():
    rows = rows_of([(1, 7.34, 7), (2, 9.0, 8)])
    assert analysis.tightest_target(rows, (0.3, 5.0)) == 7.4
    assert knee(rows, 7.4)["concurrency"] == 1


def test_a_run_whose_first_step_failed_has_no_tightest_target():
    turns, sessions, steps = curve([(1, 0.05, 30)])
    turns += [turn(0, 1, ok=False, error="timeout", ttft=None) for _ in range(5)]
    assert analysis.tightest_target(step_rows(turns, sessions, steps), (0.3, 5.0)) is None
    assert analysis.tightest_target([], (0.3,)) is None


def test_it_measures_each_steps_cpu_against_the_cpus_a_node_computes_on():
    rows = rows_of([(1, 0.1, 30), (2, 0.1, 40)])
    samples = [
        {"step": 0, "nodes": {"a": {"cpu": 50.0, "cpus": 1, "host_cpu": 40.0}}},
        {"step": 1, "nodes": {"a": {"cpu": 190.0, "cpus": 2, "host_cpu": 97.0}}},
        {"step": 1, "nodes": {"a": {"cpu": 170.0, "cpus": 2, "host_cpu": 99.0}, "b": {"cpu": 9.0}}},
    ]
    analysis.step_cpu(rows, samples)
    assert (rows[0]["node_cpu_pct"], rows[0]["host_cpu_pct"]) == (50.0, 40.0)
    assert (rows[1]["node_cpu_pct"], rows[1]["node_cpu_node"], rows[1]["host_cpu_pct"]) == (
        90.0,
        "a",
        98.0,
    )  # b's CPUs are unknown: not judged


# --- each figure of the report's tables, exactly as a user reads it --------------------------


def test_it_fills_every_column_of_the_step_table():
    turns = [
        turn(
            0,
            3,
            ttft=(k + 1) / 100 + 0.000123,
            lat=(k + 1) / 100 + 0.500077 + k / 1000,
            hit=k % 2 == 1,
            prompt=101,
            cached=70 + k,
            completion=10 + k,
        )
        for k in range(40)
    ]
    turns += [turn(0, 3, ok=False, ttft=None, prompt=1000, cached=1000, completion=500)] * 3
    sessions = [{"step": 0, "dur": i / 7 + 0.01234, "complete": True} for i in range(100)]
    sessions.append({"step": 0, "dur": 999.0, "complete": False})
    steps = [{"step": 0, "c": 3, "started": 2.0, "ended": 2.4567}]
    assert step_rows(turns, sessions, steps) == [
        {
            "step": 0,
            "concurrency": 3,
            "requests": 43,
            "errors": 3,
            "error_rate": 0.0698,
            "duration_s": 0.46,
            "requests_per_s": 87.585,
            "tokens_per_s": 2583.75,  # 1180 completion tokens of the answered turns
            "ttft_p50_s": 0.2001,
            "ttft_p95_s": 0.3801,
            "hit_turns": 20,
            "hit_ttft_p95_s": 0.3801,
            "turn_p50_s": 0.7191,
            "turn_p95_s": 0.9171,
            "sessions": 100,
            "session_mean_s": 7.084,
            "session_p95_s": 13.441,
            "session_p99_s": 14.012,
            "cached_ratio": 0.8861,
            "stream_decode_tps": 53.95,
        }
    ]


def test_it_keeps_each_step_to_its_own_records_and_an_empty_step_to_zeros():
    turns = [turn(0, 1, ttft=0.2), turn(1, 6, ttft=9.0)]
    sessions = [
        {"step": 1, "dur": 500.0, "complete": True},
        {"step": 0, "dur": 1.0, "complete": True},
    ]
    steps = [
        {"step": 1, "c": 6, "started": 2.5, "ended": 12.5},
        {"step": 2, "c": 8, "started": 12.5, "ended": 12.5},
    ]
    one, empty = step_rows(turns, sessions, steps)
    assert (one["requests"], one["ttft_p95_s"], one["session_mean_s"]) == (1, 9.0, 500.0)
    assert (one["requests_per_s"], one["tokens_per_s"], one["cached_ratio"]) == (0.1, 2.0, 0.95)
    assert one["stream_decode_tps"] is None  # its latency is under its TTFT: no decode span
    assert empty == {
        "step": 2,
        "concurrency": 8,
        "requests": 0,
        "errors": 0,
        "error_rate": 0.0,
        "duration_s": 0.0,
        "requests_per_s": 0.0,
        "tokens_per_s": 0.0,
        "ttft_p50_s": None,
        "ttft_p95_s": None,
        "hit_turns": 0,
        "hit_ttft_p95_s": None,
        "turn_p50_s": None,
        "turn_p95_s": None,
        "sessions": 0,
        "session_mean_s": None,
        "session_p95_s": None,
        "session_p99_s": None,
        "cached_ratio": None,
        "stream_decode_tps": None,
    }


def test_it_measures_a_stream_from_its_first_token_over_50_ms_or_more():
    node_said = turn(0, 1, ttft=0.1, lat=0.2, completion=5, decode_tps=38.5)
    no_ttft = {**turn(0, 1, lat=0.05, completion=2), "ttft": None}  # 1 token in 50 ms
    one_token = turn(0, 1, ttft=0.1, lat=1.1, completion=1)
    assert analysis._stream_rates([node_said, no_ttft, one_token, node_said]) == [
        38.5,
        20.0,
        38.5,
    ]


def test_it_splits_ttft_at_each_percentile_of_the_answered_turns_with_node_timings():
    turns = [
        turn(
            0,
            1,
            ttft=0.1 + k / 1000,
            queue_ms=1.23456 * (k + 1),
            prefill_ms=10.12345 * (k + 1),
            node_ttft_ms=20.003 + k * 1.23456,
        )
        for k in range(20)
    ]
    turns += [
        turn(0, 1, ok=False, queue_ms=999, prefill_ms=999, node_ttft_ms=999),
        {**turn(0, 1), "queue_ms": None},  # a target that sends no timings
    ]
    assert analysis.ttft_split(turns) == {
        "turns": 20,
        "queue_p50_ms": 12.35,
        "queue_p95_ms": 23.46,
        "prefill_p50_ms": 101.23,
        "prefill_p95_ms": 192.35,
        "node_ttft_p50_ms": 31.11,
        "node_ttft_p95_ms": 42.23,
        "after_node_p50_ms": 77.65,
        "after_node_p95_ms": 79.76,
    }
    no_client_ttft = turn(0, 1, ttft=None, queue_ms=0.5, prefill_ms=0.5, node_ttft_ms=1.0)
    no_node_ttft = turn(0, 1, ttft=0.3, queue_ms=0.7, prefill_ms=0.7)
    split = analysis.ttft_split([no_client_ttft, no_node_ttft])
    assert (split["turns"], split["node_ttft_p95_ms"], split["after_node_p95_ms"]) == (2, 1.0, None)
    assert set(analysis.ttft_split([]).values()) == {0, None}
