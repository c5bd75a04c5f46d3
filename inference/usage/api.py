"""``/api/usage``: who used the array, how much and at what cost (docs/usage.md), for viewers:
a period's totals, rows per caller, model or node and series over time; one session's cost;
the minute rows as CSV. Costs in the cost model's currency (``CostModel``), node-seconds in
seconds, times in UTC."""

from __future__ import annotations

import csv
from typing import Any, Literal

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Field, Path, Query, Router, Schema

from console.lib.access import NEEDS_VIEWER
from console.lib.errors import NotFound
from inference.usage import report, selectors

router = Router(tags=["usage"])

Hours = Query(
    report.DEFAULT_HOURS,
    gt=0,
    le=report.MAX_HOURS,
    allow_inf_nan=False,
    description=f"the period, hours back from now (0 < hours <= {report.MAX_HOURS})",
)


class FiguresOut(Schema):
    requests: int
    errors: int
    prompt_tokens: int = Field(description="cached tokens included")
    cached_tokens: int = Field(description="prompt tokens served from the node's KV cache")
    completion_tokens: int
    tool_calls: int
    prefill_s: float = Field(description="node-seconds of prefill")
    decode_s: float = Field(description="node-seconds of decode")
    node_seconds: float
    cost: float = Field(description="node-seconds times the cost model's price of one")
    cost_per_request: float | None
    cost_per_million_tokens: float | None = Field(description="per million prompt + completion")
    saved: float = Field(description="the cost of the prefill the cached tokens did not need")
    currency: str


class UsageRowOut(FiguresOut):
    key: str = Field(description="token:<id>, user:<name> or env; the model; the node id")
    name: str = Field(description="the caller's name (else the key)")
    sessions: int = Field(description="distinct sessions among the turn rows kept (7 days)")
    cost_per_session: float | None


class SeriesOut(Schema):
    name: str
    t: list[str] = Field(description="bucket starts, ISO 8601 UTC")
    tokens: list[int] = Field(description="prompt + completion tokens in each bucket")
    cost: list[float]


class UsageOut(Schema):
    hours: float
    group: str
    currency: str
    totals: FiguresOut
    rows: list[UsageRowOut] = Field(description="most costly first")
    bucket: Literal["minute", "hour"] = Field(description="minutes up to 6 h, else hours")
    series: list[SeriesOut]


class SessionUsageOut(FiguresOut):
    session_id: str


@router.get(
    "/usage",
    response=UsageOut,
    summary="Usage and cost over a period: totals, per caller, model or node, and over time",
    auth=NEEDS_VIEWER,
)
def usage_get(
    request: HttpRequest,
    hours: float = Hours,
    group: Literal["caller", "model", "node"] = Query(
        "caller", description="rows and series per caller (API token or user), model or node"
    ),
) -> dict[str, Any]:
    return report.usage_report(hours=hours, group=group)


@router.get(
    "/usage/sessions/{session_id}",
    response=SessionUsageOut,
    summary="One session's turns summed and priced (turn rows are kept 7 days)",
    auth=NEEDS_VIEWER,
)
def usage_session(request: HttpRequest, session_id: str = Path(...)) -> dict[str, Any]:
    found = selectors.session_usage(session_id=session_id)
    if found is None:
        raise NotFound(
            f"No turns counted for session {session_id!r}.", code="session_usage_not_found"
        )
    return found


class _Echo:
    """A file-like that hands back what ``csv.writer`` writes (a streamed line)."""

    def write(self, value: str) -> str:
        return value


@router.get(
    "/usage.csv",
    response={200: None},
    openapi_extra={
        "responses": {200: {"description": "CSV, header first", "content": {"text/csv": {}}}}
    },
    summary="The minute rows of a period as CSV (a row per minute, caller, model, package, node)",
    auth=NEEDS_VIEWER,
)
def usage_csv(request: HttpRequest, hours: float = Hours) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    lines = (writer.writerow(row) for row in selectors.csv_rows(hours=hours))
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    name = f"phalanx-usage-{hours:g}h.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
