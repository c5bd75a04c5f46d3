"""The pure parts of a rolling upgrade: settings, batches, the bake comparison."""

from __future__ import annotations

import re

import pytest

from inference.upgrades import plan


def test_settings_take_defaults_and_refuse_what_is_wrong():
    chosen = plan.settings_with_defaults({"max_unavailable": 2, "bake_s": 5})
    assert chosen["max_unavailable"] == 2 and chosen["bake_s"] == 5.0
    assert chosen["canary_share"] == plan.DEFAULTS["canary_share"]
    with pytest.raises(plan.BadSettings, match="^bake_secs: not a setting") as bad:
        plan.settings_with_defaults({"bake_secs": 5})
    assert bad.value.field == "bake_secs"
    with pytest.raises(plan.BadSettings, match="canary_share: between 0 and 1"):
        plan.settings_with_defaults({"canary_share": 1.5})
    with pytest.raises(plan.BadSettings, match="max_unavailable: a whole number"):
        plan.settings_with_defaults({"max_unavailable": 1.5})
    with pytest.raises(plan.BadSettings, match="bake_s: a number"):
        plan.settings_with_defaults({"bake_s": "5"})
    with pytest.raises(plan.BadSettings, match="bake_s: a number"):
        plan.settings_with_defaults({"bake_s": True})


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"threads": 257}, "threads: a whole number from 1 to 256"),
        ({"threads": 0}, "threads: a whole number from 1 to 256"),
        ({"sequences": 100_000}, "sequences: a whole number from 1 to 256"),
        ({"ctx_per_seq": 8192}, "ctx_per_seq: a whole number from 256 to 4096 (the package's"),
        ({"ctx_per_seq": 16}, "ctx_per_seq: a whole number from 256 to 4096"),
        ({"host_ram_mib": 2**40}, "host_ram_mib: a whole number from 1 to 1048576"),
        ({"threads": 2.5}, "threads: a whole number from 1 to 256"),
        ({"threads": True}, "threads: a whole number from 1 to 256"),
        ({"kv_type": 1}, "kv_type: not a setting (threads, sequences, ctx_per_seq, host_ram_mib)"),
    ],
)
def test_node_settings_are_bounded_on_both_sides(given, says):
    with pytest.raises(plan.BadSettings, match=f"^{re.escape(says)}") as bad:
        plan.node_settings_checked(given, context_window=4096)
    assert bad.value.field == next(iter(given))


def test_node_settings_within_bounds_pass_as_given():
    top = {"threads": 256, "sequences": 256, "ctx_per_seq": 4096, "host_ram_mib": 1_048_576}
    assert plan.node_settings_checked(top, context_window=4096) == top
    assert plan.node_settings_checked({"ctx_per_seq": 131_072}, context_window=10**6) == {
        "ctx_per_seq": 131_072
    }
    with pytest.raises(plan.BadSettings, match="from 256 to 131072$"):
        plan.node_settings_checked({"ctx_per_seq": 131_073}, context_window=10**6)
    assert plan.node_settings_checked(None, context_window=4096) == {}


def test_node_setting_limits_name_exactly_what_a_node_can_switch():
    from nodes.agent.switch import SETTINGS

    assert tuple(plan.NODE_SETTING_LIMITS) == SETTINGS


def test_nodes_go_emptiest_first_in_batches():
    order = plan.upgrade_order({"n3": 0, "n1": 4, "n2": 0})
    assert order == ["n2", "n3", "n1"]
    assert plan.batches(order, 2) == [["n2", "n3"], ["n1"]]
    assert plan.batches(order, 0) == [["n2"], ["n3"], ["n1"]]


def test_the_side_counts_deltas_and_a_restart_from_zero():
    before = {"a": {"requests": 10, "failed": 1, "tool_parse_failures": 0}}
    after = {
        "a": {"requests": 15, "failed": 2, "tool_parse_failures": 1, "ttft_p95": 0.4},
        "b": {"requests": 3, "failed": 0, "tool_parse_failures": 0, "ttft_p95": 0.9},
    }
    side = plan.side_from(before, after)
    assert (side.requests, side.failed, side.tool_parse_failures) == (8, 1, 1)
    assert side.ttft_p95 == 0.9 and side.error_rate == 1 / 8
    restarted = plan.side_from({"a": {"requests": 50}}, {"a": {"requests": 4}})
    assert restarted.requests == 4


