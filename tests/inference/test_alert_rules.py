"""The alert rules as pure functions over plain snapshots (inference.alerts.rules)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from inference.alerts.rules import RULES, Ended, NodeView, Snapshot, evaluate, increase

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
T = SimpleNamespace(
    flap_window_s=600,
    flap_count=3,
    window_s=300,
    error_rate_max=0.05,
    error_rate_min_requests=20,
    ttft_p95_max_s=1.0,
    queue_saturation_ratio=1.0,
    restores_skipped_per_min_max=30.0,
    restores_per_min_max=120.0,
    event_window_s=3600,
)


def _rules(snap: Snapshot) -> list[tuple[str, str]]:
    return [(f.rule, f.subject) for f in evaluate(snap, T)]


def test_it_finds_nothing_on_a_healthy_array():
    snap = Snapshot(now=NOW, nodes=[NodeView("node-01", "up", ttft_p95_s=0.2)])
    assert _rules(snap) == []


def test_it_fires_node_down_only_for_down_nodes():
    nodes = [NodeView(n, s) for n, s in [("a", "down"), ("b", "draining"), ("c", "unknown")]]
    assert _rules(Snapshot(now=NOW, nodes=nodes)) == [("node_down", "node:a")]


def test_it_fires_flapping_at_the_count():
    nodes = [NodeView("a", "up", went_down=3), NodeView("b", "up", went_down=2)]
    assert _rules(Snapshot(now=NOW, nodes=nodes)) == [("node_flapping", "node:a")]


def _window(start: dict, end: dict) -> Snapshot:
    return Snapshot(now=NOW, start={"a": start}, end={"a": end}, window_s=300.0)


def test_it_fires_error_rate_over_the_bound_with_enough_requests():
    assert _rules(_window({"requests": 100, "failed": 0}, {"requests": 200, "failed": 6})) == [
        ("error_rate", "node:a")
    ]
    assert _rules(_window({"requests": 100, "failed": 0}, {"requests": 200, "failed": 5})) == []
    assert _rules(_window({"requests": 0, "failed": 0}, {"requests": 10, "failed": 10})) == []


def test_it_takes_a_reset_counter_for_its_new_value():
    assert increase({"requests": 500}, {"requests": 40}, "requests") == 40
    assert increase({}, {"requests": 40}, "requests") is None


def test_it_fires_ttft_p95_over_the_target():
    nodes = [NodeView("a", "up", ttft_p95_s=1.5), NodeView("b", "up", ttft_p95_s=None)]
    found = evaluate(Snapshot(now=NOW, nodes=nodes), T)
    assert [(f.rule, f.subject, f.value) for f in found] == [("ttft_p95", "node:a", 1.5)]
    assert "1500 ms" in found[0].message


def test_it_fires_queue_saturation_only_when_held_at_both_ends():
    full, idle = {"queue": 8, "total": 4}, {"queue": 0, "total": 4}
    assert _rules(_window(full, full)) == [("queue_saturation", "node:a")]
    assert _rules(_window(idle, full)) == []


def test_it_fires_kv_thrashing_on_skipped_restores_or_restores_per_minute():
    # 300 s window: 151 skipped = 30.2/min > 30; 601 restores = 120.2/min > 120
    skipped = _window(
        {"restores_skipped": 0, "restored": 0}, {"restores_skipped": 151, "restored": 0}
    )
    restored = _window(
        {"restores_skipped": 0, "restored": 0}, {"restores_skipped": 0, "restored": 601}
    )
    calm = _window(
        {"restores_skipped": 0, "restored": 0}, {"restores_skipped": 150, "restored": 600}
    )
    assert _rules(skipped) == [("kv_thrashing", "node:a")]
    assert _rules(restored) == [("kv_thrashing", "node:a")]
    assert _rules(calm) == []


def test_it_fires_for_rolled_back_upgrades_failed_validations_and_given_up_jobs():
    snap = Snapshot(
        now=NOW,
        nodes=[NodeView("a", "up", validation="failed", validation_reason="bandwidth halved")],
        rolled_back=[Ended("upgrade:7", "Upgrade 7 of m", "bake gate failed", NOW)],
        given_up=[Ended("package_job:3", "Package job 3 (build)", "out of disk", NOW)],
    )
    found = {f.rule: f for f in evaluate(snap, T)}
    assert set(found) == {"upgrade_rolled_back", "validation_failed", "job_given_up"}
    assert found["validation_failed"].subject == "node:a"
    assert "bandwidth halved" in found["validation_failed"].message
    assert found["job_given_up"].subject == "package_job:3"


def test_it_has_the_nine_rules_of_the_issue():
    assert len(RULES) == 9
