"""What a load test's measurements mean: the step table, the knee, capacity, cost, findings.

Pure functions over plain data (no I/O), so every rule is unit-tested on synthetic curves.

A **turn record** (one request, ``inference.loadtests.turns.TurnRecord.as_dict``)::

    {"step": 0, "c": 4, "sid": "lt-7-s0-1", "turn": 2, "kind": "user" | "tool_result",
     "t": 12.3, "ttft": 0.081, "lat": 0.52, "ok": true, "error": "", "node": "node-01",
     "prompt": 311, "cached": 280, "completion": 24, "queue_ms": 3.0, "prefill_ms": 40.1,
     "node_ttft_ms": 45.0, "decode_tps": 38.2, "finish": "stop" | "length" | "tool_calls",
     "hit": true, "tool_req": false, "tool_called": false, "tool_valid": null}

(``queue_ms``, ``prefill_ms``, ``node_ttft_ms`` and ``decode_tps`` are the node's own
``timings``; absent from a target that sends none.)

(``t`` seconds since the run began; ``ttft``/``lat`` seconds; ``hit``: a cache-hit turn, one
after the session's first whose cached prompt tokens cover at least half of the prompt the
session sent before, i.e. its own KV was reused, not only a shared system prompt.)

A **session record**: ``{"step", "c", "sid", "t", "dur", "turns", "complete", "nodes"}``
(``dur``: the whole conversation in seconds, think time and tool waits included; ``nodes``:
the nodes its turns were answered by, in order of first use). A **step record**: ``{"step",
"c", "started", "ended"}``.

Percentiles are nearest-rank. The knee is the highest concurrency of the leading run of steps
that meet the P95 target on cache-hit turns' TTFT with at most 1 % errors (a step after one
that missed does not count: a curve that recovers by chance is not capacity).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

HOURS_PER_MONTH = 365 * 24 / 12  # 730
MAX_ERROR_RATE_AT_KNEE = 0.01
BEND_EFFICIENCY = 0.25  # a step that adds under a quarter of proportional throughput: the bend


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when there are none."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def mean_of(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


# --- the step table ----------------------------------------------------------------------------


def step_rows(
    turns: list[dict[str, Any]], sessions: list[dict[str, Any]], steps: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per step: concurrency, requests, errors, requests/s and completion tokens/s
    over the step's wall time, TTFT P50/P95 (all turns and cache-hit turns), turn latency
    P50/P95, session P95/P99 (complete sessions), cached-token ratio, per-stream decode
    tokens/s (median)."""
    rows = []
    for step in steps:
        mine = [t for t in turns if t["step"] == step["step"]]
        ok = [t for t in mine if t["ok"]]
        done = [s for s in sessions if s["step"] == step["step"] and s["complete"]]
        wall = max(1e-9, step["ended"] - step["started"])
        hits = [t["ttft"] for t in ok if t["hit"]]
        prompt = sum(t["prompt"] for t in ok)
        rows.append(
            {
                "step": step["step"],
                "concurrency": step["c"],
                "requests": len(mine),
                "errors": len(mine) - len(ok),
                "error_rate": rounded((len(mine) - len(ok)) / len(mine)) if mine else 0.0,
                "duration_s": rounded(wall, 2),
                "requests_per_s": rounded(len(ok) / wall, 3),
                "tokens_per_s": rounded(sum(t["completion"] for t in ok) / wall, 2),
                "ttft_p50_s": rounded(percentile((t["ttft"] for t in ok), 50)),
                "ttft_p95_s": rounded(percentile((t["ttft"] for t in ok), 95)),
                "hit_turns": len(hits),
                "hit_ttft_p95_s": rounded(percentile(hits, 95)),
                "turn_p50_s": rounded(percentile((t["lat"] for t in ok), 50)),
                "turn_p95_s": rounded(percentile((t["lat"] for t in ok), 95)),
                "sessions": len(done),
                "session_mean_s": rounded(mean_of(s["dur"] for s in done), 3),
                "session_p95_s": rounded(percentile((s["dur"] for s in done), 95), 3),
                "session_p99_s": rounded(percentile((s["dur"] for s in done), 99), 3),
                "cached_ratio": rounded(sum(t["cached"] for t in ok) / prompt) if prompt else None,
                "stream_decode_tps": rounded(percentile(_stream_rates(ok), 50), 2),
            }
        )
    return rows


def _stream_rates(turns: list[dict[str, Any]]) -> list[float]:
    """Decode tokens/s each stream saw after its first token: the node's own figure when it
    sent one, else the client's (only for a stream that spread over 50 ms or more: a node
    that holds its output back, as it does for tool calls, sends it all at once)."""
    rates = []
    for t in turns:
        if t.get("decode_tps"):
            rates.append(t["decode_tps"])
            continue
        span = t["lat"] - (t["ttft"] or 0.0)
        if t["completion"] > 1 and span >= 0.05:
            rates.append((t["completion"] - 1) / span)
    return rates


