"""The Logs page (``/logs/``): every process's records from the central store
(``console.lib.log_store``), filtered by node, session, request id, level, process and time,
newest first, a page at a time, with a live tail over ``/ws/logs/`` and the same query's
JSON-lines export (``GET /api/logs?format=jsonl``)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse

from console.lib.access import role_required
from console.lib.errors import ConsoleError
from console.lib.log_store import LEVELS, QUERY_KEYS, query_from, records_find, retention_days
from console.models import LogRecord, Role
from console.views import _render

PAGE = 200


def _filters(request: HttpRequest) -> dict[str, str]:
    return {k: request.GET.get(k, "").strip() for k in QUERY_KEYS}


@role_required(Role.VIEWER)
def logs(request: HttpRequest) -> HttpResponse:
    """The records the query string asks for (``console.lib.log_store.query_from``); a query
    that cannot be asked is said on the page (422)."""
    filters = _filters(request)
    asked = {k: v for k, v in filters.items() if v}
    try:
        query = query_from({**asked, "before": request.GET.get("before", ""), "limit": str(PAGE)})
    except ConsoleError as exc:
        context = {"page": "logs", "filters": filters, "levels": LEVELS, "error": exc.message}
        return _render(request, "console/logs.html", context, status=422)
    rows = records_find(query)
    context = {
        "page": "logs",
        "filters": filters,
        "levels": LEVELS,
        "records": rows,
        "newest": rows[0].id if rows and query.before is None else None,
        "query": urlencode(asked),
        "older": urlencode({**asked, "before": rows[-1].id}) if len(rows) == PAGE else "",
        "retention_days": f"{retention_days():g}",
        "processes": LogRecord.objects.order_by("process")
        .values_list("process", flat=True)
        .distinct()[:50],
    }
    return _render(request, "console/logs.html", context)
