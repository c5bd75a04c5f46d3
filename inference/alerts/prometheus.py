"""The alert rules as a Prometheus alerting-rules file over the control plane's ``/metrics``
(``GET /api/alerts/rules.yaml``), thresholds from ``AlertSettings``, for those who run
Alertmanager. One rule per ``inference.alerts.rules.RULES`` entry, the same name in
CamelCase; every metric named is one our ``/metrics`` serves (a test checks).
docs/alerts.md; format: prometheus.io/docs/prometheus/latest/configuration/alerting_rules/.
"""

from __future__ import annotations

from typing import Any

import yaml


def _m(window_s: int) -> str:
    return f"{max(1, window_s // 60)}m"


def _exprs(t: Any) -> dict[str, tuple[str, str, str]]:
    """rule -> (PromQL, ``for``, summary)."""
    w, ev = _m(t.window_s), _m(t.event_window_s)
    failed = f"increase(phalanx_node_failed_requests_total[{w}])"
    requests = f"increase(phalanx_node_requests_total[{w}])"
    return {
        "node_down": (
            'phalanx_node_state{state="down"} == 1',
            "0s",
            "Node {{ $labels.node }} is down",
        ),
        "node_flapping": (
            f'increase(phalanx_node_events_total{{kind="went_down"}}[{_m(t.flap_window_s)}]) >= {t.flap_count}',
            "0s",
            "Node {{ $labels.node }} is flapping",
        ),
        "error_rate": (
            f"({failed} / {requests}) > {t.error_rate_max} and {requests} >= {t.error_rate_min_requests}",
            "0s",
            "Node {{ $labels.node }} fails {{ $value | humanizePercentage }} of requests",
        ),
        "ttft_p95": (
            f"phalanx_node_ttft_p95_seconds > {t.ttft_p95_max_s}",
            "0s",
            "Node {{ $labels.node }} TTFT P95 is {{ $value | humanizeDuration }}",
        ),
        "queue_saturation": (
            f"phalanx_node_queue_depth >= {t.queue_saturation_ratio} * phalanx_node_sequences_total",
            w,
            "Node {{ $labels.node }} queue is saturated",
        ),
        "kv_thrashing": (
            f"rate(phalanx_node_restores_skipped_total[{w}]) * 60 > {t.restores_skipped_per_min_max}"
            f" or rate(phalanx_node_restored_from_host_total[{w}]) * 60 > {t.restores_per_min_max}",
            "0s",
            "Node {{ $labels.node }} host-RAM KV store is thrashing",
        ),
        "upgrade_rolled_back": (
            f'increase(phalanx_upgrades_finished_total{{state="rolled_back"}}[{ev}]) > 0',
            "0s",
            "An upgrade rolled back",
        ),
        "validation_failed": (
            'phalanx_node_validation{state="failed"} == 1',
            "0s",
            "Node {{ $labels.node }} failed device validation",
        ),
        "job_given_up": (
            f'increase(phalanx_jobs_finished_total{{state="failed"}}[{ev}]) > 0',
            "0s",
            "A {{ $labels.kind }} job was given up",
        ),
    }


def rules_document(t: Any) -> dict[str, Any]:
    """``{"groups": [{"name": "phalanx", "rules": [{"alert", "expr", "for", "labels",
    "annotations"}]}]}`` for thresholds ``t`` (an ``AlertSettings``)."""
    rules = [
        {
            "alert": "Phalanx" + "".join(p.capitalize() for p in rule.split("_")),
            "expr": expr,
            "for": hold,
            "labels": {"severity": "page" if rule == "node_down" else "warning", "rule": rule},
            "annotations": {"summary": summary},
        }
        for rule, (expr, hold, summary) in _exprs(t).items()
    ]
    return {"groups": [{"name": "phalanx", "rules": rules}]}


def rules_yaml(t: Any) -> str:
    """``rules_document(t)`` as YAML text (what ``promtool check rules`` reads)."""
    return yaml.safe_dump(rules_document(t), sort_keys=False, width=1000)
