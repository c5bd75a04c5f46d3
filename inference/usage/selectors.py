"""Reads of usage for the Usage page, ``/api/usage`` and the CSV export: sums per caller or
model over a period, series over time, a session's cost, and quota use now.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from inference.models import ApiToken, CostModel, UsageMinute, UsageTurn
from inference.usage import limits
from inference.usage.costs import Pricing, priced, significant
from inference.usage.models import COUNTERS, SECONDS
from inference.usage.quotas import limits_for

FIGURES = (*COUNTERS, *SECONDS)
GROUPS = {"caller": ("caller", "caller_name"), "model": ("model",), "node": ("node_id",)}


def pricing() -> Pricing:
    """The cost model's price of a node-second."""
    model = CostModel.load()
    return Pricing.of(model.inputs(), model.currency)


def _sums(rows: Any) -> Any:
    return rows.annotate(**{name: Sum(name) for name in FIGURES})


def _period(hours: float) -> Any:
    return UsageMinute.objects.filter(minute__gte=timezone.now() - timedelta(hours=hours))


def usage_by(*, group: str, hours: float = 24.0) -> list[dict[str, Any]]:
    """Figures summed per ``group`` (``caller``, ``model`` or ``node``) over the last
    ``hours``, priced (``costs.priced``), with ``sessions`` (distinct sessions among the turn
    rows kept) and ``cost_per_session``; most costly first. Raises ``KeyError`` for another
    group."""
    fields = GROUPS[group]
    rows = _sums(_period(hours).values(*fields)).order_by()
    price = pricing()
    sessions = _sessions(group, hours)
    out = []
    for row in rows:
        entry = priced({n: row[n] or 0 for n in FIGURES}, price)
        entry.update({f: row[f] for f in fields})
        entry["sessions"] = sessions.get(row[fields[0]], 0)
        entry["cost_per_session"] = (
            significant(entry["cost"] / entry["sessions"]) if entry["sessions"] else None
        )
        out.append(entry)
    return sorted(out, key=lambda e: (-e["cost"], -e["requests"]))


def _sessions(group: str, hours: float) -> dict[str, int]:
    field = GROUPS[group][0]
    turns = UsageTurn.objects.filter(at__gte=timezone.now() - timedelta(hours=hours))
    rows = turns.exclude(session_id="").values(field).annotate(n=Count("session_id", distinct=True))
    return {row[field]: row["n"] for row in rows.order_by()}


def usage_totals(*, hours: float = 24.0) -> dict[str, Any]:
    """Every caller's figures summed over the last ``hours``, priced."""
    row = _period(hours).aggregate(**{name: Sum(name) for name in FIGURES})
    return priced({n: row[n] or 0 for n in FIGURES}, pricing())


def usage_series(*, group: str = "caller", hours: float = 24.0) -> dict[str, Any]:
    """Tokens and cost over time per ``group``: ``{"bucket": "minute"|"hour", "series":
    [{"name", "t": [iso...], "tokens": [...], "cost": [...]}]}`` (minutes up to 6 h)."""
    bucket = "minute" if hours <= 6 else "hour"
    trunc = TruncMinute("minute") if bucket == "minute" else TruncHour("minute")
    name_field = GROUPS[group][-1]
    rows = (
        _period(hours)
        .annotate(t=trunc)
        .values("t", name_field)
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
        .annotate(prefill=Sum("prefill_s"), decode=Sum("decode_s"))
        .order_by("t")
    )
    price = pricing()
    series: dict[str, dict[str, list[Any]]] = {}
    for row in rows:
        line = series.setdefault(row[name_field], {"t": [], "tokens": [], "cost": []})
        line["t"].append(row["t"].isoformat())
        line["tokens"].append(int(row["prompt"] or 0) + int(row["completion"] or 0))
        seconds = float(row["prefill"] or 0) + float(row["decode"] or 0)
        line["cost"].append(significant(seconds * price.per_node_second))
    return {
        "bucket": bucket,
        "currency": price.currency,
        "series": [{"name": name, **line} for name, line in sorted(series.items())],
    }


def session_usage(*, session_id: str) -> dict[str, Any] | None:
    """A session's turns summed and priced (from the turn rows kept), or None when none."""
    turns = UsageTurn.objects.filter(session_id=session_id)
    row = turns.aggregate(**{name: Sum(name) for name in FIGURES})
    if not row["requests"] and not turns.exists():
        return None
    return {"session_id": session_id, **priced({n: row[n] or 0 for n in FIGURES}, pricing())}


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _text_cell(text: str) -> str:
    """``text`` for a CSV cell that a spreadsheet shows as text: one starting like a formula
    (``=``, ``+``, ``-``, ``@``, tab, CR; a token's name is free text) gets a ``'`` first
    (OWASP, "CSV Injection")."""
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def csv_rows(*, hours: float = 24.0) -> Iterator[list[Any]]:
    """The minute rows of the last ``hours`` as CSV rows, header first, priced."""
    price = pricing()
    yield [
        "minute",
        "caller",
        "caller_name",
        "model",
        "package",
        "node_id",
        *FIGURES,
        "cost",
        "currency",
    ]
    yield from (
        [row.minute.isoformat(), *map(_text_cell, (row.caller, row.caller_name, row.model))]
        + [_text_cell(row.package), _text_cell(row.node_id), *(getattr(row, n) for n in FIGURES)]
        + [significant((row.prefill_s + row.decode_s) * price.per_node_second), price.currency]
        for row in _period(hours).order_by("minute", "caller")
    )


def quota_use() -> list[dict[str, Any]]:
    """Each live token with a counted limit: its limits and what the current windows hold
    (``{"token_id", "name", "limits": {...}, "used": {limit: count}}``)."""
    out = []
    now = limits.clock()
    windows = limits.Windows.at(now)
    for token in ApiToken.objects.filter(revoked=False).select_related("console_role"):
        role = token.console_role.role if hasattr(token, "console_role") else "operator"
        in_force = limits_for(role=role, token_id=token.pk)
        if not in_force.limited:
            continue
        used = limits.window_counts(f"token:{token.pk}", windows, now)
        out.append(
            {
                "token_id": token.pk,
                "name": token.name,
                "limits": {k: getattr(in_force, k) for k in limits.WORDS},
                "used": used,
            }
        )
    return out