def knee_metric(row: dict[str, Any]) -> float | None:
    """The P95 the knee is judged on: cache-hit turns' TTFT, or every turn's TTFT when the
    step had no cache-hit turn (one-turn sessions)."""
    return row["hit_ttft_p95_s"] if row["hit_turns"] else row["ttft_p95_s"]


def meets_target(row: dict[str, Any], target_p95_s: float) -> bool:
    value = knee_metric(row)
    return (
        value is not None
        and value <= target_p95_s
        and row["error_rate"] <= MAX_ERROR_RATE_AT_KNEE
        and row["requests"] > 0
    )


def knee(rows: list[dict[str, Any]], target_p95_s: float) -> dict[str, Any] | None:
    """The knee: the last row of the leading run of rows (in concurrency order) that meet
    ``target_p95_s`` (``meets_target``); None when even the first misses it."""
    found = None
    for row in sorted(rows, key=lambda r: r["concurrency"]):
        if not meets_target(row, target_p95_s):
            break
        found = row
    return found


def tightest_target(rows: list[dict[str, Any]], ladder: Iterable[float]) -> float | None:
    """The tightest P95 target (seconds) this run meets, so a run always has a capacity
    answer: the smallest of ``ladder`` at which a knee exists (``knee``); past the whole
    ladder, the lowest step's measured P95 (``knee_metric``) rounded up to two significant
    figures. None when the lowest step cannot meet any target (no answered request, or more
    than 1 % errors)."""
    for target in sorted(ladder):
        if knee(rows, target) is not None:
            return target
    first = min(rows, key=lambda r: r["concurrency"], default=None)
    value = knee_metric(first) if first else None
    if value is None or value <= 0:
        return None
    unit = 10 ** (math.floor(math.log10(value)) - 1)
    target = round(math.ceil(value / unit - 1e-9) * unit, 6)
    return target if meets_target(first, target) else None


# --- CPU during each step ----------------------------------------------------------------------

CPU_SATURATED_PCT = 85.0  # a node's process at 85 % of its CPUs, or the host at 85 %: no CPU left
# what a live sample keeps of each node (``cpu``: % where 100 is one CPU; ``cpus``: the CPUs it
# may use; ``host_cpu``: its host's CPU %, all CPUs, for a node on this host)
NODE_FIGURES = (
    "state", "cpu", "cpus", "host_cpu", "kv_pct", "active", "queue", "total", "decode_tps",
    "sessions",
)  # fmt: skip


def step_cpu(rows: list[dict[str, Any]], samples: list[dict[str, Any]]) -> None:
    """Adds to each step row, from the live samples taken during it (``sample["step"]``):
    ``node_cpu_pct``, the busiest node's mean CPU as a percentage of the CPUs it may use
    (``cpus``: its threads, within its CPU set; a node whose CPUs are unknown is left out),
    ``node_cpu_node`` (which node) and ``host_cpu_pct``, the mean CPU % of the host the
    loopback nodes run on (all its CPUs). None where nothing was sampled."""
    for row in rows:
        mine = [s for s in samples if s.get("step") == row["step"]]
        per_node: dict[str, list[float]] = defaultdict(list)
        host: list[float] = []
        for sample in mine:
            figures = (sample.get("nodes") or {}).values()
            host_seen = [n["host_cpu"] for n in figures if n.get("host_cpu") is not None]
            if host_seen:
                host.append(max(host_seen))
        for sample in mine:
            for node_id, n in (sample.get("nodes") or {}).items():
                if n.get("cpu") is not None and n.get("cpus"):
                    per_node[node_id].append(n["cpu"] / n["cpus"])
        means = {node_id: sum(v) / len(v) for node_id, v in per_node.items()}
        busiest = max(means, key=lambda k: means[k], default=None)
        row["node_cpu_pct"] = rounded(means[busiest], 1) if busiest else None
        row["node_cpu_node"] = busiest
        row["host_cpu_pct"] = rounded(mean_of(host), 1)


def bend(rows: list[dict[str, Any]]) -> int | None:
    """Where the throughput curve bends: the concurrency after which a step adds less than
    ``BEND_EFFICIENCY`` of the throughput proportional scaling would (tokens/s ratio - 1 over
    concurrency ratio - 1); None when it never does."""
    ordered = sorted(rows, key=lambda r: r["concurrency"])
    for before, after in zip(ordered, ordered[1:], strict=False):
        if not before["tokens_per_s"] or after["concurrency"] <= before["concurrency"]:
            continue
        gain = after["tokens_per_s"] / before["tokens_per_s"] - 1
        room = after["concurrency"] / before["concurrency"] - 1
        if gain / room < BEND_EFFICIENCY:
            return before["concurrency"]
    return None


