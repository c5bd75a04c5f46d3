"""Admin API: the central log store (``GET /api/logs``, console/lib/log_store.py): filtered,
paged, newest first, or every match as JSON lines (``format=jsonl``). Viewer role."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Field, Query, Router, Schema

from console.lib.access import NEEDS_VIEWER
from console.lib.errors import Invalid
from console.lib.log_store import query_from, record_out, records_all, records_find

router = Router(tags=["logs"])


class LogRecordOut(Schema):
    id: int
    time: str = Field(description="ISO 8601, UTC")
    level: str
    process: str = Field(description="what wrote it: serve, controlloop, runnode, packagejob ...")
    node_id: str = Field(description="the node it is about or came from ('' if none)")
    session_id: str
    request_id: str
    logger: str
    event: str = Field(description="the message")
    fields: dict[str, Any]


class LogPageOut(Schema):
    records: list[LogRecordOut]
    next_before: int | None = Field(
        None, description="pass as before= for the next (older) page; null on the last"
    )


@router.get(
    "/logs",
    response=LogPageOut,
    summary="Log records of every process, filtered (newest first; format=jsonl: all)",
    auth=NEEDS_VIEWER,
)
def logs_list(
    request: HttpRequest,
    request_id: str = "",
    session_id: str = "",
    node_id: str = "",
    process: str = "",
    level: str = Query("", description="minimum: debug, info, warning, error, critical"),
    since: str = Query("", description="ISO 8601 (UTC unless it says)"),
    until: str = "",
    before: int | None = Query(None, description="records older than this id (paging)"),
    after: int | None = Query(None, description="records newer than this id, oldest first"),
    limit: int = Query(100, description="1 to 1000"),
    format: str = Query("json", description="json (a page) or jsonl (every match, a line each)"),
) -> Any:
    if format not in ("json", "jsonl"):
        raise Invalid("format: must be json or jsonl", field="format")
    params = {k: v for k, v in locals().items() if k not in ("request", "format")}
    query = query_from({k: "" if v is None else str(v) for k, v in params.items()})
    if format == "jsonl":
        lines = (json.dumps(record_out(row)) + "\n" for row in records_all(query))
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
        response["Content-Disposition"] = 'attachment; filename="phalanx-logs.jsonl"'
        return response
    rows = records_find(query)
    more = len(rows) == query.limit and query.after is None
    return {"records": [record_out(r) for r in rows], "next_before": rows[-1].id if more else None}
