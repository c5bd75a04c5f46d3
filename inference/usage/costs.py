"""What usage costs, from the operator's cost model (``CostModel``: power, hardware, space,
operations per node, in one currency) and the node-seconds turns used (pure).

A node-second costs a node's monthly total over the seconds of a month (730 h: the load
tests' ``HOURS_PER_MONTH``). A turn costs its prefill and decode node-seconds at that rate:
the share of the engine's steps it took (``inference.usage.meter``), so a node's busy time is
priced once however many sessions shared it; idle time is priced to nobody (the array's
whole cost is the nodes' monthly total).

Cached tokens cost no prefill: the saving of KV reuse is the prefill the cached tokens did not
need, priced at the prefill rate the same rows measured (prefill node-seconds per uncached
prompt token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.loadtests.analysis import HOURS_PER_MONTH, CostInputs


@dataclass(frozen=True)
class Pricing:
    """The price of a node-second (``per_node_second``) in ``currency``."""

    per_node_second: float
    currency: str

    @classmethod
    def of(cls, inputs: CostInputs, currency: str) -> Pricing:
        return cls(inputs.node_month()["total"] / (HOURS_PER_MONTH * 3600), currency)


def significant(value: float, digits: int = 6) -> float:
    """``value`` to ``digits`` significant figures (costs of a turn are millionths)."""
    return float(f"{value:.{digits}g}")


def node_seconds(figures: dict[str, Any]) -> float:
    return float(figures.get("prefill_s") or 0.0) + float(figures.get("decode_s") or 0.0)


def saved_prefill_s(figures: dict[str, Any]) -> float:
    """Prefill node-seconds the cached tokens did not need (0 without a measured rate)."""
    cached = float(figures.get("cached_tokens") or 0)
    uncached = float(figures.get("prompt_tokens") or 0) - cached
    prefill_s = float(figures.get("prefill_s") or 0.0)
    if cached <= 0 or uncached <= 0 or prefill_s <= 0:
        return 0.0
    return cached * prefill_s / uncached


def priced(figures: dict[str, Any], pricing: Pricing) -> dict[str, Any]:
    """``figures`` (a ``UsageFigures`` sum) with ``node_seconds``, ``cost``,
    ``cost_per_request``, ``cost_per_million_tokens``, ``saved`` (cost of the prefill KV reuse
    avoided) and ``currency``; per-unit figures None when there is no unit."""
    seconds = node_seconds(figures)
    cost = seconds * pricing.per_node_second
    requests = int(figures.get("requests") or 0)
    tokens = int(figures.get("prompt_tokens") or 0) + int(figures.get("completion_tokens") or 0)
    return {
        **figures,
        "node_seconds": round(seconds, 6),
        "cost": significant(cost),
        "cost_per_request": significant(cost / requests) if requests else None,
        "cost_per_million_tokens": significant(cost / tokens * 1e6) if tokens else None,
        "saved": significant(saved_prefill_s(figures) * pricing.per_node_second),
        "currency": pricing.currency,
    }
