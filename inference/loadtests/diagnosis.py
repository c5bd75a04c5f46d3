"""Findings after a run: the troubleshooting table of ARCHITECTURE.md, applied to the metrics.

Each rule reads the assembled report (``inference.loadtests.report``) and the run's turn and
session records, and returns a ``Finding`` with the evidence that triggered it, or nothing.
The rules, in the table's order (thresholds are ours, chosen so that a healthy run on the
bundled model on this machine triggers none of them):

1. one stream fast, many streams stall (with two streams a node or more at the highest step,
   the median per-stream decode rate there is under half that at the lowest, while array
   throughput grew by less than a quarter of the concurrency's growth) -> first CPU
   saturation, when at that step the busiest node used ``CPU_SATURATED_PCT`` (85 %) of the
   CPUs it computes on or the host's CPUs were that busy (``cpu_saturated``: a node with one
   CPU on a host at 100 % stalls the same way, and adding memory channels would not help);
   otherwise memory bandwidth (``memory_bandwidth``, saying whether the CPU was measured);
2. tool-call arguments wrong -> quantization too low: validity under 95 % over 10+ checked
   (calls cut off by the turn's token limit are a finding of their own too);
3. a session slows mid-conversation -> the scheduler moved it: any session answered by more
   than one node;
4. one node saturated while others idle -> placement: with 2+ nodes, one node took more than
   1.5x its fair share of requests, or its mean CPU was 40+ points above another's;
5. queueing with idle CPU -> batching settings: queue wait P95 over 50 ms and over a quarter of
   TTFT P95 while the nodes' mean CPU stayed under 70 %;
6. the first request after a restart is slow -> cold start: a node's first answered turn had a
   TTFT over 3x the cache-hit median and over 0.5 s.

Two more that the table implies: overload answers (429/503) -> the array is full; and a slow
control plane during the run (console or ``/health`` P95 over 1 s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from inference.loadtests.analysis import CPU_SATURATED_PCT, percentile


@dataclass(frozen=True)
class Finding:
    """``symptom`` -> ``cause``; ``evidence``: the figures that triggered it; ``check``: how
    to confirm it; ``remedy``: what to change. ``severity``: "warn" or "info"."""

    rule: str
    symptom: str
    cause: str
    evidence: str
    check: str
    remedy: str
    severity: str = "warn"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


Context = dict[str, Any]  # {"report": ..., "turns": [...], "sessions": [...]}


def _stall(ctx: Context) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(lowest, highest)`` step rows when streams stall as concurrency grows: two streams a
    node or more at the highest step, whose median per-stream decode rate is under half that at
    the lowest, while array throughput grew by less than a quarter of the concurrency's
    growth; None otherwise."""
    rows = [r for r in ctx["report"]["steps"] if r["stream_decode_tps"]]
    if len(rows) < 2:
        return None
    low, high = rows[0], rows[-1]
    nodes = max(1, sum(1 for n in ctx["report"]["nodes"] if n["requests"]))
    if high["concurrency"] < 2 * nodes or not low["tokens_per_s"]:
        return None  # one stream a node at most: nothing shared a node's memory
    stream_ratio = high["stream_decode_tps"] / low["stream_decode_tps"]
    growth = (high["tokens_per_s"] / low["tokens_per_s"] - 1) / (
        high["concurrency"] / low["concurrency"] - 1
    )
    return None if stream_ratio >= 0.5 or growth >= 0.25 else (low, high)


def _stall_evidence(low: dict[str, Any], high: dict[str, Any]) -> str:
    return (
        f"per-stream decode fell from {low['stream_decode_tps']:.1f} tok/s at "
        f"{low['concurrency']} sessions to {high['stream_decode_tps']:.1f} at "
        f"{high['concurrency']}, while array throughput went from {low['tokens_per_s']:.0f} "
        f"to {high['tokens_per_s']:.0f} tok/s"
    )


def _cpu_out(row: dict[str, Any]) -> str | None:
    """What says the CPU ran out during the step ``row`` (``analysis.step_cpu``): the busiest
    node at ``CPU_SATURATED_PCT`` of its CPUs or more, or the host; None when neither did (or
    neither was measured)."""
    said = []
    node_pct, host_pct = row.get("node_cpu_pct"), row.get("host_cpu_pct")
    if node_pct is not None and node_pct >= CPU_SATURATED_PCT:
        said.append(f"{row.get('node_cpu_node')} used {node_pct:.0f} % of the CPUs it computes on")
    if host_pct is not None and host_pct >= CPU_SATURATED_PCT:
        said.append(f"the host's CPUs were {host_pct:.0f} % busy")
    return " and ".join(said) or None


