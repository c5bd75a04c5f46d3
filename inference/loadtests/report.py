"""A run's report, assembled from its records (pure), and its CSV export.

Sections (every report has each, empty when nothing was measured)::

    {"scenario": {...spec}, "target": url, "state": "succeeded" | "stopped" | ...,
     "summary": {"requests", "errors", "duration_s", "nodes", "knee_concurrency",
                 "knee_metric", "bend_concurrency", "session_p95_s", "session_p99_s",
                 "turn_ttft_p95_s", "turn_latency_p95_s", "tokens_per_s", "cached_ratio",
                 "sessions_per_node", "cost_per_session", "cost_per_million_tokens",
                 "tool_call_validity", "target_p95_s", "tightest_target_p95_s",
                 "tightest_knee_concurrency", "tightest_sessions_per_node",
                 "tightest_cost_per_session", "tightest_cost_per_million_tokens"},
     "steps": [analysis.step_rows + analysis.step_cpu], "curve": [{"concurrency", "tokens_per_s",
     "requests_per_s", "p95_s", "meets"}], "ttft_split": {...}, "tool_calls": {...},
     "nodes": [analysis.node_rows], "errors": [analysis.error_rows],
     "control_plane": {"health": latency, "console": latency}, "capacity": {...},
     "capacity_tightest": {...} | None (the plan at the tightest target the run meets,
     ``analysis.tightest_target`` over ``TARGETS_S``),
     "targets": [{"target_p95_s", "knee_concurrency", "sessions_per_node"}],
     "findings": [diagnosis], "profiles": {...}}
"""

from __future__ import annotations

import csv
import io
from typing import Any

from inference.loadtests import analysis
from inference.loadtests.diagnosis import diagnose
from inference.loadtests.scenario import Scenario

PLANNED_SESSIONS = 1000  # the capacity plan a report carries; the page plans for any count
TARGETS_S = (0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)  # the knee at other P95 targets, for planning
TIGHTEST_FIELDS = (
    "tightest_target_p95_s",
    "tightest_knee_concurrency",
    "tightest_sessions_per_node",
    "tightest_cost_per_session",
    "tightest_cost_per_million_tokens",
)


def knees_by_target(rows: list[dict[str, Any]], nodes: int, scenario_target: float) -> list[dict]:
    """The knee and sessions per node at each of ``TARGETS_S`` (and the scenario's target):
    what the same run says under a looser or tighter P95."""
    targets = sorted({*TARGETS_S, scenario_target})
    out = []
    for target in targets:
        found = analysis.knee(rows, target)
        out.append(
            {
                "target_p95_s": target,
                "knee_concurrency": found["concurrency"] if found else None,
                "sessions_per_node": analysis.rounded(
                    analysis.sessions_per_node(rows, target, nodes), 3
                ),
            }
        )
    return out