# --- capacity and cost -------------------------------------------------------------------------


@dataclass(frozen=True)
class CostInputs:
    """What one node costs, as the operator sets it: ``power_w`` (average draw, watts),
    ``electricity_per_kwh`` (price per kWh), ``hardware_cost`` (per node) amortized over
    ``amortization_months``, ``operations_per_month`` and ``space_per_month`` (rack space),
    both per node. One currency throughout."""

    power_w: float = 250.0
    electricity_per_kwh: float = 0.20
    hardware_cost: float = 4000.0
    amortization_months: float = 36.0
    operations_per_month: float = 60.0
    space_per_month: float = 40.0

    def node_month(self) -> dict[str, float]:
        """A node's monthly cost by part (power, hardware, operations, space) and ``total``."""
        parts = {
            "power": self.power_w / 1000 * HOURS_PER_MONTH * self.electricity_per_kwh,
            "hardware": self.hardware_cost / self.amortization_months,
            "operations": self.operations_per_month,
            "space": self.space_per_month,
        }
        return {
            **{k: round(v, 4) for k, v in parts.items()},
            "total": round(sum(parts.values()), 4),
        }

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def sessions_per_node(rows: list[dict[str, Any]], target_p95_s: float, nodes: int) -> float:
    """Concurrent sessions one node holds within ``target_p95_s``: the knee's concurrency over
    the nodes that served the run; 0.0 when no step met the target."""
    found = knee(rows, target_p95_s)
    if found is None or nodes < 1:
        return 0.0
    return found["concurrency"] / nodes


def capacity_plan(
    *,
    rows: list[dict[str, Any]],
    nodes_in_run: int,
    sessions: int,
    target_p95_s: float,
    costs: CostInputs,
    session_s: float | None = None,
) -> dict[str, Any]:
    """Nodes needed for ``sessions`` concurrent sessions at ``target_p95_s`` (ceil of sessions
    over sessions per node at the measured knee for that target), and what they cost: per month
    for the array, per session (a node-hour's cost times the session's length, shared by the
    sessions a node holds; the length is the knee step's mean complete session unless
    ``session_s`` says otherwise) and per million completion tokens (at the knee's tokens/s per
    node). ``reachable`` is False (and the counts None) when no step met the
    target: add a step at lower concurrency, or relax the target."""
    per_node = sessions_per_node(rows, target_p95_s, nodes_in_run)
    month = costs.node_month()
    hour = month["total"] / HOURS_PER_MONTH
    plan: dict[str, Any] = {
        "sessions": sessions,
        "target_p95_s": target_p95_s,
        "sessions_per_node": rounded(per_node, 3),
        "node_month": month,
        "inputs": costs.as_dict(),
        "reachable": per_node > 0,
        "nodes_needed": None,
        "array_month": None,
        "cost_per_session": None,
        "cost_per_million_tokens": None,
    }
    if per_node <= 0:
        return plan
    needed = math.ceil(sessions / per_node - 1e-9)
    found = knee(rows, target_p95_s)
    assert found is not None
    session_s = session_s if session_s is not None else found.get("session_mean_s")
    tokens_per_node_s = found["tokens_per_s"] / max(1, nodes_in_run)
    plan.update(
        nodes_needed=needed,
        array_month=round(needed * month["total"], 2),
        cost_per_session=rounded(hour * (session_s or 0.0) / 3600 / per_node, 6)
        if session_s
        else None,
        cost_per_million_tokens=rounded(hour / (tokens_per_node_s * 3600) * 1e6, 4)
        if tokens_per_node_s > 0
        else None,
    )
    return plan


# --- per node, errors, the control plane ---------------------------------------------------------