def _cpu_saturated(ctx: Context) -> Finding | None:
    stall = _stall(ctx)
    cpu = _cpu_out(stall[1]) if stall else None
    if not stall or not cpu:
        return None
    low, high = stall
    return Finding(
        "cpu_saturated",
        "one stream fast, many streams stall",
        "CPU saturated: the nodes had no CPU left (not memory bandwidth)",
        f"{_stall_evidence(low, high)}; at {high['concurrency']} sessions {cpu}",
        "the nodes' CPU % on the Utilization page against their threads and CPU sets, and the "
        "host's CPU (the control plane and the load generator share it on one machine)",
        "more threads and CPUs per node (threads, cpu_set), fewer sessions per node "
        "(max_sessions), or more nodes; on one machine, give the control plane CPUs of its own",
    )


def _bandwidth(ctx: Context) -> Finding | None:
    stall = _stall(ctx)
    if not stall or _cpu_out(stall[1]):
        return None  # CPU saturation explains it first (_cpu_saturated)
    low, high = stall
    measured = high.get("node_cpu_pct") is not None or high.get("host_cpu_pct") is not None
    cpu = (
        f"; the CPU had room (busiest node {high.get('node_cpu_pct') or 0:.0f} % of its CPUs, "
        f"host {high.get('host_cpu_pct') or 0:.0f} %)"
        if measured
        else "; the nodes' CPU was not measured, so CPU saturation is not ruled out"
    )
    return Finding(
        "memory_bandwidth",
        "one stream fast, many streams stall",
        "memory bandwidth saturated",
        _stall_evidence(low, high) + cpu,
        "the node's measured memory bandwidth on its Validation page against the machine's peak",
        "fewer sessions per node (max_sessions), more nodes or more memory channels",
    )


def _tool_calls(ctx: Context) -> Finding | None:
    calls = ctx["report"]["tool_calls"]
    if calls["required"] < 10 or calls["validity"] is None or calls["validity"] >= 0.95:
        return None
    return Finding(
        "tool_calls",
        "tool-call arguments sometimes wrong",
        "quantization too aggressive",
        f"{calls['valid']} of {calls['required']} required tool calls were valid against "
        f"their schema ({calls['validity']:.0%})"
        + (
            f"; {calls['truncated']} of the others ended at the token limit"
            if calls.get("truncated")
            else ""
        ),
        "the package's tool-call accuracy, Q4_K_M against Q8_0 (Packages: evaluate)",
        "serve a higher quantization type (build and evaluate it, then roll it out)",
    )


def _truncated_calls(ctx: Context) -> Finding | None:
    calls = ctx["report"]["tool_calls"]
    if not calls.get("truncated"):
        return None
    return Finding(
        "tool_calls_truncated",
        "tool calls cut off",
        "the token limit: tool_max_tokens too small, or the model rambling inside an argument",
        f"{calls['truncated']} of {calls['required']} required tool calls hit the token limit "
        "before the call was complete",
        "the turns' completion tokens against tool_max_tokens (CSV export, every turn)",
        "raise tool_max_tokens if the calls are long; a model that rambles needs a higher "
        "quantization type or a larger model",
        severity="info",
    )


def _migrations(ctx: Context) -> Finding | None:
    moved = [s for s in ctx["sessions"] if len(s["nodes"]) > 1]
    if not moved:
        return None
    example = moved[0]
    return Finding(
        "session_moved",
        "a session slows mid-conversation",
        "the scheduler moved it (stickiness broken)",
        f"{len(moved)} of {len(ctx['sessions'])} sessions were answered by more than one "
        f"node, e.g. {example['sid']}: {' -> '.join(example['nodes'])}",
        "the session's decision log (GET /api/sessions/<id>) and the node events",
        "failover_strategy stick_and_redirect, a longer session_idle_release_s, fix the "
        "node that went down or drained",
    )


def _placement(ctx: Context) -> Finding | None:
    nodes = [n for n in ctx["report"]["nodes"] if n["requests"] or n["cpu_mean"] is not None]
    if len(nodes) < 2:
        return None
    fair = 1 / len(nodes)
    busiest = max(nodes, key=lambda n: n["share"])
    cpus = [n for n in nodes if n["cpu_mean"] is not None]
    hot = max(cpus, key=lambda n: n["cpu_mean"], default=None)
    cold = min(cpus, key=lambda n: n["cpu_mean"], default=None)
    if busiest["share"] > 1.5 * fair and sum(n["requests"] for n in nodes) >= 10:
        evidence = (
            f"{busiest['node']} answered {busiest['share']:.0%} of requests (fair share {fair:.0%})"
        )
    elif hot and cold and hot["cpu_mean"] - cold["cpu_mean"] >= 40:
        evidence = (
            f"{hot['node']} averaged {hot['cpu_mean']:.0f} % CPU while {cold['node']} "
            f"averaged {cold['cpu_mean']:.0f} %"
        )
    else:
        return None
    return Finding(
        "placement",
        "one node saturated while others idle",
        "placement: new sessions are not spread",
        evidence,
        "the nodes' weights and max_sessions, the routing decision log",
        "equal weights for equal nodes, or stick_and_rebalance for long sessions",
    )


