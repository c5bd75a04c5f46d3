"""Parse a node's Prometheus text (docs/node-protocol.md, "Metrics") into a load figure."""

from __future__ import annotations

import math
import re
from typing import Any

from nodes.agent.metrics import (
    FAILED_REQUESTS_TOTAL,
    REQUESTS_TOTAL,
    TOOL_PARSE_FAILURES_TOTAL,
    TTFT_P95_SECONDS,
)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of Prometheus text exposition, keyed ``name`` or ``name{a="x",b="y"}``.

    Labels are sorted so keys are canonical; comments, blank lines and unparsable values are
    skipped; timestamps after the value are ignored. ``m{state="active"} 2`` is keyed
    ``m{state="active"}``.
    """
    samples: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if labels:
            pairs = sorted(_LABEL.findall(labels))
            name = name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"
        samples[name] = value
    return samples


_NODE_LABEL = re.compile(r'(?<=[{,])node="(?:[^"\\]|\\.)*",?')


def without_node_label(samples: dict[str, float]) -> dict[str, float]:
    """The same samples with the ``node="..."`` label dropped (a node labels every sample with
    its id; ``m{node="n1",state="active"}`` becomes ``m{state="active"}``, ``m{node="n1"}``
    becomes ``m``)."""
    out: dict[str, float] = {}
    for key, value in samples.items():
        if 'node="' in key:
            key = _NODE_LABEL.sub("", key).replace(",}", "}").replace("{}", "")
        out[key] = value
    return out


def _get(samples: dict[str, float], key: str) -> float | None:
    value = samples.get(key)
    if value is None or math.isnan(value):
        return None
    return value


def load_from_metrics(samples: dict[str, float]) -> dict[str, Any]:
    """Summarise a node's samples: ``{"load", "active", "queue", "total", "busy", "kv_used",
    "kv_capacity", "requests", "prefill_speed", "host_ram", "host_ram_budget", "failed",
    "tool_parse_failures", "ttft_p95", "restores_skipped", "restored", "prefixes"}`` (counts;
    ``prefixes`` the fingerprints of the agents whose prefix it holds, ``inference.agent_prefix``;
    ``host_ram*`` bytes of idle sessions' KV kept in host RAM, and its budget; ``load`` unitless; ``requests`` is
    the node's ``phalanx_node_requests_total``, used to tell an idle node for canaries;
    ``prefill_speed`` prompt tokens/s, None until measured, for first-byte deadlines).

    ``load`` = (active sequences + queue depth) / configured sequences, so 0 is idle, 1 is every
    sequence busy and above 1 means requests wait. Without ``phalanx_node_sequences_total`` it
    falls back to ``busy + queue depth``; with neither signal it is ``None`` (unknown, which
    routing never takes for idle).
    """
    samples = without_node_label(samples)
    active = _get(samples, 'phalanx_node_sequences{state="active"}')
    queue = _get(samples, "phalanx_node_queue_depth")
    total = _get(samples, "phalanx_node_sequences_total")
    busy = _get(samples, "phalanx_node_busy")
    load: float | None = None
    if total and total > 0 and active is not None:
        load = (active + (queue or 0.0)) / total
    elif busy is not None:
        load = busy + (queue or 0.0)
    return {
        "load": None if load is None else round(load, 4),
        "active": active,
        "queue": queue,
        "total": total,
        "busy": busy,
        "kv_used": _get(samples, "phalanx_node_kv_used_tokens"),
        "kv_capacity": _get(samples, "phalanx_node_kv_capacity_tokens"),
        "requests": _get(samples, REQUESTS_TOTAL),
        "prefill_speed": _get(samples, "phalanx_node_prefill_speed_tokens_per_second") or None,
        "host_ram": _get(samples, "phalanx_node_host_ram_bytes"),
        "host_ram_budget": _get(samples, "phalanx_node_host_ram_budget_bytes"),
        "failed": _get(samples, FAILED_REQUESTS_TOTAL),
        "tool_parse_failures": _get(samples, TOOL_PARSE_FAILURES_TOTAL),
        "ttft_p95": _finite(_get(samples, TTFT_P95_SECONDS)),
        "restores_skipped": _get(samples, "phalanx_node_restores_skipped_total"),
        "restored": _get(samples, "phalanx_node_restored_from_host_total"),
        "prefixes": sorted(_AGENT.findall("\n".join(samples))),
    }


_AGENT = re.compile(r'^phalanx_node_agent_prefix\{agent="([0-9a-f]{1,64})"\}$', re.M)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