def node_rows(
    turns: list[dict[str, Any]], sessions: list[dict[str, Any]], samples: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per node: requests, sessions, share of requests, and from the run's samples the mean
    and peak CPU %, peak KV use %, peak active sequences and peak queue depth."""
    counts = Counter(t["node"] for t in turns if t["node"])
    total = sum(counts.values())
    first_node = Counter(s["nodes"][0] for s in sessions if s["nodes"])
    seen = defaultdict(lambda: defaultdict(list))
    for sample in samples:
        for node_id, n in (sample.get("nodes") or {}).items():
            for key in ("cpu", "kv_pct", "active", "queue"):
                if n.get(key) is not None:
                    seen[node_id][key].append(n[key])
    rows = []
    for node_id in sorted(set(counts) | set(seen)):
        s = seen[node_id]
        rows.append(
            {
                "node": node_id,
                "requests": counts.get(node_id, 0),
                "sessions": first_node.get(node_id, 0),
                "share": rounded(counts.get(node_id, 0) / total, 3) if total else 0.0,
                "cpu_mean": rounded(mean_of(s["cpu"]), 1),
                "cpu_peak": rounded(max(s["cpu"], default=None), 1) if s["cpu"] else None,
                "kv_peak_pct": rounded(max(s["kv_pct"]), 1) if s["kv_pct"] else None,
                "active_peak": max(s["active"]) if s["active"] else None,
                "active_mean": rounded(mean_of(s["active"]), 2),
                "queue_peak": max(s["queue"]) if s["queue"] else None,
            }
        )
    return rows


MAX_ERROR_KINDS = 20  # rows of the errors table; a target can make every error a kind of its own


def error_rows(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failed requests by kind (``http_429 array_full``, ``timeout``, ``stream_error ...``):
    count, share of all requests, first message, most frequent first; at most
    ``MAX_ERROR_KINDS`` rows (``fold_error_rows``)."""
    kinds: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in turns:
        if not t["ok"]:
            kinds[t["error"] or "unknown"].append(t)
    total = len(turns) or 1
    return fold_error_rows(
        [
            {
                "kind": kind,
                "count": len(items),
                "share": rounded(len(items) / total, 4),
                "example": items[0].get("message", "")[:300],
            }
            for kind, items in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
        ]
    )


def fold_error_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (most frequent first) cut to ``MAX_ERROR_KINDS``: the rest become one row
    ``other (N kinds)`` with their summed count and share and the first one's example."""
    if len(rows) <= MAX_ERROR_KINDS:
        return rows
    kept, rest = rows[: MAX_ERROR_KINDS - 1], rows[MAX_ERROR_KINDS - 1 :]
    other = {
        "kind": f"other ({len(rest)} kinds)",
        "count": sum(r.get("count", 0) for r in rest),
        "share": rounded(sum(r.get("share", 0.0) for r in rest), 4),
        "example": str(rest[0].get("example", ""))[:300],
    }
    return [*kept, other]


def latency_summary(values_ms: list[float]) -> dict[str, Any]:
    """``{"count", "p50_ms", "p95_ms", "max_ms"}`` of probe latencies (``None`` = failed)."""
    answered = [v for v in values_ms if v is not None]
    return {
        "count": len(values_ms),
        "failed": len(values_ms) - len(answered),
        "p50_ms": rounded(percentile(answered, 50), 1),
        "p95_ms": rounded(percentile(answered, 95), 1),
        "max_ms": rounded(max(answered), 1) if answered else None,
    }


def ttft_split(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Where time to first token went, from the node's own timings: queue wait (waiting for a
    sequence, KV swap-in included), prefill, the node's own TTFT (P50/P95, ms), and what lies
    between the node's first token and the client's (``after_node_*``): the proxy, the network,
    and output the node held back (a tool call is sent once it is complete)."""
    ok = [t for t in turns if t["ok"] and t.get("queue_ms") is not None]
    after = [
        t["ttft"] * 1000 - t["node_ttft_ms"]
        for t in ok
        if t["ttft"] is not None and t.get("node_ttft_ms") is not None
    ]
    return {
        "turns": len(ok),
        "queue_p50_ms": rounded(percentile((t["queue_ms"] for t in ok), 50), 2),
        "queue_p95_ms": rounded(percentile((t["queue_ms"] for t in ok), 95), 2),
        "prefill_p50_ms": rounded(percentile((t["prefill_ms"] for t in ok), 50), 2),
        "prefill_p95_ms": rounded(percentile((t["prefill_ms"] for t in ok), 95), 2),
        "node_ttft_p50_ms": rounded(percentile((t.get("node_ttft_ms") for t in ok), 50), 2),
        "node_ttft_p95_ms": rounded(percentile((t.get("node_ttft_ms") for t in ok), 95), 2),
        "after_node_p50_ms": rounded(percentile(after, 50), 2),
        "after_node_p95_ms": rounded(percentile(after, 95), 2),
    }


def tool_calls(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Tool-call validity: of the answered turns that had to call a tool, how many produced a
    call valid against its tool's schema. ``truncated`` counts the invalid ones that ended at
    the turn's token limit (``finish: length``): the scenario's ``tool_max_tokens`` was too
    small, or the model rambled inside an argument; they stay in the validity (the client got
    no usable call). Plus calls made where none was required."""
    required = [t for t in turns if t["ok"] and t["tool_req"]]
    valid = [t for t in required if t["tool_valid"]]
    truncated = [t for t in required if not t["tool_valid"] and t.get("finish") == "length"]
    unasked = [t for t in turns if t["ok"] and not t["tool_req"] and t["tool_called"]]
    return {
        "required": len(required),
        "valid": len(valid),
        "truncated": len(truncated),
        "validity": rounded(len(valid) / len(required)) if required else None,
        "unrequired_calls": len(unasked),
        "unrequired_valid": sum(1 for t in unasked if t["tool_valid"]),
    }
