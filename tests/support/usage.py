"""Usage rows as the recorder writes them (``UsageTurn`` per turn, ``UsageMinute`` summed per
minute, caller, model, package and node), created directly, for the Usage API, page and
browser tests; and a cost model with round figures (a node-month of exactly 250 EUR)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from inference.models import CostModel, UsageMinute, UsageTurn

ALPHA = {
    "caller": "token:7",
    "caller_name": "team-alpha",
    "model": "smollm2-135m-instruct",
    "package": "smollm2-135m-instruct-q4_1:1",
    "node_id": "node-01",
}
OPS = {
    "caller": "user:ops",
    "caller_name": "ops",
    "model": "gemma-3-270m",
    "package": "gemma-3-270m-q4_k_m:1",
    "node_id": "node-02",
}
FIGURES = (
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "tool_calls",
    "prefill_s",
    "decode_s",
)
# (who, minutes ago, session, errors, prompt, cached, completion, tool calls, prefill s, decode s)
TURNS = (
    (ALPHA, 10, "s-a1", 0, 400, 0, 100, 1, 0.30, 2.0),
    (ALPHA, 10, "s-a1", 0, 500, 400, 100, 1, 0.05, 2.5),
    (ALPHA, 10, "s-a1", 1, 300, 0, 0, 0, 0.05, 0.0),
    (ALPHA, 5, "s-a2", 0, 450, 0, 100, 0, 0.25, 2.0),
    (ALPHA, 5, "s-a2", 0, 450, 440, 120, 1, 0.05, 3.0),
    (OPS, 5, "s-o1", 0, 100, 0, 50, 0, 0.20, 1.0),
)
COST_MODEL = {
    "power_w": 1000.0,
    "electricity_per_kwh": 0.1,  # 73 a month (730 h)
    "hardware_cost": 3600.0,
    "amortization_months": 36.0,  # 100 a month
    "operations_per_month": 50.0,
    "space_per_month": 27.0,
    "currency": "EUR",
}


def turn_figures(turn: tuple) -> dict[str, Any]:
    return dict(zip(FIGURES, turn[3:], strict=True))


def usage_rows_create(now: datetime | None = None) -> datetime:
    """``TURNS`` as turn rows and their minute sums; returns the minute ``now`` was in (the
    turns are 10 and 5 minutes before it)."""
    minute = (now or timezone.now()).replace(second=0, microsecond=0)
    sums: dict[tuple, dict[str, Any]] = {}
    for turn in TURNS:
        who, ago, session = turn[0], turn[1], turn[2]
        at = minute - timedelta(minutes=ago)
        figures = turn_figures(turn)
        UsageTurn.objects.create(at=at, session_id=session, requests=1, **who, **figures)
        into = sums.setdefault((at, who["caller"]), {**who, "minute": at, "requests": 0})
        into["requests"] += 1
        for name, value in figures.items():
            into[name] = into.get(name, 0) + value
    for row in sums.values():
        UsageMinute.objects.create(**row)
    return minute


def cost_model_set() -> CostModel:
    """The cost model with ``COST_MODEL``'s figures."""
    model = CostModel.load()
    for name, value in COST_MODEL.items():
        setattr(model, name, value)
    model.save()
    return model


def per_node_second(model: CostModel) -> float:
    """The price of a node-second worked out from the cost model's fields: a node's month
    (power over 730 hours, hardware over its amortization, operations, space) over the
    seconds of 730 hours."""
    month = (
        model.power_w / 1000 * 730 * model.electricity_per_kwh
        + model.hardware_cost / model.amortization_months
        + model.operations_per_month
        + model.space_per_month
    )
    return month / (730 * 3600)
