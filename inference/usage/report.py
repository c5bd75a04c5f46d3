"""What the Usage page and ``/api/usage`` show, assembled from the selectors: a period's
totals, its rows per caller, model or node (each with a ``key`` and a ``name``), its series
over time, and each limited token's quota use as bars. Reads only; no HTTP.
"""

from __future__ import annotations

from typing import Any

from inference.usage import selectors
from inference.usage.limits import WORDS

MAX_HOURS = 24 * 90  # the longest period asked for: 90 days (minute rows are kept for good)
DEFAULT_HOURS = 24
# the Usage page's period chooser: (hours, label)
PERIODS: tuple[tuple[int, str], ...] = ((1, "1 h"), (6, "6 h"), (24, "24 h"), (168, "7 d"))
GROUPS = tuple(selectors.GROUPS)  # caller, model, node


def keyed(row: dict[str, Any], group: str) -> dict[str, Any]:
    """A ``selectors.usage_by`` row with ``key`` (``token:<id>``, the model, the node id) and
    ``name`` (the caller's name; else the key) of its ``group``."""
    fields = selectors.GROUPS[group]
    return {**row, "key": row[fields[0]], "name": row[fields[-1]] or row[fields[0]]}


def usage_report(*, hours: float, group: str = "caller") -> dict[str, Any]:
    """The last ``hours`` (0 < hours <= ``MAX_HOURS``) of usage by ``group``:
    ``{"hours", "group", "currency", "totals": priced figures, "rows": [priced figures with
    key, name, sessions, cost_per_session], "bucket": "minute"|"hour", "series": [{"name",
    "t": [ISO 8601, UTC], "tokens": [prompt + completion], "cost": [currency]}]}``. Costs in
    the cost model's currency; node-seconds in seconds. Raises ``KeyError`` for another group."""
    rows = [keyed(row, group) for row in selectors.usage_by(group=group, hours=hours)]
    series = selectors.usage_series(group=group, hours=hours)
    totals = selectors.usage_totals(hours=hours)
    return {
        "hours": hours,
        "group": group,
        "currency": totals["currency"],
        "totals": totals,
        "rows": rows,
        "bucket": series["bucket"],
        "series": series["series"],
    }


def quota_bars() -> list[dict[str, Any]]:
    """Each live token with a counted limit, its limits as bars: ``[{"token_id", "name",
    "bars": [{"limit": field name, "label": words, "used", "of", "percent": 0-100}]}]``
    (``percent`` capped at 100: a turn may take a token window past its limit)."""
    out = []
    for entry in selectors.quota_use():
        bars = []
        for limit, label in WORDS.items():
            of = entry["limits"].get(limit)
            if not of:
                continue
            used = int(entry["used"].get(limit) or 0)
            percent = min(100.0, round(100.0 * used / of, 1))
            bars.append(
                {"limit": limit, "label": label, "used": used, "of": of, "percent": percent}
            )
        out.append({"token_id": entry["token_id"], "name": entry["name"], "bars": bars})
    return out


def usage_page(*, hours: float) -> dict[str, Any]:
    """The Usage page's figures: ``usage_report`` by caller, the series by model beside it
    (``series_by_model``), ``quotas`` (``quota_bars``) and the price of a node-second
    (``per_node_second``, in ``currency``)."""
    report = usage_report(hours=hours, group="caller")
    by_model = selectors.usage_series(group="model", hours=hours)
    return {
        **report,
        "series_by_model": by_model["series"],
        "quotas": quota_bars(),
        "per_node_second": selectors.pricing().per_node_second,
    }


def page_hours(raw: str | None) -> int:
    """The page's period from ``?hours=``: one of ``PERIODS``, else ``DEFAULT_HOURS``."""
    chosen = {str(hours): hours for hours, _label in PERIODS}
    return chosen.get(raw or "", DEFAULT_HOURS)
