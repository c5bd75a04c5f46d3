"""The control plane's ``/metrics`` families of usage per caller (registered in
``InferenceConfig.ready``): requests, errors, tokens by kind, node-seconds and cost, summed
over every minute row (kept for good: the counters only grow).

Label cardinality is bounded: the first ``USAGE_METRIC_CALLERS`` callers to have used the
array (``PHALANX_USAGE_METRIC_CALLERS``, default 20) get a ``caller`` label of their own
(``token:<id>``, ``user:<name>``, ``env``); the rest are summed as ``other``, so a label never
changes owner and a series never goes down.
"""

from __future__ import annotations

import os
from typing import Any

from django.db.models import Min, Sum

from console.lib.metrics import Write
from inference.models import UsageMinute
from inference.usage.selectors import FIGURES, pricing

OTHER = "other"


def callers_labelled() -> int:
    return int(os.environ.get("PHALANX_USAGE_METRIC_CALLERS", "20"))


def per_caller(limit: int) -> dict[str, dict[str, float]]:
    """Figures summed per caller, the first ``limit`` callers by first use, the rest as
    ``other``."""
    rows = (
        UsageMinute.objects.values("caller")
        .annotate(first=Min("minute"), **{n: Sum(n) for n in FIGURES})
        .order_by("first", "caller")
    )
    out: dict[str, dict[str, float]] = {}
    for index, row in enumerate(rows):
        into = out.setdefault(row["caller"] if index < limit else OTHER, dict.fromkeys(FIGURES, 0))
        for name in FIGURES:
            into[name] += row[name] or 0
    return out


def usage_families(write: Write) -> None:
    """The usage counters per caller (module doc)."""
    sums = per_caller(callers_labelled())
    price = pricing()

    def samples(value: Any) -> list[tuple[dict[str, str], float]]:
        return [({"caller": caller}, value(figures)) for caller, figures in sums.items()]

    write(
        "phalanx_usage_requests_total",
        "counter",
        "Turns per caller.",
        samples(lambda f: f["requests"]),
    )
    write(
        "phalanx_usage_errors_total",
        "counter",
        "Failed turns per caller.",
        samples(lambda f: f["errors"]),
    )
    write(
        "phalanx_usage_tokens_total",
        "counter",
        "Tokens per caller, by kind (prompt includes cached).",
        [
            ({"caller": caller, "kind": kind}, figures[f"{kind}_tokens"])
            for caller, figures in sums.items()
            for kind in ("prompt", "cached", "completion")
        ],
    )
    write(
        "phalanx_usage_node_seconds_total",
        "counter",
        "Node-seconds of prefill and decode per caller.",
        samples(lambda f: f["prefill_s"] + f["decode_s"]),
    )
    write(
        "phalanx_usage_cost_total",
        "counter",
        f"Cost per caller from the cost model, in {price.currency}.",
        samples(lambda f: (f["prefill_s"] + f["decode_s"]) * price.per_node_second),
    )