def _queueing(ctx: Context) -> Finding | None:
    split, report = ctx["report"]["ttft_split"], ctx["report"]
    queue = split["queue_p95_ms"]
    ttft = percentile((t["ttft"] for t in ctx["turns"] if t["ok"] and t["ttft"]), 95)
    cpus = [n["cpu_mean"] for n in report["nodes"] if n["cpu_mean"] is not None]
    if queue is None or ttft is None or not cpus:
        return None
    cpu = sum(cpus) / len(cpus)
    if queue <= 50 or queue <= 0.25 * ttft * 1000 or cpu >= 70:
        return None
    return Finding(
        "queueing",
        "requests queue while the CPU is idle",
        "batching settings: too few sequences per node",
        f"queue wait P95 {queue:.0f} ms of a TTFT P95 {ttft * 1000:.0f} ms, nodes' mean CPU "
        f"{cpu:.0f} %",
        "the nodes' queue depth and active sequences during the run (Utilization page)",
        "more sequences per node (an upgrade with node_settings sequences), or more nodes",
    )


def _cold_start(ctx: Context) -> Finding | None:
    hits = [t["ttft"] for t in ctx["turns"] if t["ok"] and t["hit"] and t["ttft"]]
    median = percentile(hits, 50)
    if median is None:
        return None
    first: dict[str, dict[str, Any]] = {}
    for t in sorted(ctx["turns"], key=lambda t: t["t"]):
        if t["ok"] and t["node"] and t["ttft"] is not None:
            first.setdefault(t["node"], t)
    slow = [t for t in first.values() if t["ttft"] > max(0.5, 3 * median)]
    if not slow:
        return None
    worst = max(slow, key=lambda t: t["ttft"])
    return Finding(
        "cold_start",
        "the first request after a restart is slow",
        "cold model load",
        f"{worst['node']}'s first turn waited {worst['ttft']:.2f} s for its first token "
        f"against a cache-hit median of {median:.3f} s",
        "the node's cold-start time (its restart events and first TTFT)",
        "warm the node up (a canary after start) and keep the process resident",
    )


def _overload(ctx: Context) -> Finding | None:
    full = [e for e in ctx["report"]["errors"] if e["kind"].startswith(("http_429", "http_503"))]
    if not full:
        return None
    count = sum(e["count"] for e in full)
    return Finding(
        "overload",
        "requests refused with 429/503",
        "the array is full at this concurrency",
        f"{count} requests refused: " + ", ".join(f"{e['kind']} x{e['count']}" for e in full),
        "the nodes' max_sessions, KV budget and the policy's max_inflight",
        "plan capacity from the knee (add nodes), or raise the limits if the nodes have room",
    )


def _control_plane(ctx: Context) -> Finding | None:
    plane = ctx["report"]["control_plane"]
    slow = [
        f"{name} P95 {figures['p95_ms']:.0f} ms"
        for name, figures in plane.items()
        if figures.get("p95_ms") is not None and figures["p95_ms"] > 1000
    ]
    failed = [
        f"{name} {figures['failed']} failed"
        for name, figures in plane.items()
        if figures.get("failed")
    ]
    if not slow and not failed:
        return None
    return Finding(
        "control_plane",
        "the console answers slowly under load",
        "the control plane shares CPUs with the nodes",
        "; ".join(slow + failed),
        "a flame graph of the control plane during the run (profile: true)",
        "pin the nodes to their own CPUs (Node.cpu_set), or run the control plane on another host",
    )


RULES: tuple[Callable[[Context], Finding | None], ...] = (
    _cpu_saturated,
    _bandwidth,
    _tool_calls,
    _truncated_calls,
    _migrations,
    _placement,
    _queueing,
    _cold_start,
    _overload,
    _control_plane,
)


def diagnose(
    report: dict[str, Any], turns: list[dict[str, Any]], sessions: list[dict[str, Any]]
) -> list[dict[str, str]]:
    """The findings of every rule that fired, in the table's order (empty for a clean run)."""
    ctx = {"report": report, "turns": turns, "sessions": sessions}
    return [f.as_dict() for rule in RULES if (f := rule(ctx)) is not None]
