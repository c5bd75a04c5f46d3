"""The Usage page (``/usage/``): who used the array over a period (1 h, 6 h, 24 h, 7 d) and
at what cost: tokens and cost over time per API token or per model (plotly), the top
consumers, quota use as bars, the savings of KV reuse, and the CSV export's link. Figures from
``inference.usage.report``; docs/usage.md."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from console.lib.access import role_required
from console.models import Role
from console.views import _render
from inference.usage import report


@role_required(Role.VIEWER)
def usage(request: HttpRequest) -> HttpResponse:
    hours = report.page_hours(request.GET.get("hours"))
    context = {
        "page": "usage",
        "periods": report.PERIODS,
        "period": dict(report.PERIODS)[hours],
        **report.usage_page(hours=hours),
    }
    return _render(request, "console/usage.html", context)