def build_report(
    *,
    scenario: Scenario,
    target: str,
    state: str,
    turns: list[dict[str, Any]],
    sessions: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    costs: analysis.CostInputs,
    profiles: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report of a run (shape in the module docstring); ``samples`` are the run's live
    samples (``{"t", "nodes": {...}, "health_ms", "console_ms"}``)."""
    rows = analysis.step_rows(turns, sessions, steps)
    analysis.step_cpu(rows, samples)
    for row in rows:
        row["meets"] = analysis.meets_target(row, scenario.target_p95_s)
    tightest = analysis.tightest_target(rows, TARGETS_S)
    node_rows = analysis.node_rows(turns, sessions, samples)
    serving = max(1, sum(1 for n in node_rows if n["requests"]))

    def plan(target_p95_s: float) -> dict[str, Any]:
        return analysis.capacity_plan(
            rows=rows,
            nodes_in_run=serving,
            sessions=PLANNED_SESSIONS,
            target_p95_s=target_p95_s,
            costs=costs,
        )

    report: dict[str, Any] = {
        "scenario": scenario.as_spec(),
        "target": target,
        "state": state,
        "steps": rows,
        "curve": [_curve_point(r) for r in rows],
        "ttft_split": analysis.ttft_split(turns),
        "tool_calls": analysis.tool_calls(turns),
        "nodes": node_rows,
        "errors": analysis.error_rows(turns),
        "control_plane": {
            "health": analysis.latency_summary([s.get("health_ms") for s in samples]),
            "console": analysis.latency_summary([s.get("console_ms") for s in samples]),
        },
        "capacity": plan(scenario.target_p95_s),
        "capacity_tightest": plan(tightest) if tightest is not None else None,
        "targets": knees_by_target(rows, serving, scenario.target_p95_s),
        "profiles": profiles or {},
    }
    report["summary"] = _summary(report, turns, sessions, steps, serving)
    report["findings"] = diagnose(report, turns, sessions)
    return report


def _curve_point(row: dict[str, Any]) -> dict[str, Any]:
    """One point of the throughput-against-concurrency curve from a step row."""
    return {
        "concurrency": row["concurrency"],
        "tokens_per_s": row["tokens_per_s"],
        "requests_per_s": row["requests_per_s"],
        "p95_s": analysis.knee_metric(row),
        "meets": row["meets"],
    }


def _summary(
    report: dict[str, Any],
    turns: list[dict[str, Any]],
    sessions: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    serving: int,
) -> dict[str, Any]:
    """The report's headline figures, over the whole run (shape in the module docstring)."""
    ok = [t for t in turns if t["ok"]]
    complete = [s["dur"] for s in sessions if s["complete"]]
    wall = sum(max(0.0, s["ended"] - s["started"]) for s in steps)
    prompt = sum(t["prompt"] for t in ok)
    target = report["scenario"]["target_p95_s"]
    found = analysis.knee(report["steps"], target)
    plan = report["capacity"]
    pct = analysis.percentile
    return {
        "requests": len(turns),
        "errors": len(turns) - len(ok),
        "duration_s": round(wall, 2),
        "nodes": serving,
        "target_p95_s": target,
        "knee_concurrency": found["concurrency"] if found else None,
        "knee_metric": "TTFT P95 of cache-hit turns",
        "bend_concurrency": analysis.bend(report["steps"]),
        "sessions": len(complete),
        "session_mean_s": analysis.rounded(analysis.mean_of(complete), 3),
        "session_p95_s": analysis.rounded(pct(complete, 95), 3),
        "session_p99_s": analysis.rounded(pct(complete, 99), 3),
        "turn_ttft_p95_s": analysis.rounded(
            pct((t["ttft"] for t in ok if t["hit"]), 95) or pct((t["ttft"] for t in ok), 95)
        ),
        "turn_latency_p95_s": analysis.rounded(pct((t["lat"] for t in ok), 95)),
        "tokens_per_s": round(sum(t["completion"] for t in ok) / wall, 2) if wall else 0.0,
        "cached_ratio": analysis.rounded(sum(t["cached"] for t in ok) / prompt) if prompt else None,
        "sessions_per_node": plan["sessions_per_node"],
        "cost_per_session": plan["cost_per_session"],
        "cost_per_million_tokens": plan["cost_per_million_tokens"],
        "tool_call_validity": report["tool_calls"]["validity"],
        **_tightest(report),
    }


def _tightest(report: dict[str, Any]) -> dict[str, Any]:
    """The summary's answer at the tightest target the run meets (``capacity_tightest``),
    so capacity and cost are never empty: ``tightest_target_p95_s`` (s),
    ``tightest_knee_concurrency``, ``tightest_sessions_per_node``, ``tightest_cost_per_session``
    and ``tightest_cost_per_million_tokens``; all None when no step met any target."""
    plan = report.get("capacity_tightest") or {}
    found = analysis.knee(report["steps"], plan["target_p95_s"]) if plan else None
    return {
        "tightest_target_p95_s": plan.get("target_p95_s"),
        "tightest_knee_concurrency": found["concurrency"] if found else None,
        "tightest_sessions_per_node": plan.get("sessions_per_node"),
        "tightest_cost_per_session": plan.get("cost_per_session"),
        "tightest_cost_per_million_tokens": plan.get("cost_per_million_tokens"),
    }


def headline(report: dict[str, Any], *, run_id: int | None = None) -> dict[str, Any]:
    """The one JSON line ``manage.py loadtest`` ends with: the summary's figures under the
    names operators script against."""
    s = report["summary"]
    return {
        "run": run_id,
        "scenario": report["scenario"]["name"],
        "state": report["state"],
        "knee_concurrency": s["knee_concurrency"],
        "bend_concurrency": s["bend_concurrency"],
        "session_p95_s": s["session_p95_s"],
        "session_p99_s": s["session_p99_s"],
        "turn_ttft_p95_s": s["turn_ttft_p95_s"],
        "errors": s["errors"],
        "requests": s["requests"],
        "sessions_per_node": s["sessions_per_node"],
        "cost_per_session": s["cost_per_session"],
        "cost_per_million_tokens": s["cost_per_million_tokens"],
        **{k: s.get(k) for k in TIGHTEST_FIELDS},
        "tokens_per_s": s["tokens_per_s"],
        "cached_ratio": s["cached_ratio"],
        "tool_call_validity": s["tool_call_validity"],
        "findings": [f["rule"] for f in report["findings"]],
    }


STEP_COLUMNS = (
    "concurrency",
    "requests",
    "errors",
    "requests_per_s",
    "tokens_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "hit_ttft_p95_s",
    "turn_p50_s",
    "turn_p95_s",
    "sessions",
    "session_p95_s",
    "session_p99_s",
    "cached_ratio",
    "stream_decode_tps",
    "node_cpu_pct",
    "host_cpu_pct",
)
TURN_COLUMNS = (
    "step",
    "c",
    "sid",
    "turn",
    "kind",
    "t",
    "ttft",
    "lat",
    "ok",
    "error",
    "node",
    "prompt",
    "cached",
    "completion",
    "queue_ms",
    "prefill_ms",
    "node_ttft_ms",
    "decode_tps",
    "finish",
    "hit",
    "tool_req",
    "tool_called",
    "tool_valid",
)


def steps_csv(report: dict[str, Any]) -> str:
    """The step table as CSV (one row per concurrency step)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=STEP_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(report["steps"])
    return out.getvalue()


def turns_csv(turns: list[dict[str, Any]]) -> str:
    """Every request of the run as CSV (one row per turn)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=TURN_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(turns)
    return out.getvalue()
