"""The Playground: chat with a served model through the proxy's session socket
(``/ws/sessions/<id>/``), the family and the versions serving it named."""

from __future__ import annotations

import uuid

from django.http import HttpRequest, HttpResponse

from console.lib.access import role_required
from console.models import Role
from console.views import _render
from inference.selectors import served_models


@role_required(Role.VIEWER)
def playground(request: HttpRequest) -> HttpResponse:
    return _render(
        request,
        "console/playground.html",
        {
            "page": "playground",
            "models": served_models(),
            "session_id": f"playground-{uuid.uuid4().hex[:12]}",
        },
    )