SETTINGS = plan.settings_with_defaults({})


def test_the_bake_passes_a_version_as_good_as_the_old():
    old = plan.Side(requests=100, failed=1, ttft_p95=0.5)
    new = plan.Side(requests=40, failed=1, ttft_p95=0.6)
    gates = plan.bake_gates(old, new, SETTINGS)
    assert [g["gate"] for g in gates] == ["error_rate", "tool_parse", "ttft_p95"]
    assert all(g["passed"] for g in gates) and {g["verdict"] for g in gates} == {"pass"}
    assert gates[2]["detail"] == "TTFT P95 0.60 s (new) against 0.50 s (old), at most 1.00 s"


def test_the_bake_fails_more_errors_broken_tool_calls_or_slower_first_tokens():
    old = plan.Side(requests=100, failed=1, ttft_p95=0.5)
    errors = plan.bake_gates(old, plan.Side(requests=20, failed=2, ttft_p95=0.5), SETTINGS)
    assert not errors[0]["passed"] and errors[0]["verdict"] == "fail"
    assert errors[0]["detail"] == "error rate 10.0% (new) against 1.0% (old), at most 3.0%"
    tools = plan.bake_gates(old, plan.Side(requests=20, tool_parse_failures=5), SETTINGS)
    assert [g["passed"] for g in tools] == [True, False]
    slow = plan.bake_gates(old, plan.Side(requests=20, ttft_p95=1.01), SETTINGS)
    assert [g["passed"] for g in slow] == [True, True, False]


def test_too_little_traffic_is_skipped_never_a_pass():
    gates = plan.bake_gates(plan.Side(requests=50), plan.Side(requests=2, failed=2), SETTINGS)
    assert gates == [
        {
            "gate": "bake",
            "verdict": "skipped",
            "passed": False,
            "detail": "skipped: too little traffic to compare (2 requests on the new version, "
            "50 on the old; at least 3 each)",
            "values": {"new_requests": 2, "old_requests": 50, "min_requests": 3},
        }
    ]
    # no request on a side compares nothing, whatever min_requests says
    none = plan.bake_gates(plan.Side(), plan.Side(requests=9), {**SETTINGS, "min_requests": 0})
    assert [g["verdict"] for g in none] == ["skipped"]
    compared = plan.bake_gates(plan.Side(requests=3), plan.Side(requests=3), SETTINGS)
    assert [g["verdict"] for g in compared] == ["pass", "pass"]  # no TTFT on either side


def test_the_no_traffic_rule_is_pause_or_proceed():
    assert plan.settings_with_defaults({})["no_traffic"] == "pause"
    assert plan.settings_with_defaults({"no_traffic": "proceed"})["no_traffic"] == "proceed"
    with pytest.raises(plan.BadSettings, match="^no_traffic: one of pause, proceed$") as bad:
        plan.settings_with_defaults({"no_traffic": "go"})
    assert bad.value.field == "no_traffic"


def test_standby_nodes_surge_first_then_serving_ones_in_batches():
    loads = {"n1": 3, "n2": 0, "spare-a": 0, "spare-b": 0, "n3": 1}
    assert plan.plan_batches(loads, {"spare-b", "spare-a"}, 2) == [
        (["spare-a", "spare-b"], True),
        (["n2", "n3"], False),
        (["n1"], False),
    ]
    assert plan.plan_batches({"n1": 0}, set(), 1) == [(["n1"], False)]


def test_node_settings_given_together_are_bounded_together():
    too_many = {"sequences": 256, "ctx_per_seq": 8192}
    with pytest.raises(plan.BadSettings) as bad:
        plan.node_settings_checked(too_many, context_window=10**6)
    assert str(bad.value) == (
        "sequences * ctx_per_seq: 256 * 8192 = 2,097,152 KV cells, over the 1,048,576 one "
        "node's context may hold"
    )
    assert bad.value.field == "sequences"
