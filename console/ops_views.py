"""The control plane's endpoints that are not pages: ``/health``, ``/metrics`` (Prometheus
text) and ``/static/`` (the embedded control plane has no web server in front)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.contrib.staticfiles import finders
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from django.views.static import serve

from console.lib import access
from console.lib.metrics import prometheus_text


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """``GET /health``: 200 ``{"status": "ok"}`` while the control plane answers (no auth).
    ``?challenge=<32-64 hex digits>`` adds ``identity`` (``{"pid", "proof"}``): the proof that
    this is the array's control plane, bound to the address the request arrived on, that a
    load-test worker checks before it sends a token it minted
    (``inference.loadtests.identity``)."""
    body: dict[str, Any] = {"status": "ok"}
    if "challenge" in request.GET:
        from inference.loadtests.identity import answer

        port = request.META.get("SERVER_PORT", "0")
        identity = answer(
            request.GET["challenge"],
            host=request.META.get("SERVER_NAME", ""),
            port=int(port) if str(port).isdigit() else 0,
        )
        if identity is not None:
            body["identity"] = identity
    return JsonResponse(body)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: Prometheus text; Bearer token or a logged-in user with a role."""
    principal = access.principal_for_user(request.user) or access.principal_for_token(
        _bearer(request)
    )
    if principal is None:
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    if principal.role is None:  # logged in, in no role group: refused as everywhere else
        return HttpResponse("your account has no role\n", status=403, content_type="text/plain")
    return HttpResponse(prometheus_text(), content_type="text/plain; version=0.0.4; charset=utf-8")


def _bearer(request: HttpRequest) -> str | None:
    from inference.tokens import bearer_token

    return bearer_token(request.headers.get("Authorization"))


def static(request: HttpRequest, path: str) -> HttpResponse:
    """Serve static files (the embedded control plane has no web server in front): the
    project's ``static/`` and the apps' own (the admin's, django-ninja's Swagger UI), found the
    way ``collectstatic`` finds them, so nothing is loaded from the internet."""
    found = finders.find(path)
    if not found:
        raise Http404(f"no static file {path}")
    found_path = Path(found)
    response = serve(request, found_path.name, document_root=found_path.parent)
    response["Cache-Control"] = "public, max-age=3600"
    return response
