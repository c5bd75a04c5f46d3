from __future__ import annotations

from nodes.metrics import load_from_metrics, parse_prometheus

TEXT = """# HELP phalanx_node_busy 1 while busy
# TYPE phalanx_node_busy gauge
phalanx_node_busy 1
phalanx_node_sequences{state="active"} 2
phalanx_node_sequences{state="idle"} 5
phalanx_node_sequences_total 8
phalanx_node_queue_depth 2
phalanx_node_kv_used_tokens 1024 1700000000000
garbage line
phalanx_node_requests_total NaN
"""


def test_it_parses_samples_with_canonical_labels():
    samples = parse_prometheus(TEXT)
    assert samples['phalanx_node_sequences{state="active"}'] == 2.0
    assert samples["phalanx_node_kv_used_tokens"] == 1024.0
    assert "garbage" not in samples


def test_it_computes_load_as_active_plus_queue_over_sequences():
    summary = load_from_metrics(parse_prometheus(TEXT))
    assert summary["load"] == 0.5
    assert summary["active"] == 2 and summary["queue"] == 2 and summary["total"] == 8


def test_it_falls_back_to_busy_without_sequence_counts():
    assert load_from_metrics({"phalanx_node_busy": 1.0})["load"] == 1.0


def test_it_reports_unknown_load_without_signals():
    assert load_from_metrics({"phalanx_node_requests_total": 4.0})["load"] is None


def test_it_reads_the_load_of_a_node_that_labels_its_samples_with_its_id():
    text = (
        'phalanx_node_busy{node="node-01"} 1\n'
        'phalanx_node_sequences{node="node-01",state="active"} 2\n'
        'phalanx_node_sequences_total{node="node-01"} 4\n'
        'phalanx_node_queue_depth{node="node-01"} 1\n'
        'phalanx_node_requests_total{node="node-01"} 7\n'
    )
    summary = load_from_metrics(parse_prometheus(text))
    assert summary["load"] == 0.75 and summary["active"] == 2 and summary["requests"] == 7


def test_it_reads_the_host_ram_kept_for_idle_sessions():
    summary = load_from_metrics(
        {"phalanx_node_host_ram_bytes": 3 * 2**20, "phalanx_node_host_ram_budget_bytes": 2**30}
    )
    assert (summary["host_ram"], summary["host_ram_budget"]) == (3 * 2**20, 2**30)
    assert load_from_metrics({})["host_ram_budget"] is None
