"""Prometheus text exposition of an engine snapshot (format: prometheus.io text format 0.0.4)."""

from __future__ import annotations

from typing import Any

# The series a rolling upgrade's bake compares (inference/upgrades/plan.py, ``bake_gates``):
# the control plane's scraper reads them by these same names (nodes/metrics.py), so a rename
# here cannot leave the bake reading nothing and passing a bad version.
REQUESTS_TOTAL = "phalanx_node_requests_total"
FAILED_REQUESTS_TOTAL = "phalanx_node_failed_requests_total"
TOOL_PARSE_FAILURES_TOTAL = "phalanx_node_tool_parse_failures_total"
TTFT_P95_SECONDS = "phalanx_node_ttft_p95_seconds"

# (snapshot key, metric name, type, help)
_SERIES = [
    (
        "requests_total",
        REQUESTS_TOTAL,
        "counter",
        "Chat requests admitted to the engine.",
    ),
    (
        "prompt_tokens_total",
        "phalanx_node_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
    ),
    (
        "cached_prompt_tokens_total",
        "phalanx_node_cached_prompt_tokens_total",
        "counter",
        "Prompt tokens reused from the KV cache instead of prefilled.",
    ),
    (
        "generated_tokens_total",
        "phalanx_node_generated_tokens_total",
        "counter",
        "Tokens generated.",
    ),
    (
        "restored_from_host_total",
        "phalanx_node_restored_from_host_total",
        "counter",
        "Sessions whose KV was copied back from host RAM.",
    ),
    (
        "restores_skipped_total",
        "phalanx_node_restores_skipped_total",
        "counter",
        "Host-RAM entries dropped instead of restored (a re-prefill was cheaper).",
    ),
    (
        "restores_failed_total",
        "phalanx_node_restores_failed_total",
        "counter",
        "Session states llama.cpp refused to load (another model or cache settings); prefilled.",
    ),
    (
        "cancelled_total",
        "phalanx_node_cancelled_total",
        "counter",
        "Requests cancelled by their client.",
    ),
    (
        "draft_tokens_total",
        "phalanx_node_draft_tokens_total",
        "counter",
        "Prompt-lookup draft tokens decoded (speculative decoding).",
    ),
    (
        "draft_accepted_total",
        "phalanx_node_draft_accepted_total",
        "counter",
        "Draft tokens the model confirmed (each saved a decode step).",
    ),
    (
        "step_seconds_total",
        "phalanx_node_step_seconds_total",
        "counter",
        "Wall time of the engine's decode steps (prefill chunks included).",
    ),
    (
        "step_llama_seconds_total",
        "phalanx_node_step_llama_seconds_total",
        "counter",
        "Of the steps' time, the part inside llama.cpp (decode, sampling); the rest is Python.",
    ),
    ("busy", "phalanx_node_busy", "gauge", "1 while any sequence is prefilling or decoding."),
    ("sequences_total", "phalanx_node_sequences_total", "gauge", "Configured KV sequences."),
    ("queue_depth", "phalanx_node_queue_depth", "gauge", "Requests waiting for a sequence."),
    ("kv_used_tokens", "phalanx_node_kv_used_tokens", "gauge", "KV cells in use."),
    (
        "kv_used_bytes",
        "phalanx_node_kv_used_bytes",
        "gauge",
        "Bytes of KV in use (K and V, at the node's KV cache type).",
    ),
    ("kv_capacity_tokens", "phalanx_node_kv_capacity_tokens", "gauge", "KV cells in the context."),
    (
        "host_ram_bytes",
        "phalanx_node_host_ram_bytes",
        "gauge",
        "Bytes of idle sessions' KV in host RAM.",
    ),
    (
        "host_ram_shared_saved_bytes",
        "phalanx_node_host_ram_shared_saved_bytes",
        "gauge",
        "Bytes of host RAM not spent twice: prefixes idle sessions share, kept once.",
    ),
    ("host_prefixes", "phalanx_node_host_prefixes", "gauge", "Shared prefixes kept in host RAM."),
    (
        "host_ram_budget_bytes",
        "phalanx_node_host_ram_budget_bytes",
        "gauge",
        "Host RAM budget for KV.",
    ),
    (
        "reused_token_ratio",
        "phalanx_node_reused_token_ratio",
        "gauge",
        "Cached over all prompt tokens.",
    ),
    (
        "prefill_tokens_per_second",
        "phalanx_node_prefill_tokens_per_second",
        "gauge",
        "Prompt tokens processed per second, last 10 s.",
    ),
    (
        "decode_tokens_per_second",
        "phalanx_node_decode_tokens_per_second",
        "gauge",
        "Tokens generated per second, last 10 s.",
    ),
    (
        "prefill_speed_tokens_per_second",
        "phalanx_node_prefill_speed_tokens_per_second",
        "gauge",
        "How fast the node prefills: prompt tokens per second of prefilling steps (moving average).",
    ),
    (
        "failed_total",
        FAILED_REQUESTS_TOTAL,
        "counter",
        "Chat requests that failed on the node's side (engine errors; not the client's).",
    ),
    (
        "tool_parse_failures_total",
        TOOL_PARSE_FAILURES_TOTAL,
        "counter",
        "Answers that began a tool call the node could not parse.",
    ),
    (
        "ttft_p95_seconds",
        TTFT_P95_SECONDS,
        "gauge",
        "Time to first token, 95th percentile of the last 256 requests (NaN before any).",
    ),
]


def prometheus_text(node_id: str, snapshot: dict[str, Any]) -> str:
    """The snapshot as Prometheus text, every series labelled with ``node``."""
    label = f'node="{node_id}"'
    lines: list[str] = []
    for key, name, kind, help_text in _SERIES:
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} {kind}",
            f"{name}{{{label}}} {_value(snapshot.get(key, 0))}",
        ]
    lines += [
        "# HELP phalanx_node_sequences KV sequences by state.",
        "# TYPE phalanx_node_sequences gauge",
    ]
    for state in ("active", "idle", "host"):
        lines.append(
            f'phalanx_node_sequences{{{label},state="{state}"}} {snapshot.get("sequences_" + state, 0)}'
        )
    lines += [
        "# HELP phalanx_node_agent_prefix Agents served last (their prefix KV is held here).",
        "# TYPE phalanx_node_agent_prefix gauge",
    ]
    lines += [
        f'phalanx_node_agent_prefix{{{label},agent="{agent}"}} 1'
        for agent in snapshot.get("agents") or ()
        if agent.isalnum()
    ]
    lines += [
        "# HELP phalanx_node_ready 1 once the model is loaded.",
        "# TYPE phalanx_node_ready gauge",
        f"phalanx_node_ready{{{label}}} {1 if snapshot.get('ready') else 0}",
    ]
    return "\n".join(lines) + "\n"


def _value(value: Any) -> Any:
    return "NaN" if value is None else value
